"""Batch normalisation: forward and backward, training (batch statistics) and inference (running statistics).

PyTorch semantics. x is (N, C, *spatial) with rank >= 2; every statistic is per channel (axis 1)
over the M = N·prod(spatial) values of that channel:

    training   y = (x − mean_B)·invstd_B·weight + bias,  invstd_B = 1/sqrt(var_B + eps)
               mean_B, var_B: the batch mean and *biased* variance (divide by M)
               running_mean ← (1 − momentum)·running_mean + momentum·mean_B
               running_var  ← (1 − momentum)·running_var  + momentum·var_B·M/(M − 1)   (unbiased)
    inference  y = (x − running_mean)/sqrt(running_var + eps)·weight + bias

``weight``/``bias`` of None mean the identity affine (weight 1, bias 0). PyTorch's
``momentum=None`` (cumulative average) is the caller's business: it passes 1/num_batches_tracked.

Fused ReLU: ``relu=True`` makes the forward functions return y = max(BN(x), 0), and the backward
functions given that y as ``relu_output`` take dy·[y > 0] as their output gradient (ReLU's gradient
at 0 is 0, as in PyTorch): the same results as relu_forward after the normalisation and
relu_backward before its backward, without the two extra passes over memory. The training backward can
instead recompute the mask from x (``relu=True`` with the forward's ``bias``), which it reads anyway: the
forward normalises with the statistics it returns (mean and invstd in x's dtype), so the backward redoes
the very operations on the very values and gets [y > 0] to the bit without reading y at all.

Statistics are two-pass (mean first, then the mean of the squared deviations), never
E[x²] − E[x]², which cancels catastrophically in float32 when |mean| ≫ std. The sums run along
the contiguous spatial axis first (NumPy's pairwise summation) and then over the batch in
float64, so they are sound for float32 without a float64 copy of x; every result keeps x's dtype.
This module is the NumPy twin of the GPU implementation (batchnorm.cu, selected by the array type):
one-pass Welford statistics per channel accumulated in float64, then fused element-wise kernels;
two launches for each training direction, one for each inference direction. Both give the same
results up to rounding.

Channels-last x (primitives/layout.py): y and dx come back channels-last. The GPU runs kernels of their own on
the (N·H·W, C) rows of its buffer (batchnorm.cu's channels-last section: a pack holds channels, not a plane's
values); the NumPy twin computes on the (N, C, S) view and lays its results out again.

Half precision (mixed precision's batch norm): x, dy, relu_output and the results y, dx in float16 or
bfloat16 (convert.py's storage), the per-channel vectors (weight, bias, running statistics, mean, invstd,
dweight, dbias) float32, the master weights' type. The GPU's half build reads the half values exactly, sums
as above (a channels-last thread's own sums in float, merged in double) and computes y and dx in float from
the double per-channel coefficients, rounding once, as PyTorch's half batch norm computes in float; the NumPy
twin widens to float32, runs the float32 code and rounds once. The two agree within a rounding of the half
type, not bit for bit.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import backend
from . import _cuda, convert, layout
from ._checks import check_bool, check_float, check_float_or_half, check_number
from ._select import where_or_zero

# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def _check_input(x: Any, name: str = "x", half: bool = False) -> int:
    """x must be a float array (N, C, *spatial) of rank >= 2 (or, with ``half``, a half-precision one);
    returns C. The public functions take half precision; the naive engine's, which share these checks
    with their defaults, do not."""
    (check_float_or_half if half else check_float)(x, name)
    if x.ndim < 2:
        raise ValueError(f"batch_norm: {name} must be at least 2-D (N, C, *spatial), got shape {tuple(x.shape)}")
    return int(x.shape[1])


def _vector_dtype(x: Any) -> np.dtype:
    """The dtype of the per-channel vectors for x: x's, and float32 for half-precision x (master weights)."""
    return np.dtype(np.float32) if convert.half_type_of(x) is not None else x.dtype


def _check_channel_vector(v: Any, name: str, channels: int, x: Any, optional: bool = False) -> None:
    """v must be a (C,) array of x's dtype, float32 for half x (or None when ``optional``)."""
    if v is None:
        if optional:
            return
        raise TypeError(f"batch_norm: {name} must be a ({channels},) array, got None")
    check_float(v, name)
    if tuple(v.shape) != (channels,):
        raise ValueError(f"batch_norm: {name} must have shape (C,) = ({channels},) for x of shape "
                         f"{tuple(x.shape)}, got {tuple(v.shape)}")
    expected = _vector_dtype(x)
    if v.dtype != expected:
        rule = f"x's dtype {x.dtype}" if expected == x.dtype else f"dtype float32 for {x.dtype} x (master weights)"
        raise TypeError(f"batch_norm: {name} must have {rule}, got {v.dtype}")


def _check_like_x(array: Any, x: Any, name: str, optional: bool = False, half: bool = False) -> None:
    """``array`` (dy, or the fused forward's output) must have x's shape and dtype (or be None when ``optional``)."""
    if array is None and optional:
        return
    (check_float_or_half if half else check_float)(array, name)
    if tuple(array.shape) != tuple(x.shape):
        raise ValueError(f"batch_norm: {name} must have x's shape {tuple(x.shape)}, got {tuple(array.shape)}")
    if array.dtype != x.dtype:
        raise TypeError(f"batch_norm: {name} must have x's dtype {x.dtype}, got {array.dtype}")


def _check_running_statistics(running_mean: Any, running_var: Any, channels: int, x: Any) -> None:
    """Training tracks running statistics in both (C,) arrays, or in neither (both None)."""
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm: running_mean and running_var must both be arrays or both be None")
    _check_channel_vector(running_mean, "running_mean", channels, x, optional=True)
    _check_channel_vector(running_var, "running_var", channels, x, optional=True)


