"""Softmax and log-softmax, and the two losses built on them: negative log-likelihood and cross-entropy.

Softmax is the "accurate" form (cuDNN's CUDNN_SOFTMAX_ACCURATE): the maximum along the axis is
subtracted first, so exp never sees a positive argument and logits of 1e4 stay finite.

The losses follow PyTorch's ``F.nll_loss`` and ``F.cross_entropy`` with class-index targets:
log_probs / logits (N, C), target (N,) of integer class indices, optional per-class weight (C,),
rows whose target equals ``ignore_index`` contribute 0 and leave the mean's denominator, and the
mean divides by the sum of the target classes' weights over the remaining rows (0/0 gives NaN, as
in PyTorch, with the gradient of ignored rows still 0). Label smoothing ε mixes in a uniform
target: row i costs (1 − ε)·(−w[t_i]·logp[i, t_i]) + (ε/C)·Σ_c(−w[c]·logp[i, c]), and the mean
divides both terms by the same Σ w[t_i].

Reductions stay on the device: "mean" and "sum" return a 0-d array of the input dtype, never a
Python float, so a training step on the GPU queues the loss without waiting for it.

On CuPy arrays every function runs the kernels of ``softmax.cu`` (see the ``_gpu`` functions at
the end): softmax and log-softmax in one launch, cross-entropy forward (log-softmax, the row
losses) in one launch plus a tiny reduction for "mean"/"sum", its backward in one element-wise
launch (after a tiny denominators pass for "mean" or weighted smoothing). Same results and same
argument errors, with one exception: checking that the targets lie in [0, C) would read device
memory (a host synchronisation on every call), so the GPU skips it. There a target outside
[0, C) that is not ``ignore_index`` never indexes memory: it acts as a class of weight NaN and
log-probability NaN, so its row's loss and gradient are NaN, and with reduction "mean" the NaN
reaches the loss and, through the denominator Σ w[t_i], the gradient of every row.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .. import backend
from . import _cuda
from ._checks import check_float, check_like, check_rank, check_same_dtype, normalise_axis

__all__ = [
    "softmax_forward", "softmax_backward", "log_softmax_forward", "log_softmax_backward",
    "nll_loss_forward", "nll_loss_backward", "cross_entropy_forward", "cross_entropy_backward",
]

REDUCTIONS = ("mean", "sum", "none")


# ----------------------------------------------------------------------------------------------
# Softmax and log-softmax
# ----------------------------------------------------------------------------------------------
def _shifted(x: Any, axis: int) -> Any:
    """x − max(x) along ``axis``: every entry ≤ 0, so exp of it is in (0, 1] and cannot overflow."""
    return x - x.max(axis=axis, keepdims=True)


def softmax_forward(x: Any, axis: int = -1) -> Any:
    """y = exp(x) / Σ_axis exp(x). x: any shape; returns y: x's shape and dtype."""
    check_float(x, "x")
    axis = normalise_axis(axis, x.ndim, "x")
    if backend.is_cuda_array(x):
        return _softmax_forward_gpu(x, axis, log=False)
    xp = backend.get_array_module(x)
    e = xp.exp(_shifted(x, axis))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(dy: Any, y: Any, axis: int = -1) -> Any:
    """dx = y · (dy − Σ_axis dy·y), the softmax Jacobian (diag(y) − y·yᵀ) applied to dy.

    dy, y: same shape (y the softmax output); returns dx: that shape.
    """
    check_like(dy, y, "dy", "y")
    axis = normalise_axis(axis, y.ndim, "y")
    backend.get_array_module(dy, y)  # one device, or a clear ValueError
    if backend.is_cuda_array(dy):
        return _softmax_backward_gpu(dy, y, axis, log=False)
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


def log_softmax_forward(x: Any, axis: int = -1) -> Any:
    """y = x − log Σ_axis exp(x), computed as s − log Σ exp(s) with s = x − max(x).

    x: any shape; returns y: x's shape and dtype. Taking the log of the sum rather than of the
    softmax keeps tiny probabilities accurate (log of an underflowed 0 would be −inf).
    """
    check_float(x, "x")
    axis = normalise_axis(axis, x.ndim, "x")
    if backend.is_cuda_array(x):
        return _softmax_forward_gpu(x, axis, log=True)
    xp = backend.get_array_module(x)
    s = _shifted(x, axis)
    return s - xp.log(xp.exp(s).sum(axis=axis, keepdims=True))


