"""Layer normalisation (Ba, Kiros & Hinton 2016) with PyTorch's semantics: each sample normalised over
its trailing ``normalized_shape`` axes with its own statistics, then scaled and shifted element-wise.

x is (*, *normalized_shape), seen as M rows of D = prod(normalized_shape) values:

    forward    mean = Σ_d x / D,  var = Σ_d (x − mean)² / D (biased),  invstd = 1/√(var + eps)
               y = (x − mean)·invstd·weight + bias           weight, bias: normalized_shape, or None
    backward   x̂ = (x − mean)·invstd,  g = dy·weight
               dx = invstd·(g − Σ_d g / D − x̂·Σ_d g·x̂ / D),  dweight = Σ_m dy·x̂,  dbias = Σ_m dy

The two subtracted terms of dx are the paths through the row's mean and variance. The statistics are
two-pass (the mean, then the squared deviations from it: never E[x²] − E[x]², which cancels in float32)
and every sum accumulates in float64, so float32 is sound without a float64 copy of x; results keep
x's dtype. On CuPy arrays the kernels of layernorm.cu run (one block per row for the statistics and
for dx; dweight and dbias from per-split column sums added in a fixed order: deterministic).
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .. import backend
from . import _cuda
from ._checks import check_float, check_number

__all__ = ["layer_norm_forward", "layer_norm_backward"]


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------
def check_normalized_shape(x: Any, normalized_shape: Any, name: str = "x") -> tuple[tuple[int, ...], int, int]:
    """(normalized_shape as a tuple, M, D) for x of shape (*, *normalized_shape); a clear error otherwise."""
    check_float(x, name)
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else normalized_shape
    if (isinstance(shape, (bool, np.bool_)) or not isinstance(shape, (tuple, list))
            or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in shape)):
        raise TypeError(f"layer_norm: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    shape = tuple(int(n) for n in shape)
    if not shape:
        raise ValueError("layer_norm: normalized_shape must have at least one dimension, got ()")
    if tuple(x.shape[x.ndim - len(shape):]) != shape or x.ndim < len(shape):
        raise ValueError(f"layer_norm: given normalized_shape={list(shape)}, expected {name} of shape "
                         f"[*, {', '.join(map(str, shape))}], got {list(x.shape)}")
    size = math.prod(shape)
    if size == 0:
        raise ValueError(f"layer_norm: normalized_shape {list(shape)} has no elements to normalise over")
    return shape, x.size // size, size


def _check_affine(v: Any, name: str, shape: tuple[int, ...], x: Any) -> None:
    """weight or bias: None, or an array of normalized_shape and x's dtype."""
    if v is None:
        return
    check_float(v, f"layer_norm: {name}")
    if tuple(v.shape) != shape:
        raise ValueError(f"layer_norm: {name} must have normalized_shape {shape}, got {tuple(v.shape)}")
    if v.dtype != x.dtype:
        raise TypeError(f"layer_norm: {name} must have x's dtype {x.dtype}, got {v.dtype}")


def _check_row_vector(v: Any, name: str, rows: int, x: Any) -> None:
    """mean or invstd: a (M,) array of x's dtype, as the forward returned it."""
    check_float(v, f"layer_norm: {name}")
    if tuple(v.shape) != (rows,):
        raise ValueError(f"layer_norm: {name} must have shape (M,) = ({rows},) for x of shape {tuple(x.shape)}, "
                         f"got {tuple(v.shape)}")
    if v.dtype != x.dtype:
        raise TypeError(f"layer_norm: {name} must have x's dtype {x.dtype}, got {v.dtype}")


def check_forward_arguments(x: Any, normalized_shape: Any, weight: Any, bias: Any,
                            eps: Any) -> tuple[tuple[int, ...], int, int, float]:
    """(normalized_shape, M, D, eps) once every argument of the forward is checked (both engines call this)."""
    shape, rows, size = check_normalized_shape(x, normalized_shape)
    _check_affine(weight, "weight", shape, x)
    _check_affine(bias, "bias", shape, x)
    eps = check_number(eps, "layer_norm: eps", lambda e: 0.0 <= e < float("inf"), "a finite number >= 0")
    backend.get_array_module(x, weight, bias)  # one device, or a clear ValueError
    return shape, rows, size, eps


def check_backward_arguments(dy: Any, x: Any, normalized_shape: Any, weight: Any, mean: Any,
                             invstd: Any) -> tuple[tuple[int, ...], int, int]:
    """(normalized_shape, M, D) once every argument of the backward is checked (both engines call this)."""
    shape, rows, size = check_normalized_shape(x, normalized_shape)
    check_float(dy, "layer_norm: dy")
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"layer_norm: dy must have x's shape {tuple(x.shape)}, got {tuple(dy.shape)}")
    if dy.dtype != x.dtype:
        raise TypeError(f"layer_norm: dy must have x's dtype {x.dtype}, got {dy.dtype}")
    _check_affine(weight, "weight", shape, x)
    _check_row_vector(mean, "mean", rows, x)
    _check_row_vector(invstd, "invstd", rows, x)
    backend.get_array_module(dy, x, weight, mean, invstd)
    return shape, rows, size


