"""Cross-channel local response normalisation (LRN), as in AlexNet, Caffe and PyTorch's ``nn.LocalResponseNorm``.

    scale[c] = k + (α/size) · Σ_{c' ∈ window(c)} x[c']²,    y[c] = x[c] · scale[c]^(−β)

window(c) runs over channels c − size//2 … c + (size − 1)//2, clipped to [0, C): the channels
beyond the edges count as zeros and the sum is still divided by ``size`` (PyTorch zero-pads and
average-pools). For even ``size`` the window reaches one channel further back than forward.

Window sums come from a prefix sum over channels, two gathers and one subtraction, so the cost is
O(C) whatever ``size`` is. The running totals are accumulated in float64 (see
``_channel_window_sum``). A sequential prefix sum of squares never decreases, but a parallel
scan (as on a GPU) rounds differently per prefix, so the difference of two of them may come out
slightly negative over a window of zeros; the forward window sum is clamped at 0 so that scale
never drops below k.

On CuPy arrays each function is one launch of a kernel of ``lrn.cu``: one thread per pixel
(n, spatial position) slides the window along the channels with a running sum (add the entering
channel, subtract the leaving one; a float64 sum for float32 inputs too), writing y and scale in
the forward pass and dx in the backward pass: the same O(C) cost, without the temporaries.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from . import _cuda, layout
from ._checks import check_bool, check_float, check_int, check_real, check_same_dtype

__all__ = ["lrn_forward", "lrn_backward"]

_NULL = np.uintp(0)  # a null pointer argument for a kernel output that is not wanted


def _check_parameters(size: Any, alpha: Any, beta: Any, k: Any) -> tuple[float, float, float]:
    """Validate the hyper-parameters; returns (alpha, beta, k) as Python floats.

    Python floats, because a NumPy float64 scalar would promote a float32 result to float64.
    """
    check_int(size, "size", minimum=1)  # the number of channels in the window
    return check_real(alpha, "alpha"), check_real(beta, "beta"), check_real(k, "k")


def _check_input(x: Any, name: str) -> None:
    """``x`` must be a float array (N, C, *spatial) with at least 3 dimensions."""
    check_float(x, name)
    if x.ndim < 3:
        raise ValueError(f"{name} must be (N, C, *spatial) with at least 3 dimensions, got shape {tuple(x.shape)}")


def _check_like_x(x: Any, **arrays: Any) -> None:
    """Each named array (dy, y, scale of the backward) must be a float array of x's shape and dtype."""
    for name, array in arrays.items():
        check_float(array, name)
        check_same_dtype(array, x, name, "x")
        if array.shape != x.shape:
            raise ValueError(f"{name} must have x's shape {tuple(x.shape)}, got {tuple(array.shape)}")


def _channel_window_sum(values: Any, before: int, after: int) -> Any:
    """Σ values[c'] over c' = c − before … c + after, clipped to [0, C), along axis 1; same shape.

    prefix[j] = Σ_{c' < j} values[c'] (C + 1 entries, prefix[0] = 0), so the clipped window sum
    is prefix[min(c + after + 1, C)] − prefix[max(c − before, 0)].

    The prefix sums are kept in float64 whatever the input dtype, and the result rounded back
    once: a window sum taken as the difference of two running totals loses as many digits as
    the totals outgrow the window, which in float32 was visible (relative errors of 1e-5 in
    scale for channels of mixed magnitudes). The cost is one float64 temporary of x's size.
    """
    xp = backend.get_array_module(values)
    channels = values.shape[1]
    running = xp.cumsum(values, axis=1, dtype=xp.float64)
    prefix = xp.concatenate([xp.zeros_like(running[:, :1]), running], axis=1)
    index = xp.arange(channels)
    upper = xp.minimum(index + after + 1, channels)
    lower = xp.maximum(index - before, 0)
    window = xp.take(prefix, upper, axis=1) - xp.take(prefix, lower, axis=1)
    return window.astype(values.dtype, copy=False)


def lrn_forward(x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0,
                keep_scale: bool = False) -> tuple[Any, Any]:
    """y = x · scale^(−β) with scale = k + (α/size)·Σ_window x².

    x: (N, C, *spatial), at least 3-D. Returns (y, scale): y of x's shape and dtype, and scale
    (the same shape) only with ``keep_scale``, else None: :func:`lrn_backward` recomputes it from x
    in the same O(C) pass, which costs one cheap kernel and saves keeping an array of x's size
    alive from the forward to the backward pass.
    """
    _check_input(x, "x")
    alpha, beta, k = _check_parameters(size, alpha, beta, k)
    keep_scale = check_bool(keep_scale, "keep_scale")
    if backend.is_cuda_array(x):
        return _lrn_forward_gpu(x, size, alpha, beta, k, want_y=True, want_scale=keep_scale)
    xp = backend.get_array_module(x)
    scale = _scale(x, size, alpha, k)
    return x * xp.power(scale, -beta), (scale if keep_scale else None)