def log_softmax_backward(dy: Any, y: Any, axis: int = -1) -> Any:
    """dx = dy − exp(y) · Σ_axis dy, with y the log-softmax output (exp(y) is the softmax).

    dy, y: same shape; returns dx: that shape.
    """
    check_like(dy, y, "dy", "y")
    axis = normalise_axis(axis, y.ndim, "y")
    xp = backend.get_array_module(dy, y)
    if backend.is_cuda_array(dy):
        return _softmax_backward_gpu(dy, y, axis, log=True)
    return dy - xp.exp(y) * dy.sum(axis=axis, keepdims=True)


# ----------------------------------------------------------------------------------------------
# Loss arguments
# ----------------------------------------------------------------------------------------------
def check_reduction(reduction: Any) -> None:
    """``reduction``: "mean", "sum" or "none" (nn.CrossEntropyLoss checks with this too)."""
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check_scores(scores: Any, name: str) -> tuple[int, int]:
    """``scores`` (logits or log-probabilities) must be a float (N, C) array with C ≥ 1; returns (N, C)."""
    check_float(scores, name)
    check_rank(scores, 2, name, "(N, C)")
    if scores.shape[1] < 1:
        raise ValueError(f"{name} must be (N, C) with at least one class, got shape {tuple(scores.shape)}")
    return int(scores.shape[0]), int(scores.shape[1])


def _check_target(target: Any, batch: int, num_classes: int, ignore_index: Any) -> Any:
    """``target`` must be an integer (N,) array of indices in [0, C) or ``ignore_index``; returns it as int64.

    Range checking needs the values: on NumPy it is done here, the price of a clear error rather
    than a silently wrong gather. On a GPU it would be one host synchronisation per call (PyTorch
    uses a device-side assert instead), so it is skipped there and the kernels turn an
    out-of-range target into NaN (module docstring).
    """
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    dtype = getattr(target, "dtype", None)
    if dtype is None or dtype.kind not in "iu":
        raise TypeError(f"target must be an integer array of class indices (N,), got "
                        f"{dtype if dtype is not None else type(target).__name__}")
    if target.shape != (batch,):
        raise ValueError(f"target must have shape (N,) = ({batch},) to match the (N, C) scores, "
                         f"got {tuple(target.shape)}")
    # int64 so that comparing with a negative ignore_index is well defined for unsigned targets too.
    xp = backend.get_array_module(target)
    target = target.astype(xp.int64, copy=False)
    if backend.is_cuda_array(target):
        return target
    out_of_range = (target != ignore_index) & ((target < 0) | (target >= num_classes))
    if bool(out_of_range.any()):
        first = int(target[out_of_range][0])
        raise ValueError(f"target must hold class indices in [0, {num_classes}) or ignore_index={ignore_index}, "
                         f"got {first}")
    return target


def _check_num_classes_shape(num_classes_shape: Any) -> tuple[int, int]:
    """log_probs' shape (N, C) given to nll_loss_backward: two ints, C >= 1; returns (N, C)."""
    shape = tuple(num_classes_shape) if isinstance(num_classes_shape, (tuple, list)) else None
    if (shape is None or len(shape) != 2
            or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0 for n in shape)
            or shape[1] < 1):
        raise ValueError(f"num_classes_shape must be log_probs' shape (N, C), two ints with C >= 1, "
                         f"got {num_classes_shape!r}")
    return int(shape[0]), int(shape[1])


def _check_weight(weight: Any, num_classes: int, dtype: Any, dtype_name: str) -> None:
    if weight is None:
        return
    check_float(weight, "weight")
    if weight.shape != (num_classes,):
        raise ValueError(f"weight must have shape (C,) = ({num_classes},), got {tuple(weight.shape)}")
    if weight.dtype != dtype:
        raise TypeError(f"weight and {dtype_name} must have the same dtype, got {weight.dtype} and {dtype}")


def check_label_smoothing(label_smoothing: Any) -> float:
    if not isinstance(label_smoothing, numbers.Real) or isinstance(label_smoothing, bool):
        raise TypeError(f"label_smoothing must be a float in [0, 1], got {label_smoothing!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a float in [0, 1], got {label_smoothing!r}")
    return float(label_smoothing)