# ----------------------------------------------------------------------------------------------
# Forward and backward
# ----------------------------------------------------------------------------------------------
def layer_norm_forward(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                       eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """Normalise each row of x over its trailing ``normalized_shape`` axes.

    x: (*, *normalized_shape); normalized_shape: an int or a sequence of ints; weight, bias: arrays of
    normalized_shape or None (no scale, no shift); eps >= 0. Returns y: x's shape, and mean, invstd:
    (M,) with M = x.size / prod(normalized_shape), all of x's dtype; the caller keeps mean and invstd
    for :func:`layer_norm_backward`.
    """
    _, rows, size, eps = check_forward_arguments(x, normalized_shape, weight, bias, eps)
    if backend.is_cuda_array(x):
        return _forward_gpu(x, weight, bias, eps, rows, size)
    xp = backend.get_array_module(x)
    values = x.reshape(rows, size)
    mean = values.sum(axis=1, dtype=xp.float64) / size
    centered = values - mean.astype(x.dtype)[:, None]
    invstd = 1.0 / xp.sqrt((centered * centered).sum(axis=1, dtype=xp.float64) / size + eps)
    centered *= invstd.astype(x.dtype)[:, None]
    if weight is not None:
        centered *= weight.reshape(size)
    if bias is not None:
        centered += bias.reshape(size)
    return centered.reshape(x.shape), mean.astype(x.dtype), invstd.astype(x.dtype)


def layer_norm_backward(dy: Any, x: Any, normalized_shape: Any, weight: Any, mean: Any,
                        invstd: Any) -> tuple[Any, Any, Any]:
    """Gradients of :func:`layer_norm_forward`, through each row's statistics.

    dy, x: (*, *normalized_shape); weight: normalized_shape or None; mean, invstd: (M,) as the forward
    returned them. Returns dx: x's shape, dweight, dbias: normalized_shape, all of x's dtype; dweight and
    dbias are computed even without a weight or bias (the caller drops them).
    """
    shape, rows, size = check_backward_arguments(dy, x, normalized_shape, weight, mean, invstd)
    if backend.is_cuda_array(x):
        return _backward_gpu(dy, x, weight, mean, invstd, shape, rows, size)
    xp = backend.get_array_module(x)
    values, grads = x.reshape(rows, size), dy.reshape(rows, size)
    scale = invstd[:, None]
    normalised = (values - mean[:, None]) * scale
    g = grads if weight is None else grads * weight.reshape(size)
    mean_g = (g.sum(axis=1, dtype=xp.float64) / size).astype(x.dtype)[:, None]
    mean_gx = ((g * normalised).sum(axis=1, dtype=xp.float64) / size).astype(x.dtype)[:, None]
    dx = (g - mean_g - normalised * mean_gx) * scale
    dweight = (grads * normalised).sum(axis=0, dtype=xp.float64).astype(x.dtype).reshape(shape)
    dbias = grads.sum(axis=0, dtype=xp.float64).astype(x.dtype).reshape(shape)
    return dx.reshape(x.shape), dweight, dbias


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of layernorm.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
_SOURCE = "layernorm.cu"
COLUMNS_PER_BLOCK = 32  # layer_norm_backward_parameters: 32 columns × 8 row lanes per 256-thread block
MIN_ROWS_PER_SPLIT = 64


def _kernel(name: str, dtype: Any) -> Any:
    return _cuda.function(_SOURCE, name, dtype)


def _contiguous(xp: Any, a: Any) -> Any:
    return a if a is None or a.flags.c_contiguous else xp.ascontiguousarray(a)


def _forward_gpu(x: Any, weight: Any, bias: Any, eps: float, rows: int, size: int) -> tuple[Any, Any, Any]:
    """One launch: a block per row (grid-stride over rows) computes the statistics and writes y."""
    xp = backend.get_array_module(x)
    x, weight, bias = (_contiguous(xp, a) for a in (x, weight, bias))
    _cuda.check_int32(x)
    y = xp.empty(x.shape, dtype=x.dtype)
    mean, invstd = xp.empty(rows, dtype=x.dtype), xp.empty(rows, dtype=x.dtype)
    _cuda.launch_blocks(_kernel("layer_norm_forward", x.dtype), min(rows, _cuda.max_blocks()), _cuda.THREADS,
                        (x, weight, bias, y, mean, invstd, _cuda.i32(rows), _cuda.i32(size), _cuda.f64(eps)))
    return y, mean, invstd


def _backward_gpu(dy: Any, x: Any, weight: Any, mean: Any, invstd: Any, shape: tuple[int, ...], rows: int,
                  size: int) -> tuple[Any, Any, Any]:
    """Three launches: dx (a block per row); the per-split column sums of dy·x̂ and dy; their totals."""
    xp = backend.get_array_module(x)
    dy, x, weight, mean, invstd = (_contiguous(xp, a) for a in (dy, x, weight, mean, invstd))
    _cuda.check_int32(x)
    i32 = _cuda.i32
    dx = xp.empty(x.shape, dtype=x.dtype)
    _cuda.launch_blocks(_kernel("layer_norm_backward_data", x.dtype), min(rows, _cuda.max_blocks()), _cuda.THREADS,
                        (dy, x, weight, mean, invstd, dx, i32(rows), i32(size)))
    column_blocks = -(-size // COLUMNS_PER_BLOCK)
    splits, per = _cuda.reduction_split(column_blocks, rows, minimum=MIN_ROWS_PER_SPLIT)
    partial = xp.empty((2, splits, size), dtype=xp.float64)  # Σ dy·x̂, Σ dy over each split's rows
    dweight, dbias = xp.empty(shape, dtype=x.dtype), xp.empty(shape, dtype=x.dtype)
    _cuda.launch_blocks(_kernel("layer_norm_backward_parameters", x.dtype), (column_blocks, splits), _cuda.THREADS,
                        (dy, x, mean, invstd, partial, i32(rows), i32(size), i32(splits), i32(per)))
    _cuda.launch(_kernel("layer_norm_finish_parameters", x.dtype), size,
                 (partial, dweight, dbias, i32(size), i32(splits)))
    return dx, dweight, dbias