def _check_batches_tracked(num_batches_tracked: Any, x: Any) -> None:
    """The optional count of batches seen: an int64 array of one element on x's device."""
    if num_batches_tracked is None:
        return
    if getattr(num_batches_tracked, "dtype", None) != np.int64 or getattr(num_batches_tracked, "size", 0) != 1:
        raise TypeError(f"batch_norm: num_batches_tracked must be an int64 array of one element or None, "
                        f"got {num_batches_tracked!r}")
    if backend.device_of(num_batches_tracked) != backend.device_of(x):
        raise ValueError(f"batch_norm: num_batches_tracked must be on x's device {backend.device_of(x)}, "
                         f"got {backend.device_of(num_batches_tracked)}")


def _check_training_count(x: Any) -> int:
    """M, the values per channel: batch statistics need M > 1, as in PyTorch."""
    count = _values_per_channel(x)
    if count <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got x of shape {tuple(x.shape)} "
                         f"({count} value(s) per channel)")
    return count


def _check_nonempty_channels(x: Any) -> int:
    count = _values_per_channel(x)
    if count == 0:
        raise ValueError(f"batch_norm: x of shape {tuple(x.shape)} has no values per channel")
    return count


def _check_momentum(momentum: Any) -> float:
    return check_number(momentum, "batch_norm: momentum", lambda m: 0.0 <= m <= 1.0, "in [0, 1]")


def _check_eps(eps: Any) -> float:
    return check_number(eps, "batch_norm: eps", lambda e: 0.0 < e < float("inf"), "a finite number > 0")


# ----------------------------------------------------------------------------------------------
# Per-channel layout helpers
# ----------------------------------------------------------------------------------------------


def _channel_view(a: Any) -> Any:
    """(N, C, *spatial) -> (N, C, S) with S = prod(spatial): a free reshape for contiguous arrays,
    after which every per-channel reduction is over axes (0, 2) whatever the input's rank."""
    return a.reshape(a.shape[0], a.shape[1], math.prod(a.shape[2:]))


def _per_channel(v: Any, dtype: Any) -> Any:
    """(C,) -> (1, C, 1) of ``dtype``, to broadcast against a channel view."""
    return v.astype(dtype, copy=False).reshape(1, -1, 1)


def _channel_sum(a: Any) -> Any:
    """(N, C, S) -> (C,) float64 sums.

    Sum the contiguous S axis first in a's dtype (pairwise summation, error ~ log S ulps), then the
    N partial sums in float64: sound for float32 without converting the whole array to float64.
    """
    xp = backend.get_array_module(a)
    return xp.sum(xp.sum(a, axis=2), axis=0, dtype=xp.float64)


def _wide(a: Any, half: str) -> Any:
    """A half-precision array's float32 values (exact), None as None: the CPU twin computes the float32 code
    on them and rounds its results once."""
    return None if a is None else convert.half_to_float(np.ascontiguousarray(a), half)


def _values_per_channel(x: Any) -> int:
    return x.size // x.shape[1] if x.shape[1] else 0


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


def _normalise(x: Any, weight: Any, bias: Any, mean: Any, invstd: Any, relu: bool, centered: Any = None) -> Any:
    """y = (x − mean)·(invstd·weight) + bias with (C,) float64 statistics, then max(y, 0) when ``relu``;
    y has x's shape and dtype. ``centered``: x − mean as a (N, C, S) channel view the caller no longer
    needs, which becomes y (the training forward has it already).

    Subtract the mean before scaling (rather than folding it into one shift) so that |mean| ≫ std
    does not cancel in float32.
    """
    xp = backend.get_array_module(x)
    scale = invstd if weight is None else invstd * weight.astype(invstd.dtype)
    y = _channel_view(x) - _per_channel(mean, x.dtype) if centered is None else centered
    y *= _per_channel(scale, x.dtype)
    if bias is not None:
        y += _per_channel(bias, x.dtype)
    if relu:
        xp.maximum(y, xp.zeros((), dtype=x.dtype), out=y)  # NaN propagates, as relu_forward's
    return y.reshape(x.shape)


def _relu_mask(x: Any, weight: Any, bias: Any, mean: Any, invstd: Any, half: str | None) -> Any:
    """[y > 0] for the y a training forward with ``relu=True`` returned with ``mean`` and ``invstd``: its
    normalisation redone on the same values (NumPy; a half x as its float32 values, ``_wide``), rounded to the half
    type where x is one."""
    y = _normalise(x, weight, bias, mean.astype(np.float64), invstd.astype(np.float64), False)
    return (y if half is None else convert.float_to_half(y, half)) > 0


def _relu_masked(dy: Any, relu_output: Any) -> Any:
    """dy where the fused ReLU's output is > 0, else 0 (relu_backward); dy itself without a fused ReLU.
    NumPy arrays only (the GPU kernels apply the mask as they read dy)."""
    if relu_output is None:
        return dy
    return where_or_zero(relu_output > 0, dy)