def _check_grad_loss(grad_loss: Any, batch: int, reduction: str) -> None:
    """grad_loss must be a float array shaped like the loss: () for mean/sum, (N,) for none."""
    check_float(grad_loss, "grad_loss")
    expected = (batch,) if reduction == "none" else ()
    if tuple(grad_loss.shape) != expected:
        raise ValueError(f"grad_loss must have the loss's shape {expected} for reduction={reduction!r}, "
                         f"got {tuple(grad_loss.shape)}")


# ----------------------------------------------------------------------------------------------
# Shared loss arithmetic
# ----------------------------------------------------------------------------------------------
def _row_weights(target: Any, weight: Any, ignore_index: int, dtype: Any) -> tuple[Any, Any, Any]:
    """(kept, safe_target, row_weight), each (N,).

    kept marks the rows not ignored; safe_target replaces ignored targets by class 0 so that
    gathers stay in range; row_weight is w[t_i] (1 without weights) on kept rows and 0 on ignored
    ones, so its sum is the mean's denominator.
    """
    xp = backend.get_array_module(target)
    kept = target != ignore_index
    safe_target = xp.where(kept, target, 0)
    row_weight = xp.ones(target.shape, dtype=dtype) if weight is None else weight[safe_target]
    return kept, safe_target, xp.where(kept, row_weight, xp.zeros((), dtype=dtype))


def _divide_or_nan(numerator: Any, denominator: Any) -> Any:
    """numerator / denominator, NaN where the denominator is 0 (PyTorch's mean over nothing) without a warning."""
    xp = backend.get_array_module(numerator, denominator)
    nonzero = denominator != 0
    return xp.where(nonzero, numerator / xp.where(nonzero, denominator, 1), xp.nan)


def _reduce(row_losses: Any, row_weight: Any, reduction: str) -> Any:
    """(N,) row losses -> the loss: (N,) for none, a 0-d array for sum and mean."""
    if reduction == "none":
        return row_losses
    xp = backend.get_array_module(row_losses)
    total = row_losses.sum()
    # NumPy's sum gives a scalar, CuPy's a 0-d array: asarray makes both a 0-d array of the same dtype.
    loss = total if reduction == "sum" else _divide_or_nan(total, row_weight.sum())
    return xp.asarray(loss, dtype=row_losses.dtype)


def _row_scale(grad_loss: Any, kept: Any, row_weight: Any, reduction: str) -> Any:
    """∂loss/∂(row loss i) times grad_loss, (N,): grad_loss[i], grad_loss or grad_loss / Σ row_weight.

    Ignored rows get exactly 0, even when the mean's denominator is 0 (their gradient is 0 in
    PyTorch too, while kept rows of a zero-weight batch get NaN).
    """
    xp = backend.get_array_module(grad_loss, kept)
    scale = _divide_or_nan(grad_loss, row_weight.sum()) if reduction == "mean" else grad_loss
    return xp.where(kept, scale, xp.zeros((), dtype=grad_loss.dtype))


def _picked_cost(log_probs: Any, kept: Any, safe_target: Any) -> Any:
    """−log_probs[i, t_i] on kept rows, 0 on ignored ones: (N,).

    Masked before any product: an ignored row's placeholder log-probability may be −inf, and
    0·(−inf) would be NaN (and a NumPy warning) where PyTorch gives 0.
    """
    xp = backend.get_array_module(log_probs)
    picked = log_probs[xp.arange(log_probs.shape[0]), safe_target]
    return xp.where(kept, -picked, xp.zeros((), dtype=log_probs.dtype))


# ----------------------------------------------------------------------------------------------
# Negative log-likelihood
# ----------------------------------------------------------------------------------------------
def nll_loss_forward(log_probs: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                     reduction: str = "mean") -> Any:
    """loss_i = −w[t_i]·log_probs[i, t_i] (0 for ignored rows), reduced.

    log_probs: (N, C); target: (N,) integer; weight: (C,) or None. Returns a 0-d array of
    log_probs' dtype for "mean"/"sum", (N,) for "none". A target outside [0, C) other than
    ignore_index is a ValueError on NumPy and gives NaN on the GPU (module docstring).
    """
    batch, num_classes = _check_scores(log_probs, "log_probs")
    check_reduction(reduction)
    backend.get_array_module(log_probs, target, weight)  # all on one device, or a clear ValueError
    target = _check_target(target, batch, num_classes, ignore_index)
    _check_weight(weight, num_classes, log_probs.dtype, "log_probs")
    if backend.is_cuda_array(log_probs):
        return _nll_loss_forward_gpu(log_probs, target, weight, ignore_index, reduction)
    kept, safe_target, row_weight = _row_weights(target, weight, ignore_index, log_probs.dtype)
    return _reduce(row_weight * _picked_cost(log_probs, kept, safe_target), row_weight, reduction)