def _scale(x: Any, size: int, alpha: float, k: float) -> Any:
    """k + (α/size)·Σ_window x² (NumPy)."""
    xp = backend.get_array_module(x)
    squares = _channel_window_sum(x * x, size // 2, (size - 1) // 2)
    # A sum of squares is never negative; the clamp undoes the prefix sums' rounding (module docstring).
    squares = xp.maximum(squares, xp.zeros((), dtype=x.dtype))
    return k + (alpha / size) * squares


def lrn_backward(dy: Any, x: Any, y: Any, scale: Any, size: int, alpha: float = 1e-4, beta: float = 0.75,
                 k: float = 1.0) -> Any:
    """dx = dy·scale^(−β) − (2αβ/size) · x · Σ_{c' : c ∈ window(c')} dy[c']·y[c'] / scale[c'].

    dy, x, y, scale: (N, C, *spatial), all the same shape and dtype (y and scale from
    :func:`lrn_forward`; scale None: recomputed from x here). Returns dx of that shape. Channel c
    appears in the windows of channels c − (size − 1)//2 … c + size//2: the forward window
    mirrored, which differs for even size.
    """
    _check_input(x, "x")
    alpha, beta, k = _check_parameters(size, alpha, beta, k)
    if scale is None:
        scale = _lrn_forward_gpu(x, size, alpha, beta, k, want_y=False, want_scale=True)[1] \
            if backend.is_cuda_array(x) else _scale(x, size, alpha, k)
    _check_like_x(x, dy=dy, y=y, scale=scale)
    xp = backend.get_array_module(dy, x, y, scale)
    if backend.is_cuda_array(x):
        return _lrn_backward_gpu(dy, x, y, scale, size, alpha, beta)
    # Mirrored window: forward sums c − size//2 … c + (size−1)//2, so channel c is reached from
    # c' = c − (size−1)//2 … c + size//2.
    reached_from = _channel_window_sum(dy * y / scale, (size - 1) // 2, size // 2)
    return dy * xp.power(scale, -beta) - (2 * alpha * beta / size) * x * reached_from


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of lrn.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
def _geometry(x: Any) -> tuple[int, int, int]:
    """x seen as (N, C, S): S is the product of the spatial sizes."""
    return int(x.shape[0]), int(x.shape[1]), math.prod(x.shape[2:])


def _lrn_forward_gpu(x: Any, size: int, alpha: float, beta: float, k: float, want_y: bool,
                     want_scale: bool) -> tuple[Any, Any]:
    """(y or None, scale or None) in one launch, in x's layout: channels-last x is read as it lies (LRN runs in
    float32 under autocast, where a copy each way would cost more than the kernel); an output not wanted is a null
    pointer to the kernel."""
    cupy = backend.cupy()
    channels_last = layout.is_channels_last(x)
    if not channels_last:
        x = cupy.ascontiguousarray(x)  # a RawKernel sees only the base pointer
    y = layout.empty(x.shape, x.dtype, cupy, channels_last) if want_y else None
    scale = layout.empty(x.shape, x.dtype, cupy, channels_last) if want_scale else None
    _cuda.check_int32(x)
    N, C, S = _geometry(x)
    if x.size:
        # Window reaches clipped to C: beyond it every channel is a zero, and the kernel's indices stay small.
        before, after = min(size // 2, C), min((size - 1) // 2, C)
        outputs = (_NULL if y is None else layout.flat(y), _NULL if scale is None else layout.flat(scale))
        window = (_cuda.i32(before), _cuda.i32(after), _cuda.f64(alpha / size), _cuda.f64(beta), _cuda.f64(k))
        if channels_last:
            _cuda.launch(_cuda.function("lrn.cu", "lrn_forward_last", x.dtype), x.size,
                         (layout.flat(x), *outputs, _cuda.i32(x.size), _cuda.i32(C), *window))
        else:
            _cuda.launch(_cuda.function("lrn.cu", "lrn_forward", x.dtype), N * S,
                         (x, *outputs, _cuda.i32(N), _cuda.i32(C), _cuda.i32(S), *window))
    return y, scale


def _lrn_backward_gpu(dy: Any, x: Any, y: Any, scale: Any, size: int, alpha: float, beta: float) -> Any:
    """dx in one launch: in the four arrays' layout when all are channels-last, else from C-contiguous copies."""
    cupy = backend.cupy()
    channels_last = all(layout.is_channels_last(a) for a in (dy, x, y, scale))
    if not channels_last:
        dy, x, y, scale = (cupy.ascontiguousarray(a) for a in (dy, x, y, scale))
    dx = layout.empty(x.shape, x.dtype, cupy, channels_last)
    _cuda.check_int32(x)
    N, C, S = _geometry(x)
    if x.size:
        # The mirrored window: channel c is reached from c − (size − 1)//2 … c + size//2.
        before, after = min((size - 1) // 2, C), min(size // 2, C)
        window = (_cuda.i32(before), _cuda.i32(after), _cuda.f64(beta), _cuda.f64(2 * alpha * beta / size))
        arrays = tuple(layout.flat(a) for a in (dy, x, y, scale, dx))
        if channels_last:
            _cuda.launch(_cuda.function("lrn.cu", "lrn_backward_last", x.dtype), x.size,
                         (*arrays, _cuda.i32(x.size), _cuda.i32(C), *window))
        else:
            _cuda.launch(_cuda.function("lrn.cu", "lrn_backward", x.dtype), N * S,
                         (*arrays, _cuda.i32(N), _cuda.i32(C), _cuda.i32(S), *window))
    return dx