def batch_norm_forward_training(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                momentum: float = 0.1, eps: float = 1e-5, relu: bool = False,
                                num_batches_tracked: Any = None) -> tuple[Any, Any, Any]:
    """Normalise with the batch statistics and update the running statistics in place.

    x: (N, C, *spatial); weight, bias: (C,) or None; running_mean, running_var: (C,) or both None
    (no running statistics are tracked). Returns y: x's shape, and mean, invstd: (C,), all of x's
    dtype; the caller saves mean and invstd for :func:`batch_norm_backward_training`. ``relu``:
    y = max(BN(x), 0) (pass y as ``relu_output`` to the backward). The statistics are those of x either way.
    Raises ``ValueError`` when a channel has only one value (M = 1), as PyTorch does.
    Half precision (module docstring): x float16 or bfloat16, the vectors float32; y in x's type, mean and
    invstd float32. ``num_batches_tracked``: an int64 array of one element, or None; it is incremented in
    place, on the GPU by the statistics kernel (nn.BatchNorm's counter costs no launch of its own).
    """
    key = _cuda.steady_key("forward_training", x, weight, bias, running_mean, running_var, num_batches_tracked) \
        if backend.is_cuda_array(x) else None
    if key is not None and _plain_scalars(momentum, eps, relu):
        launch = _launches.get(key)
        if launch is not None:
            return _run_forward_training(launch, x, weight, bias, running_mean, running_var, momentum, eps, relu,
                                         num_batches_tracked)
    half = convert.half_type_of(x)
    channels = _check_input(x, half=half is not None)
    _check_channel_vector(weight, "weight", channels, x, optional=True)
    _check_channel_vector(bias, "bias", channels, x, optional=True)
    _check_running_statistics(running_mean, running_var, channels, x)
    momentum = _check_momentum(momentum)
    eps = _check_eps(eps)
    relu = check_bool(relu, "batch_norm: relu")
    count = _check_training_count(x)
    _check_batches_tracked(num_batches_tracked, x)
    xp = backend.get_array_module(x, weight, bias, running_mean, running_var)
    if backend.is_cuda_array(x):
        return _forward_training_gpu(x, weight, bias, running_mean, running_var, momentum, eps, relu, half,
                                     num_batches_tracked, key)
    if num_batches_tracked is not None:
        num_batches_tracked[...] += 1
    channels_last = layout.is_channels_last(x)
    if half is not None:
        y, mean, invstd = batch_norm_forward_training(_wide(x, half), weight, bias, running_mean, running_var,
                                                      momentum, eps, relu)
        return layout.like(convert.float_to_half(y, half), channels_last), mean, invstd

    xv = _channel_view(x)
    mean = _channel_sum(xv) / count  # float64
    centered = xv - _per_channel(mean, x.dtype)
    var = _channel_sum(xp.square(centered)) / count  # biased: the normalisation uses it
    invstd = 1.0 / xp.sqrt(var + eps)

    if running_mean is not None:
        # In place: the caller's buffers are the module's state. The running variance is unbiased.
        running_mean[...] = ((1.0 - momentum) * running_mean + momentum * mean).astype(x.dtype)
        running_var[...] = ((1.0 - momentum) * running_var + momentum * var * (count / (count - 1))).astype(x.dtype)

    # x − mean is already in ``centered``, computed as _normalise would: it continues from there, with the
    # statistics as the caller gets them (x's dtype: the mean is rounded there already), so that the backward can
    # redo the normalisation for the fused ReLU's mask (_relu_mask).
    saved_invstd = invstd.astype(x.dtype)
    y = _normalise(x, weight, bias, mean, saved_invstd.astype(xp.float64), relu, centered=centered)
    return layout.like(y, channels_last), mean.astype(x.dtype), saved_invstd


def batch_norm_forward_inference(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                 eps: float = 1e-5, relu: bool = False) -> Any:
    """Normalise with the running statistics: y = (x − running_mean)/sqrt(running_var + eps)·weight + bias.

    x: (N, C, *spatial); weight, bias: (C,) or None; running_mean, running_var: (C,).
    Returns y of x's shape and dtype; ``relu``: y = max(that, 0). Any N (including 1) and any M are fine.
    """
    half = convert.half_type_of(x)
    channels = _check_input(x, half=half is not None)
    _check_channel_vector(weight, "weight", channels, x, optional=True)
    _check_channel_vector(bias, "bias", channels, x, optional=True)
    _check_channel_vector(running_mean, "running_mean", channels, x)
    _check_channel_vector(running_var, "running_var", channels, x)
    eps = _check_eps(eps)
    relu = check_bool(relu, "batch_norm: relu")
    xp = backend.get_array_module(x, weight, bias, running_mean, running_var)
    if backend.is_cuda_array(x):
        return _forward_inference_gpu(x, weight, bias, running_mean, running_var, eps, relu, half)
    if half is not None:
        y = convert.float_to_half(batch_norm_forward_inference(_wide(x, half), weight, bias, running_mean,
                                                               running_var, eps, relu), half)
    else:
        invstd = 1.0 / xp.sqrt(running_var.astype(xp.float64) + eps)
        y = _normalise(x, weight, bias, running_mean.astype(xp.float64), invstd, relu)
    return layout.like(y, layout.is_channels_last(x))


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