def nll_loss_backward(grad_loss: Any, target: Any, num_classes_shape: Any, weight: Any = None,
                      ignore_index: int = -100, reduction: str = "mean") -> Any:
    """∂loss/∂log_probs: −w[t_i]·scale_i at [i, t_i], 0 elsewhere.

    grad_loss: the loss's shape (() for mean/sum, (N,) for none); target: (N,) integer;
    num_classes_shape: log_probs' shape (N, C); weight: (C,) or None. Returns (N, C) of
    grad_loss's dtype. scale_i is grad_loss[i], grad_loss, or grad_loss / Σ w[t_i] for the mean.
    An out-of-range target: a ValueError on NumPy, NaN on the GPU (module docstring).
    """
    batch, num_classes = _check_num_classes_shape(num_classes_shape)
    check_reduction(reduction)
    _check_grad_loss(grad_loss, batch, reduction)
    xp = backend.get_array_module(grad_loss, target, weight)  # all on one device, or a clear ValueError
    target = _check_target(target, batch, num_classes, ignore_index)
    _check_weight(weight, num_classes, grad_loss.dtype, "grad_loss")
    if backend.is_cuda_array(grad_loss):
        return _nll_loss_backward_gpu(grad_loss, target, weight, (batch, num_classes), ignore_index, reduction)
    kept, safe_target, row_weight = _row_weights(target, weight, ignore_index, grad_loss.dtype)
    grad = xp.zeros((batch, num_classes), dtype=grad_loss.dtype)
    # One write per row: ignored rows write 0 onto their placeholder class 0.
    grad[xp.arange(batch), safe_target] = -row_weight * _row_scale(grad_loss, kept, row_weight, reduction)
    return grad


# ----------------------------------------------------------------------------------------------
# Cross-entropy: log-softmax and NLL in one, with label smoothing
# ----------------------------------------------------------------------------------------------
def cross_entropy_forward(logits: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                          label_smoothing: float = 0.0, reduction: str = "mean") -> tuple[Any, Any]:
    """Cross-entropy of softmax(logits) against class indices, optionally label-smoothed.

    logits: (N, C); target: (N,) integer; weight: (C,) or None. Returns (loss, log_probs): loss
    is a 0-d array of logits' dtype for "mean"/"sum", (N,) for "none"; log_probs (N, C) is the
    log-softmax of logits, kept for :func:`cross_entropy_backward`. A target outside [0, C)
    other than ignore_index is a ValueError on NumPy and gives NaN on the GPU (module docstring).
    """
    key = _ready_key("cross_entropy_forward", (logits, target, weight), ignore_index, label_smoothing, reduction)
    ready = _ready_forward.get(key)
    if ready is not None:
        return ready(logits, target, weight)
    batch, num_classes = _check_scores(logits, "logits")
    check_reduction(reduction)
    xp = backend.get_array_module(logits, target, weight)  # all on one device, or a clear ValueError
    checked_target = _check_target(target, batch, num_classes, ignore_index)
    _check_weight(weight, num_classes, logits.dtype, "logits")
    epsilon = check_label_smoothing(label_smoothing)
    if backend.is_cuda_array(logits):
        with _cuda.recording() as launches:
            loss, log_probs, made = _cross_entropy_forward_gpu(logits, checked_target, weight, ignore_index, epsilon,
                                                               reduction)
        _ready_forward.keep(key, launches, (logits, target, weight), made, (loss, log_probs))
        return loss, log_probs
    target = checked_target
    log_probs = log_softmax_forward(logits, axis=1)
    kept, safe_target, row_weight = _row_weights(target, weight, ignore_index, logits.dtype)
    row_losses = row_weight * _picked_cost(log_probs, kept, safe_target)
    # Without smoothing the uniform term is skipped, not multiplied by 0, as PyTorch does:
    # a log-probability of −inf would otherwise turn 0·(−inf) into NaN.
    if epsilon > 0:
        # An element-wise product and sum rather than log_probs @ weight, so a float32 GEMM on the
        # GPU cannot fall to TF32 precision.
        weighted = log_probs if weight is None else log_probs * weight
        uniform = xp.where(kept, -weighted.sum(axis=1), xp.zeros((), dtype=logits.dtype))
        row_losses = (1 - epsilon) * row_losses + (epsilon / num_classes) * uniform
    return _reduce(row_losses, row_weight, reduction), log_probs


