"""Local response normalisation across channels as Caffe ran it (src/caffe/layers/lrn_layer.cu).

    scale[c] = k + (α/size)·Σ_{c' ∈ window(c)} x[c']²      y = x·scale^−β
    dx = dy·scale^−β − (2αβ/size)·x·Σ_{c' : c ∈ window(c')} dy[c']·y[c'] / scale[c']

window(c) = c − size//2 … c + (size − 1)//2, clipped to the channels (PyTorch's and, for odd sizes,
Caffe's). On the GPU, Caffe's three kernels: forward LRNFillScale (one thread per pixel slides the
window along the channels) then LRNComputeOutput (one thread per element), backward LRNComputeDiff
(one thread per pixel). Departures from Caffe, for agreement with the primitives: even sizes (an
asymmetric window), and the running window sums kept in double (see caffe_layers.cu).

On the CPU the window sums are plain shifted adds in float64 (the kernels' double sums), rounded
once to x's dtype. Arguments are checked by :mod:`minidnn.primitives.lrn`'s helpers.
"""
from __future__ import annotations

import math
from typing import Any

from .. import backend
from ..primitives import _cuda
from ..primitives import lrn as checks
from . import kernels


def lrn_forward(x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0,
                keep_scale: bool = False) -> tuple[Any, Any]:
    """LRNFillScale, then LRNComputeOutput. x: (N, C, *spatial); returns (y, scale), both x's shape and
    dtype: Caffe keeps scale for the backward (its ``scale_`` blob), whatever ``keep_scale`` says."""
    checks._check_input(x, "x")
    alpha, beta, k = checks._check_parameters(size, alpha, beta, k)
    xp = backend.get_array_module(x)
    if backend.is_cuda_array(x):
        x = xp.ascontiguousarray(x)
        scale, y = xp.empty(x.shape, dtype=x.dtype), xp.empty(x.shape, dtype=x.dtype)
        _cuda.check_int32(x)
        kernels.launch("lrn_fill_scale", x.dtype, _pixels(x),
                       (x, scale) + _layout(x, size) + (_cuda.f64(alpha / size), _cuda.f64(k)))
        kernels.launch("lrn_compute_output", x.dtype, x.size, (x, scale, y, _cuda.i32(x.size), _cuda.f64(beta)))
        return y, scale
    scale = k + (alpha / size) * _window_sum(x * x, size // 2, (size - 1) // 2)
    return x * scale ** -beta, scale


def lrn_backward(dy: Any, x: Any, y: Any, scale: Any, size: int, alpha: float = 1e-4, beta: float = 0.75,
                 k: float = 1.0) -> Any:
    """LRNComputeDiff. dy, x, y, scale: (N, C, *spatial), one shape and dtype (y and scale from
    :func:`lrn_forward`); returns dx. ``k`` does not enter (scale holds it)."""
    checks._check_input(x, "x")
    alpha, beta, k = checks._check_parameters(size, alpha, beta, k)
    checks._check_like_x(x, dy=dy, y=y, scale=scale)
    xp = backend.get_array_module(dy, x, y, scale)
    if backend.is_cuda_array(x):
        dy, x, y, scale = (xp.ascontiguousarray(a) for a in (dy, x, y, scale))
        dx = xp.empty(x.shape, dtype=x.dtype)
        _cuda.check_int32(x)
        kernels.launch("lrn_compute_diff", x.dtype, _pixels(x), (dy, x, y, scale, dx) + _layout(x, size)
                       + (_cuda.f64(beta), _cuda.f64(2 * alpha * beta / size)))
        return dx
    # Channel c enters the windows of c − (size − 1)//2 … c + size//2: the forward window mirrored.
    reached = _window_sum(dy * y / scale, (size - 1) // 2, size // 2)
    return dy * scale ** -beta - (2 * alpha * beta / size) * x * reached


def _pixels(x: Any) -> int:
    """N·S: the kernels that slide along the channels run one thread per pixel."""
    return x.shape[0] * math.prod(x.shape[2:])


def _layout(x: Any, size: int) -> tuple:
    """N, C, S and the forward window's reach (before, after) clipped to C, as int32 kernel arguments."""
    channels = x.shape[1]
    return tuple(_cuda.i32(v) for v in (x.shape[0], channels, math.prod(x.shape[2:]), min(size // 2, channels),
                                        min((size - 1) // 2, channels)))


def _window_sum(values: Any, before: int, after: int) -> Any:
    """Σ values[c'] over c' = c − before … c + after (zero outside the channels), along axis 1, by
    shifted adds in float64, rounded once to values' dtype. Reaches beyond C add only zeros: clipped."""
    xp = backend.get_array_module(values)
    channels = values.shape[1]
    before, after = min(before, channels), min(after, channels)
    padded = xp.pad(values.astype(xp.float64), ((0, 0), (before, after)) + ((0, 0),) * (values.ndim - 2))
    return sum(padded[:, offset:offset + channels] for offset in range(before + after + 1)).astype(values.dtype)