def batch_norm_backward_training(dy: Any, x: Any, weight: Any, mean: Any, invstd: Any,
                                 relu_output: Any = None, bias: Any = None,
                                 relu: bool = False) -> tuple[Any, Any, Any]:
    """Gradients of :func:`batch_norm_forward_training`, through the batch statistics.

    dy, x: (N, C, *spatial); weight: (C,) or None; mean, invstd: (C,) as returned by the forward;
    relu_output: None, or the y of a forward with ``relu=True`` (x's shape), when dy is the gradient of
    max(BN(x), 0): dy is then replaced by dy·[y > 0] everywhere below. ``relu=True`` (with the forward's
    ``bias``: (C,) or None) does the same without y: the mask [y > 0] is recomputed from x, mean, invstd,
    weight and bias, as the forward computed y (module docstring), bit for bit. Not both.
    Returns dx: x's shape, dweight, dbias: (C,), all of x's dtype. dweight and dbias are computed
    even when weight is None (the caller drops them). With x̂ = (x − mean)·invstd:

        dbias   = Σ dy                 dweight = Σ dy·x̂          (sums over all axes but 1)
        dx      = weight·invstd·(dy − dbias/M − x̂·dweight/M)

    The two subtracted terms are the paths through the batch mean and the batch variance.
    Half precision: dy, x, relu_output and dx in x's type, the vectors and dweight, dbias float32.
    """
    # The kept launches' key: the direction (with the mask from x or not) and every array; a relu that is not a
    # bool goes through the checks.
    key = _cuda.steady_key("backward_training_relu" if relu is True else "backward_training", dy, x, weight, mean,
                           invstd, relu_output, bias) if backend.is_cuda_array(x) and type(relu) is bool else None
    if key is not None:
        launch = _launches.get(key)
        if launch is not None:
            return _run_backward_training(launch, dy, x, weight, mean, invstd, relu_output, bias if relu else None)
    half = convert.half_type_of(x)
    channels = _check_input(x, half=half is not None)
    _check_like_x(dy, x, "dy", half=half is not None)
    _check_like_x(relu_output, x, "relu_output", optional=True, half=half is not None)
    _check_channel_vector(weight, "weight", channels, x, optional=True)
    _check_channel_vector(bias, "bias", channels, x, optional=True)
    _check_channel_vector(mean, "mean", channels, x)
    _check_channel_vector(invstd, "invstd", channels, x)
    relu = check_bool(relu, "batch_norm_backward_training: relu")
    if relu and relu_output is not None:
        raise ValueError("batch_norm_backward_training: pass relu_output (the forward's y) or relu=True (the mask "
                         "recomputed from x), not both")
    count = _check_nonempty_channels(x)
    xp = backend.get_array_module(dy, x, weight, mean, invstd, relu_output, bias)
    if backend.is_cuda_array(x):
        return _backward_training_gpu(dy, x, weight, mean, invstd, relu_output, bias if relu else None, relu, half,
                                      key)
    channels_last = layout.is_channels_last(x)
    wide_x = x if half is None else _wide(x, half)
    if relu:  # the forward's [y > 0], then the gradient of the plain batch norm
        dy = where_or_zero(_relu_mask(wide_x, weight, bias, mean, invstd, half), dy)
    if half is not None:
        dx, dweight, dbias = batch_norm_backward_training(_wide(dy, half), wide_x, weight, mean, invstd,
                                                          _wide(relu_output, half))
        return layout.like(convert.float_to_half(dx, half), channels_last), dweight, dbias

    xv, dyv = _channel_view(x), _channel_view(_relu_masked(dy, relu_output))
    invstd64 = invstd.astype(xp.float64)
    centered = xv - _per_channel(mean, x.dtype)
    dbias = _channel_sum(dyv)
    dweight = _channel_sum(dyv * centered) * invstd64
    scale = invstd64 if weight is None else invstd64 * weight.astype(xp.float64)
    # dx = scale·(dy − dbias/M) − (x − mean)·scale·invstd·dweight/M, reusing the centered buffer.
    dx = dyv - _per_channel(dbias / count, x.dtype)
    dx *= _per_channel(scale, x.dtype)
    centered *= _per_channel(scale * invstd64 * dweight / count, x.dtype)
    dx -= centered
    return layout.like(dx.reshape(x.shape), channels_last), dweight.astype(x.dtype), dbias.astype(x.dtype)


def batch_norm_backward_inference(dy: Any, x: Any, weight: Any, running_mean: Any, running_var: Any,
                                  eps: float = 1e-5, relu_output: Any = None) -> tuple[Any, Any, Any]:
    """Gradients of :func:`batch_norm_forward_inference` (statistics are constants here).

    dy, x: (N, C, *spatial); weight: (C,) or None; running_mean, running_var: (C,); relu_output: None,
    or the y of a forward with ``relu=True``, which replaces dy by dy·[y > 0] below.
    Returns dx: x's shape, dweight, dbias: (C,), all of x's dtype, with invstd = 1/sqrt(running_var + eps):

        dx = dy·weight·invstd      dweight = Σ dy·(x − running_mean)·invstd      dbias = Σ dy
    """
    half = convert.half_type_of(x)
    channels = _check_input(x, half=half is not None)
    _check_like_x(dy, x, "dy", half=half is not None)
    _check_like_x(relu_output, x, "relu_output", optional=True, half=half is not None)
    _check_channel_vector(weight, "weight", channels, x, optional=True)
    _check_channel_vector(running_mean, "running_mean", channels, x)
    _check_channel_vector(running_var, "running_var", channels, x)
    eps = _check_eps(eps)
    xp = backend.get_array_module(dy, x, weight, running_mean, running_var, relu_output)
    if backend.is_cuda_array(x):
        return _backward_inference_gpu(dy, x, weight, running_mean, running_var, eps, relu_output, half)
    channels_last = layout.is_channels_last(x)
    if half is not None:
        dx, dweight, dbias = batch_norm_backward_inference(_wide(dy, half), _wide(x, half), weight, running_mean,
                                                           running_var, eps, _wide(relu_output, half))
        return layout.like(convert.float_to_half(dx, half), channels_last), dweight, dbias

    xv, dyv = _channel_view(x), _channel_view(_relu_masked(dy, relu_output))
    invstd = 1.0 / xp.sqrt(running_var.astype(xp.float64) + eps)
    scale = invstd if weight is None else invstd * weight.astype(xp.float64)
    dx = (dyv * _per_channel(scale, x.dtype)).reshape(x.shape)
    centered = xv - _per_channel(running_mean, x.dtype)
    dweight = _channel_sum(dyv * centered) * invstd
    dbias = _channel_sum(dyv)
    return layout.like(dx, channels_last), dweight.astype(x.dtype), dbias.astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of batchnorm.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
_SOURCE = "batchnorm.cu"
# Per-channel reductions run on a (C, splits) grid sized by _cuda.reduction_split: about as many
# 256-thread blocks as the GPU holds at once, so a small C (64 channels) leaves no SM idle.