def cross_entropy_backward(grad_loss: Any, log_probs: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                           label_smoothing: float = 0.0, reduction: str = "mean") -> Any:
    """∂loss/∂logits in one fused element-wise pass: scale_i · (softmax[i, c]·Q_i − q[i, c]).

    q[i, c] = (1 − ε)·w[t_i]·[c = t_i] + (ε/C)·w[c] is the weighted, smoothed one-hot target
    and Q_i = Σ_c q[i, c] its row sum (1 without weights, so the familiar softmax − one-hot);
    scale_i is grad_loss[i], grad_loss, or grad_loss / Σ w[t_i] for the mean, and 0 on ignored
    rows. Derivation: row loss −Σ_c q[i, c]·logp[i, c] and ∂logp[i, c]/∂z[i, j] = [c = j] − p[i, j].

    grad_loss: the loss's shape; log_probs: (N, C) from :func:`cross_entropy_forward`;
    target: (N,) integer; weight: (C,) or None. Returns grad_logits (N, C) of log_probs' dtype.
    An out-of-range target: a ValueError on NumPy, NaN on the GPU (module docstring).
    """
    key = _ready_key("cross_entropy_backward", (grad_loss, log_probs, target, weight), ignore_index, label_smoothing,
                     reduction)
    ready = _ready_backward.get(key)
    if ready is not None:
        return ready(grad_loss, log_probs, target, weight)[0]
    batch, num_classes = _check_scores(log_probs, "log_probs")
    check_reduction(reduction)
    _check_grad_loss(grad_loss, batch, reduction)
    check_same_dtype(grad_loss, log_probs, "grad_loss", "log_probs")
    xp = backend.get_array_module(grad_loss, log_probs, target, weight)  # one device, or a clear ValueError
    checked_target = _check_target(target, batch, num_classes, ignore_index)
    _check_weight(weight, num_classes, log_probs.dtype, "log_probs")
    epsilon = check_label_smoothing(label_smoothing)
    if backend.is_cuda_array(log_probs):
        with _cuda.recording() as launches:
            grad, made = _cross_entropy_backward_gpu(grad_loss, log_probs, checked_target, weight, ignore_index,
                                                     epsilon, reduction)
        _ready_backward.keep(key, launches, (grad_loss, log_probs, target, weight), made, (grad,))
        return grad
    target = checked_target
    kept, safe_target, row_weight = _row_weights(target, weight, ignore_index, log_probs.dtype)
    scale = _row_scale(grad_loss, kept, row_weight, reduction)[:, None]                  # N, 1
    on_target = (1 - epsilon) * row_weight[:, None]                                        # N, 1
    uniform = epsilon / num_classes if weight is None else (epsilon / num_classes) * weight  # C or scalar
    row_total = on_target + (epsilon if weight is None else (epsilon / num_classes) * weight.sum())
    is_target = safe_target[:, None] == xp.arange(num_classes)                             # N, C
    smoothed_one_hot = xp.where(is_target, on_target, xp.zeros((), dtype=log_probs.dtype)) + uniform
    return scale * (xp.exp(log_probs) * row_total - smoothed_one_hot)


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of softmax.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
_ROW_THREADS = 256     # 8 warps per block, one row per warp
_REDUCE_THREADS = 1024  # the one block of loss_reduce and loss_denominators
_REDUCTION_CODES = {"none": 0, "sum": 1, "mean": 2}  # REDUCTION_* in softmax.cu
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1


def _kernel(name: str, dtype: Any) -> Any:
    return _cuda.function("softmax.cu", name, dtype)


def _launch_rows(name: str, dtype: Any, rows: int, args: tuple) -> None:
    """Run a one-warp-per-row kernel on ``rows`` rows (grid-stride over rows past the grid cap)."""
    warps = _ROW_THREADS // 32
    blocks = min((rows + warps - 1) // warps, _cuda.max_blocks())
    _cuda.launch_blocks(_kernel(name, dtype), blocks, _ROW_THREADS, args)


def _contiguous(a: Any) -> Any:
    """``a`` itself when C-contiguous (or None), else a contiguous copy: a RawKernel sees only the base pointer."""
    return a if a is None or a.flags.c_contiguous else backend.cupy().ascontiguousarray(a)


def _ignore_index_arg(ignore_index: int) -> np.int64:
    """ignore_index as the kernels' int64 argument.

    The targets are int64, so an ignore_index outside that range matches none of them; clipped to
    the range it still matches none, except a target equal to the bound, which lies outside [0, C)
    anyway (it then counts as ignored instead of giving NaN).
    """
    return np.int64(min(max(int(ignore_index), _INT64_MIN), _INT64_MAX))


def _softmax_forward_gpu(x: Any, axis: int, log: bool) -> Any:
    """x viewed as (outer, C, inner) around ``axis``: one warp per row when axis is the last one, else one
    thread per (outer, inner) position."""
    shape = tuple(x.shape)
    if shape[axis] == 0:  # NumPy's max over an empty axis (the twin's first step) raises this
        raise ValueError("zero-size array to reduction operation maximum which has no identity")
    x = _contiguous(x)
    y = backend.cupy().empty(shape, dtype=x.dtype)
    _cuda.check_int32(x)
    outer, channels, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    flag = _cuda.i32(int(log))
    if inner == 1:
        _launch_rows("softmax_forward_rows", x.dtype, outer, (x, y, _cuda.i32(outer), _cuda.i32(channels), flag))
    else:
        _cuda.launch(_kernel("softmax_forward_strided", x.dtype), outer * inner,
                     (x, y, _cuda.i32(outer), _cuda.i32(channels), _cuda.i32(inner), flag))
    return y


def _softmax_backward_gpu(dy: Any, y: Any, axis: int, log: bool) -> Any:
    shape = tuple(dy.shape)
    dy, y = _contiguous(dy), _contiguous(y)
    dx = backend.cupy().empty(shape, dtype=dy.dtype)
    _cuda.check_int32(dx)
    if dx.size == 0:
        return dx
    outer, channels, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    flag = _cuda.i32(int(log))
    if inner == 1:
        _launch_rows("softmax_backward_rows", dy.dtype, outer,
                     (dy, y, dx, _cuda.i32(outer), _cuda.i32(channels), flag))
    else:
        _cuda.launch(_kernel("softmax_backward_strided", dy.dtype), outer * inner,
                     (dy, y, dx, _cuda.i32(outer), _cuda.i32(channels), _cuda.i32(inner), flag))
    return dx


# Repeated cross-entropy calls on the GPU (the arrays' steady keys and the plain hyper-parameters) -> their launches
# (_cuda.ReadyCall): a training step computes its loss once, with the same shapes every step.
_ready_forward = _cuda.ReadyCalls()
_ready_backward = _cuda.ReadyCalls()


def _ready_key(name: str, arrays: tuple, ignore_index: Any, label_smoothing: Any, reduction: Any) -> tuple | None:
    """A ready call's key, or None for a call off the GPU or with hyper-parameters of other types (its checks judge
    those)."""
    if not backend.is_cuda_array(arrays[0]) or type(ignore_index) is not int or type(label_smoothing) is not float \
            or type(reduction) is not str:
        return None
    key = _cuda.steady_key(name, *arrays)
    return None if key is None else (*key, ignore_index, label_smoothing, reduction)


def _reduce_gpu(row_loss: Any, row_weight: Any, reduction: str) -> Any:
    """(N,) row losses -> the loss: themselves for "none", else a 0-d array from loss_reduce (one block)."""
    if reduction == "none":
        return row_loss
    loss = backend.cupy().empty((), dtype=row_loss.dtype)
    _cuda.launch_blocks(_kernel("loss_reduce", row_loss.dtype), 1, _REDUCE_THREADS,
                        (row_loss, row_weight, loss, _cuda.i32(row_loss.size), _cuda.i32(_REDUCTION_CODES[reduction])))
    return loss


def _cross_entropy_forward_gpu(logits: Any, target: Any, weight: Any, ignore_index: int, epsilon: float,
                               reduction: str) -> tuple[Any, Any, tuple]:
    """log_probs, row losses and row weights in one launch (one warp per row), then the reduction. Returns (the loss,
    log_probs, the arrays it allocated)."""
    cupy = backend.cupy()
    logits, target, weight = _contiguous(logits), _contiguous(target), _contiguous(weight)
    rows, classes = logits.shape
    _cuda.check_int32(logits)
    log_probs = cupy.empty(logits.shape, dtype=logits.dtype)
    row_loss = cupy.empty(rows, dtype=logits.dtype)
    row_weight = cupy.empty(rows, dtype=logits.dtype)
    _launch_rows("cross_entropy_forward_rows", logits.dtype, rows,
                 (logits, target, weight, log_probs, row_loss, row_weight, _cuda.i32(rows), _cuda.i32(classes),
                  _ignore_index_arg(ignore_index), _cuda.f64(epsilon)))
    loss = _reduce_gpu(row_loss, row_weight, reduction)
    return loss, log_probs, (log_probs, row_loss, row_weight) + (() if loss is row_loss else (loss,))


def _nll_loss_forward_gpu(log_probs: Any, target: Any, weight: Any, ignore_index: int, reduction: str) -> Any:
    """Row losses and weights (one thread per row), then the reduction."""
    cupy = backend.cupy()
    log_probs, target, weight = _contiguous(log_probs), _contiguous(target), _contiguous(weight)
    rows, classes = log_probs.shape
    _cuda.check_int32(log_probs)
    row_loss = cupy.empty(rows, dtype=log_probs.dtype)
    row_weight = cupy.empty(rows, dtype=log_probs.dtype)
    _cuda.launch(_kernel("nll_loss_forward_rows", log_probs.dtype), rows,
                 (log_probs, target, weight, row_loss, row_weight, _cuda.i32(rows), _cuda.i32(classes),
                  _ignore_index_arg(ignore_index)))
    return _reduce_gpu(row_loss, row_weight, reduction)


def _denominators_gpu(target: Any, weight: Any, classes: int, ignore_index: int, dtype: Any) -> Any:
    """(2,) device array: Σ_i w[t_i] and Σ_c w[c] (loss_denominators, one block)."""
    sums = backend.cupy().empty(2, dtype=dtype)
    _cuda.launch_blocks(_kernel("loss_denominators", dtype), 1, _REDUCE_THREADS,
                        (target, weight, sums, _cuda.i32(target.size), _cuda.i32(classes),
                         _ignore_index_arg(ignore_index)))
    return sums


def _cross_entropy_backward_gpu(grad_loss: Any, log_probs: Any, target: Any, weight: Any, ignore_index: int,
                                epsilon: float, reduction: str) -> tuple[Any, tuple]:
    """One element-wise launch; before it, the denominators pass when the mean or weighted smoothing needs it.
    Returns (the gradient, the arrays it allocated)."""
    grad_loss, log_probs = _contiguous(grad_loss), _contiguous(log_probs)
    target, weight = _contiguous(target), _contiguous(weight)
    rows, classes = log_probs.shape
    grad = backend.cupy().empty(log_probs.shape, dtype=log_probs.dtype)
    _cuda.check_int32(grad)
    needs_sums = reduction == "mean" or (weight is not None and epsilon > 0)
    sums = _denominators_gpu(target, weight, classes, ignore_index, log_probs.dtype) if needs_sums else None
    _cuda.launch(_kernel("cross_entropy_backward", log_probs.dtype), grad.size,
                 (grad_loss, log_probs, target, weight, sums, grad, _cuda.i32(rows), _cuda.i32(classes),
                  _ignore_index_arg(ignore_index), _cuda.f64(epsilon), _cuda.i32(_REDUCTION_CODES[reduction])))
    return grad, (grad,) + (() if sums is None else (sums,))


def _nll_loss_backward_gpu(grad_loss: Any, target: Any, weight: Any, shape: tuple[int, int], ignore_index: int,
                           reduction: str) -> Any:
    """One element-wise launch (every element written, zeros included); the denominators pass first for the mean."""
    grad_loss, target, weight = _contiguous(grad_loss), _contiguous(target), _contiguous(weight)
    rows, classes = shape
    grad = backend.cupy().empty(shape, dtype=grad_loss.dtype)
    _cuda.check_int32(grad)
    sums = _denominators_gpu(target, weight, classes, ignore_index, grad_loss.dtype) if reduction == "mean" else None
    _cuda.launch(_kernel("nll_loss_backward", grad_loss.dtype), grad.size,
                 (grad_loss, target, weight, sums, grad, _cuda.i32(rows), _cuda.i32(classes),
                  _ignore_index_arg(ignore_index), _cuda.i32(_REDUCTION_CODES[reduction])))
    return grad