# The steady state: a training call on the GPU seen before (the same direction, and of every array its type, shape,
# strides, dtype, GPU and address modulo 16, which picks the pack build) -> its _Launch, so that the call neither
# checks its arguments nor works out its launch again, and reuses the launch's float64 scratch rather than allocating
# one: a training step repeats every call. Only calls whose arrays needed no contiguous copy are kept, and only a
# float momentum and eps and a bool relu take the path (anything else is checked every time). Like the counters,
# a kept scratch must not serve two streams at once. Emptied when it reaches _MOST_LAUNCHES keys (a program whose
# shapes never repeat).
_launches: dict[tuple, _Launch] = {}
_MOST_LAUNCHES = 4096


class _Launch(NamedTuple):
    """One training direction's two launches, worked out for one call's key."""
    reduce: Any  # the per-(channel, split) reduction kernel, whose last block per channel finishes the channel
    elementwise: Any  # bn_apply or bn_backward_dx
    grid: tuple[int, int]  # (channels or channel blocks, splits)
    per: np.int32  # values (packs) per split
    sizes: tuple  # the reduction's size arguments
    tail: tuple  # its last arguments (the channels-last kernels' packs per block row)
    count: int  # the element-wise launch's grid-stride iterations
    channels_last: bool
    C: int
    vector_dtype: np.dtype  # of the (C,) results
    sizes_of_x: tuple  # the element-wise kernel's last arguments: C, S, x.size
    counters: Any  # the reduction's "last block done" counters (_cuda.block_counters)
    scratch_values: int  # the float64 scratch's length: the partial results per (split, channel), then coef
    coef_offset: int  # where the element-wise kernel's coefficients start in it
    # A kept launch's own scratch and its coef view (None until _keep gives them): the calls of one key follow
    # each other on the stream, so each may reuse the one before's.
    scratch: Any = None
    coef: Any = None
    # A kept launch's packed launches (_cuda.PackedLaunch), (reduction, element-wise), by the scalars they were packed
    # with: (eps, momentum, relu) forward, () backward. Layers of one shape share a key, and a ResNet block's two
    # batch norms differ in relu, so each set of scalars gets its pair on its first kept call. None until kept.
    packed: dict | None = None


def _plain_scalars(momentum: Any, eps: Any, relu: Any) -> bool:
    """Whether the scalars pass the checks as they are: a float momentum in [0, 1], a float eps > 0 and finite,
    a bool relu."""
    return type(relu) is bool and type(momentum) is float and 0.0 <= momentum <= 1.0 and type(eps) is float \
        and 0.0 < eps < math.inf


def _keep(key: tuple | None, launch: _Launch) -> None:
    """Keep ``launch`` for ``key``'s later calls, with a scratch of its own taken from the device, not the caching
    pool: a block of the pool kept for the process's life would pin the chunk it was carved from (gpu.md, A training
    step as one CUDA graph), and a table for its packed launches. Nothing is kept while a CUDA graph is being
    captured, whose memory is the graph's."""
    if key is None:
        return
    cupy = backend.cupy()
    if cupy.cuda.get_current_stream().is_capturing():
        return
    if len(_launches) >= _MOST_LAUNCHES:
        _launches.clear()
    memory = cupy.cuda.memory.Memory(8 * launch.scratch_values)
    scratch = cupy.ndarray((launch.scratch_values,), dtype=np.float64, memptr=cupy.cuda.MemoryPointer(memory, 0))
    _launches[key] = launch._replace(scratch=scratch, coef=scratch[launch.coef_offset:], packed={})


# The most sets of scalars one kept launch packs for (a momentum changed every step would otherwise grow the table).
_MOST_PACKS = 16


def _packs_for(launch: _Launch, scalars: tuple, arguments: tuple[tuple, tuple]) -> tuple[Any, Any]:
    """The kept ``launch``'s packed (reduction, element-wise) pair for ``scalars``, made from ``arguments`` (the two
    argument lists with _cuda.PER_CALL where each call passes its arrays) on its first call."""
    packs = launch.packed
    if len(packs) >= _MOST_PACKS:
        packs.clear()
    reduce, elementwise = arguments
    pair = packs[scalars] = (
        _cuda.PackedLaunch(launch.reduce, launch.grid, (_cuda.THREADS,), reduce),
        _cuda.PackedLaunch(launch.elementwise, (_cuda.grid_stride_blocks(launch.count),), (_cuda.THREADS,),
                           elementwise))
    return pair


def _scratch(cupy: Any, launch: _Launch) -> tuple[Any, Any]:
    """(a new float64 scratch, its coef part) for a checked call (a kept launch's packed pairs hold its own)."""
    scratch = cupy.empty(launch.scratch_values, dtype=cupy.float64)
    return scratch, scratch[launch.coef_offset:]


def _same(arrays: tuple, originals: tuple) -> bool:
    """Whether no array was replaced by a copy (identity: ``==`` on arrays compares values)."""
    return all(a is b for a, b in zip(arrays, originals))


def _output_like(cupy: Any, x: Any, channels_last: bool) -> tuple[Any, Any, Any]:
    """(a new array of x's shape and dtype in x's layout, x's flat buffer, the new array's): a channels-last pair's
    (N, H, W, C) buffers, else the arrays themselves. layout.empty and layout.flat in one, the channels-last
    result made from its buffer rather than viewed and viewed back (every call of the steady state makes one)."""
    if not channels_last:
        out = cupy.empty(x.shape, dtype=x.dtype)
        return out, x, out
    N, C, H, W = x.shape
    buffer = cupy.empty((N, H, W, C), dtype=x.dtype)
    return buffer.transpose(layout.TO_VIEW), layout.buffer(x), buffer


def _contiguous(xp: Any, a: Any) -> Any:
    """``a`` itself when C-contiguous (or None), else a contiguous copy: a RawKernel sees only the base pointer."""
    return a if a is None or a.flags.c_contiguous else xp.ascontiguousarray(a)


def _layout(x: Any) -> tuple[int, int, int]:
    """(N, C, S) of the kernels' (N, C, S) view of a C-contiguous x."""
    return int(x.shape[0]), int(x.shape[1]), math.prod(x.shape[2:])


# The channels-last reductions (batchnorm.cu's RowsOfBlock): a block's columns span _LAST_BLOCK_BYTES of a row
# (at most 32 packs). The grid is one wave at most, as many blocks as the GPU holds of the kernel at once
# (_cuda.resident_blocks): a channel block's last block merges every split of its channels, (splits / (THREADS / its
# channels)) merges a thread, each a wait for L2, and a second wave would only lengthen that tail, while one wave
# of long splits keeps as many bytes in flight. Within the wave each thread sums at least _LAST_PASSES_PER_SPLIT
# passes of rows: a small layer takes more, shorter splits, since a thread's passes are round trips to memory
# one after another.
_LAST_BLOCK_BYTES, _LAST_PASSES_PER_SPLIT = 128, 8
# The element-wise row kernels: each thread does at least this many packs, so that its V channels' coefficients
# (3V or 4V loads from the caches, once a thread where the grid's stride is a whole number of rows) serve as many.
_ROW_PACKS_PER_THREAD = 8


def _rows_packing(arrays: tuple, C: int) -> tuple[str, int, int]:
    """A channels-last launch over (M, C) rows: (the build's suffix, elements per access, packs per block row).
    Packs must lie inside a row: C a multiple of the pack."""
    width = _cuda.elements_per_access(arrays, plane=C)
    block_packs = max(1, min(C // width, 32, _LAST_BLOCK_BYTES // (width * arrays[0].itemsize)))
    return "_last" + ("_vector" if width > 1 else ""), width, block_packs


def _rows_split(C: int, M: int, width: int, block_packs: int, resident: int) -> tuple[tuple[int, int], int]:
    """A channels-last reduction's grid (channel blocks, splits) and rows per split, for a kernel of which the GPU
    holds ``resident`` blocks at once."""
    channel_blocks = -(-(C // width) // block_packs)
    rows_per_pass = _cuda.THREADS // block_packs
    splits, per = _cuda.reduction_split(channel_blocks, M, minimum=_LAST_PASSES_PER_SPLIT * rows_per_pass,
                                        blocks=resident)
    return (channel_blocks, splits), per


def _element_count(channels_last: bool, packs: int) -> int:
    """The grid-stride iterations an element-wise launch over ``packs`` packs asks _cuda.launch for: one a pack
    over planes, one per _ROW_PACKS_PER_THREAD packs over channels-last rows."""
    return -(-packs // _ROW_PACKS_PER_THREAD) if channels_last else packs


def _reduction(channels_last: bool, arrays: tuple, N: int, C: int, S: int, name: str, dtype: Any,
               half: str | None, split_as: str | None = None) -> tuple:
    """The reduction ``name``'s (kernel, grid, build suffix, elements per access, values per split, the size
    arguments, the last arguments): over planes, or over channels-last rows (whose kernels end with their packs per
    block row). The rows' split follows the blocks an SM holds of ``split_as``'s build (default ``name``): two
    kernels given one split add the same values in the same order."""
    if channels_last:
        build, width, block_packs = _rows_packing(arrays, C)
        kernel = _kernel(name + build, dtype, half)
        resident = _cuda.resident_blocks(_kernel((split_as or name) + build, dtype, half), _cuda.THREADS)
        grid, per = _rows_split(C, N * S, width, block_packs, resident)
        return kernel, grid, build, width, per, (_cuda.i32(N * S), _cuda.i32(C)), (_cuda.i32(block_packs),)
    build, width = _packing(arrays, S)
    splits, per = _split(C, N * S, width)
    sizes = (_cuda.i32(N), _cuda.i32(C), _cuda.i32(S))
    return _kernel(name + build, dtype, half), (C, splits), build, width, per, sizes, ()


def _kernel(name: str, dtype: Any, half: str | None = None) -> Any:
    """The kernel for x's dtype, or for half-precision x its half build (float math and vectors)."""
    return _cuda.element_function(_SOURCE, name, half, dtype)


# The kernels' builds by pack (batchnorm.cu), widest first: 16-byte packs, 8-byte packs, single elements.
_PACKINGS = ((16, "_vector"), (8, "_vector8"))


def _packing(arrays: tuple, plane: int) -> tuple[str, int]:
    """(the build's name suffix, elements per access) for ``arrays`` (None entries skipped) whose packs must
    stay inside planes of ``plane`` elements: the widest pack that fits, else single elements."""
    for pack_bytes, suffix in _PACKINGS:
        width = _cuda.elements_per_access(arrays, plane, pack_bytes)
        if width > 1:
            return suffix, width
    return "", 1


def _split(C: int, values: int, width: int) -> tuple[int, int]:
    """The reductions' (splits, per) in packs of ``width`` elements."""
    return _cuda.reduction_split(C, values // width, minimum=max(1, _cuda.MIN_VALUES_PER_BLOCK // width))


def _forward_training_gpu(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: float,
                          eps: float, relu: bool, half: str | None, num_batches_tracked: Any,
                          key: tuple | None) -> tuple[Any, Any, Any]:
    """Two launches: per-(channel, split) Welford statistics, whose last block per channel finishes the
    channel (mean, invstd, running statistics in place; channel 0's counts the batch), then the fused
    normalisation (and ReLU). The launch is kept for the call's key when no array needed a copy."""
    xp = backend.get_array_module(x)
    (x_,), channels_last = layout.common((x,))
    weight_, bias_ = _contiguous(xp, weight), _contiguous(xp, bias)
    # The running statistics are updated in place: a strided view gets a contiguous working copy,
    # written back below (a parameter buffer's own views are contiguous: no copy).
    rm, rv = _contiguous(xp, running_mean), _contiguous(xp, running_var)
    _cuda.check_int32(x_)
    N, C, S = _layout(x_)
    reduce, grid, build, width, per, sizes, tail = _reduction(channels_last, (x_,), N, C, S, "bn_statistics", x.dtype,
                                                              half)
    # The float64 scratch: the partial (count, mean, M2) per (split, channel), then bn_apply's coefficients (2, C),
    # mean and invstd·weight.
    launch = _Launch(reduce, _kernel("bn_apply" + build, x.dtype, half),
                     grid, _cuda.i32(per), sizes, tail, _element_count(channels_last, x.size // width), channels_last,
                     C, _vector_dtype(x), (_cuda.i32(C), _cuda.i32(S), _cuda.i32(x.size)),
                     _cuda.block_counters(x, grid[0]),
                     (3 * grid[1] + 2) * C, 3 * grid[1] * C)
    if _same((x_, weight_, bias_, rm, rv), (x, weight, bias, running_mean, running_var)):
        _keep(key, launch)
    y, mean, invstd = _run_forward_training(launch, x_, weight_, bias_, rm, rv, momentum, eps, relu,
                                            num_batches_tracked)
    if rm is not running_mean:
        running_mean[...] = rm
    if rv is not running_var:
        running_var[...] = rv
    return y, mean, invstd


def _run_forward_training(launch: _Launch, x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                          momentum: float, eps: float, relu: bool, num_batches_tracked: Any) -> tuple[Any, Any, Any]:
    """The two launches of a checked call: x C-contiguous or channels-last as ``launch`` was made for, the vectors
    contiguous; a kept launch's through its packed pair for these scalars."""
    cupy = backend.cupy()
    y, flat_x, flat_y = _output_like(cupy, x, launch.channels_last)
    # Two allocations: unpacking the two rows of one array costs the host more than a second allocation.
    mean, invstd = cupy.empty(launch.C, dtype=launch.vector_dtype), cupy.empty(launch.C, dtype=launch.vector_dtype)
    if launch.packed is not None:
        scalars = (eps, momentum, relu)
        pair = launch.packed.get(scalars)
        if pair is None:  # per call: the reduction's x, weight, running statistics, mean, invstd and count; x, y, bias
            P = _cuda.PER_CALL
            pair = _packs_for(launch, scalars, _forward_arguments(launch, P, P, launch.scratch, launch.coef, P, P, P, P,
                                                                  P, P, eps, momentum, relu, P))
        pair[0](flat_x, weight, running_mean, running_var, mean, invstd, num_batches_tracked)
        pair[1](flat_x, flat_y, bias)
        return y, mean, invstd
    scratch, coef = _scratch(cupy, launch)
    reduce, elementwise = _forward_arguments(launch, flat_x, flat_y, scratch, coef, weight, bias, running_mean,
                                             running_var, mean, invstd, eps, momentum, relu, num_batches_tracked)
    _cuda.launch_blocks(launch.reduce, launch.grid, _cuda.THREADS, reduce)
    _cuda.launch(launch.elementwise, launch.count, elementwise)
    return y, mean, invstd


def _forward_arguments(launch: _Launch, flat_x: Any, flat_y: Any, scratch: Any, coef: Any, weight: Any, bias: Any,
                       running_mean: Any, running_var: Any, mean: Any, invstd: Any, eps: float, momentum: float,
                       relu: bool, num_batches_tracked: Any) -> tuple[tuple, tuple]:
    """The forward's two argument lists, in batchnorm.cu's order: bn_statistics's and bn_apply's."""
    return ((flat_x, scratch, launch.counters, *launch.sizes, launch.per, weight, running_mean, running_var, mean,
             invstd, coef, _cuda.f64(eps), _cuda.f64(momentum), num_batches_tracked, *launch.tail),
            (flat_x, flat_y, coef, bias, _cuda.i32(relu), *launch.sizes_of_x))


def _forward_inference_gpu(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, eps: float,
                           relu: bool, half: str | None) -> Any:
    """One element-wise launch."""
    xp = backend.get_array_module(x)
    (x,), channels_last = layout.common((x,))
    weight, bias = _contiguous(xp, weight), _contiguous(xp, bias)
    running_mean, running_var = _contiguous(xp, running_mean), _contiguous(xp, running_var)
    _cuda.check_int32(x)
    _, C, S = _layout(x)
    y = layout.empty(x.shape, x.dtype, xp, channels_last)
    build, width = _rows_packing((x, y), C)[:2] if channels_last else _packing((x, y), S)
    i32 = _cuda.i32
    _cuda.launch(_kernel("bn_inference" + build, x.dtype, half), _element_count(channels_last, x.size // width),
                 (layout.flat(x), layout.flat(y), running_mean, running_var, weight, bias, _cuda.f64(eps), i32(relu),
                  i32(C), i32(S), i32(x.size)))
    return y


def _backward_training_gpu(dy: Any, x: Any, weight: Any, mean: Any, invstd: Any, relu_output: Any, bias: Any,
                           relu: bool, half: str | None, key: tuple | None) -> tuple[Any, Any, Any]:
    """Two launches: per-(channel, split) Σdy and Σdy·(x − mean), whose last block per channel finishes
    the channel (dweight, dbias, the dx coefficients), then the element-wise dx; with ``relu`` the builds that
    recompute the fused ReLU's mask from x (batchnorm.cu's _relu kernels, which read ``bias``). The launch is
    kept for the call's key when no array needed a copy."""
    xp = backend.get_array_module(x)
    (x_, dy_, relu_output_), channels_last = layout.common((x, dy, relu_output))  # x's layout, as dx's
    weight_, mean_, invstd_ = _contiguous(xp, weight), _contiguous(xp, mean), _contiguous(xp, invstd)
    bias_ = _contiguous(xp, bias)
    _cuda.check_int32(x_)
    N, C, S = _layout(x_)
    flats = tuple(None if a is None else layout.flat(a) for a in (x_, dy_, relu_output_))
    mask = "_relu" if relu else ""
    # The mask from x splits the sums as the y path does (its kernels may hold another number of blocks an SM), so
    # that both give the same bits.
    reduce, grid, build, width, per, sizes, tail = _reduction(channels_last, flats, N, C, S,
                                                              "bn_backward_reduce" + mask, x.dtype, half,
                                                              split_as="bn_backward_reduce")
    # The float64 scratch: the partial (Σdy, Σdy·(x − mean)) per (split, channel), then the dx coefficients (3, C),
    # Σdy/M, invstd·weight and scale·invstd·dweight/M.
    launch = _Launch(reduce, _kernel("bn_backward_dx" + mask + build, x.dtype, half),
                     grid, _cuda.i32(per), sizes, tail, _element_count(channels_last, x.size // width), channels_last,
                     C, _vector_dtype(x), (_cuda.i32(C), _cuda.i32(S), _cuda.i32(x.size)),
                     _cuda.block_counters(x, grid[0]),
                     (2 * grid[1] + 3) * C, 2 * grid[1] * C)
    if _same((dy_, x_, relu_output_, weight_, mean_, invstd_, bias_), (dy, x, relu_output, weight, mean, invstd, bias)):
        _keep(key, launch)
    return _run_backward_training(launch, dy_, x_, weight_, mean_, invstd_, relu_output_, bias_)


def _run_backward_training(launch: _Launch, dy: Any, x: Any, weight: Any, mean: Any, invstd: Any,
                           relu_output: Any, bias: Any) -> tuple[Any, Any, Any]:
    """The two launches of a checked call: dy, x and relu_output in the one layout ``launch`` was made for (a kept
    launch's through its packed form); bias only where the launch recomputes the ReLU's mask (else None)."""
    cupy = backend.cupy()
    dx, flat_x, flat_dx = _output_like(cupy, x, launch.channels_last)
    if launch.channels_last:
        dy, relu_output = layout.buffer(dy), None if relu_output is None else layout.buffer(relu_output)
    dweight, dbias = cupy.empty(launch.C, dtype=launch.vector_dtype), cupy.empty(launch.C, dtype=launch.vector_dtype)
    if launch.packed is not None:
        pair = launch.packed.get(())
        if pair is None:  # per call: the reduction's dy, x, relu_output, bias, mean, invstd, weight, dweight, dbias;
            P = _cuda.PER_CALL  # and dx's
            pair = _packs_for(launch, (), _backward_arguments(launch, P, P, P, P, P, P, P, launch.scratch, launch.coef,
                                                              P, P, P))
        pair[0](dy, flat_x, relu_output, bias, mean, invstd, weight, dweight, dbias)
        pair[1](dy, flat_x, relu_output, bias, mean, flat_dx)
        return dx, dweight, dbias
    scratch, coef = _scratch(cupy, launch)
    reduce, elementwise = _backward_arguments(launch, dy, flat_x, relu_output, bias, mean, invstd, weight, scratch,
                                              coef, dweight, dbias, flat_dx)
    _cuda.launch_blocks(launch.reduce, launch.grid, _cuda.THREADS, reduce)
    _cuda.launch(launch.elementwise, launch.count, elementwise)
    return dx, dweight, dbias


def _backward_arguments(launch: _Launch, dy: Any, flat_x: Any, relu_output: Any, bias: Any, mean: Any, invstd: Any,
                        weight: Any, scratch: Any, coef: Any, dweight: Any, dbias: Any,
                        flat_dx: Any) -> tuple[tuple, tuple]:
    """The backward's two argument lists, in batchnorm.cu's order: bn_backward_reduce's (no dx, running_var or eps
    in training) and bn_backward_dx's."""
    return ((dy, flat_x, relu_output, bias, mean, scratch, launch.counters, None, invstd, None, weight,
             _cuda.f64(0.0), dweight, dbias, coef, *launch.sizes, launch.per, *launch.tail),
            (dy, flat_x, relu_output, bias, mean, coef, flat_dx, *launch.sizes_of_x))


def _backward_inference_gpu(dy: Any, x: Any, weight: Any, running_mean: Any, running_var: Any, eps: float,
                            relu_output: Any, half: str | None) -> tuple[Any, Any, Any]:
    """One launch: the per-(channel, split) sums with dx = dy·weight·invstd written in the same pass; the
    last block per channel finishes it (dweight, dbias)."""
    xp = backend.get_array_module(x)
    (x, dy, relu_output), channels_last = layout.common((x, dy, relu_output))  # x's layout, as dx's
    weight = _contiguous(xp, weight)
    running_mean, running_var = _contiguous(xp, running_mean), _contiguous(xp, running_var)
    _cuda.check_int32(x)
    N, C, S = _layout(x)
    dx = layout.empty(x.shape, x.dtype, xp, channels_last)
    dy, x, relu_output, flat_dx = (None if a is None else layout.flat(a) for a in (dy, x, relu_output, dx))
    # The channels-last reduction writes dx in a build of its own (batchnorm.cu's DX).
    name = "bn_backward_reduce_dx" if channels_last else "bn_backward_reduce"
    kernel, grid, build, width, per, sizes, tail = _reduction(channels_last, (x, dy, relu_output, dx), N, C, S, name,
                                                              x.dtype, half)
    partial = xp.empty((2, grid[1], C), dtype=xp.float64)  # Σdy, Σdy·(x − running_mean)
    dweight, dbias = xp.empty(C, dtype=_vector_dtype(x)), xp.empty(C, dtype=_vector_dtype(x))
    _cuda.launch_blocks(kernel, grid, _cuda.THREADS,
                        (dy, x, relu_output, None, running_mean, partial, _cuda.block_counters(x, grid[0]), flat_dx,
                         None, running_var, weight, _cuda.f64(eps), dweight, dbias, None, *sizes, _cuda.i32(per),
                         *tail))
    return dx, dweight, dbias
