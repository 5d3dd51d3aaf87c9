"""Fully connected layers and biases as Caffe computed them: every product a BLAS call, and every
bias a product with a vector of ones (the "bias multiplier").

    linear forward    Y = X·Wᵀ, then Y += ones · biasᵀ           (inner_product_layer.cu, forward)
    backward-data     dX = dY·W
    backward-weight   dW = dYᵀ·X
    bias_add          y[n] += bias · onesᵀ per image             (base_conv_layer.cpp, forward_gpu_bias)
    bias_backward     db += dy[n] · ones per image, a GEMV       (base_conv_layer.cpp, backward_gpu_bias)

X is x with its leading axes flattened (M × in_features). Every product goes through
:func:`minidnn.primitives.blas.gemm` (cuBLAS on the GPU, as Caffe's ``caffe_gpu_gemm``; a GEMV is
a GEMM of one column). The vectors of ones are kept, one per length, dtype and device, as Caffe
kept one per layer. Departure: :func:`bias_add` adds into y in place and returns y (Caffe's
beta = 1 GEMM into the layer's output), where the primitive returns a new array; minidnn's
functional layer hands it a fresh convolution output.

Arguments are checked by :mod:`minidnn.primitives.linear`'s helpers.
"""
from __future__ import annotations

import math
from typing import Any

from .. import backend
from ..primitives import blas
from ..primitives import linear as checks

_ones: dict[tuple, Any] = {}


def _bias_multiplier(length: int, like: Any) -> Any:
    """A vector of ``length`` ones of like's dtype on like's device, made once and kept."""
    where = backend.device_of(like)
    key = (length, like.dtype, where)
    if key not in _ones:
        with backend.on_device(where):
            _ones[key] = backend.get_array_module(like).ones(length, dtype=like.dtype)
    return _ones[key]


def _rows(a: Any) -> Any:
    """(..., F) as a contiguous (M, F) matrix."""
    return backend.get_array_module(a).ascontiguousarray(a).reshape(math.prod(a.shape[:-1]), a.shape[-1])


def linear_forward(x: Any, weight: Any, bias: Any = None) -> Any:
    """y = x·weightᵀ + bias. x: (..., in_features); weight: (out_features, in_features); bias: (out_features,)
    or None. Returns y: (..., out_features)."""
    checks._check_forward_arguments(x, weight, bias)
    rows = _rows(x)
    y = blas.gemm(rows, _rows(weight).T)
    if bias is not None:
        blas.gemm(_bias_multiplier(rows.shape[0], y).reshape(-1, 1), _rows(bias), y, beta=1.0)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def linear_backward_data(dy: Any, weight: Any) -> Any:
    """dx = dy·weight. dy: (..., out_features); returns dx: (..., in_features)."""
    checks._check_backward_data_arguments(dy, weight)
    return blas.gemm(_rows(dy), _rows(weight)).reshape(*dy.shape[:-1], weight.shape[1])


def linear_backward_weight(x: Any, dy: Any) -> Any:
    """dweight = dyᵀ·x over the flattened leading axes. Returns (out_features, in_features)."""
    checks._check_backward_weight_arguments(x, dy)
    return blas.gemm(_rows(dy).T, _rows(x))


def bias_add(y: Any, bias: Any, axis: int = 1, out: Any = None) -> Any:
    """y + bias broadcast along ``axis``, added in place as Caffe does: into ``out`` (a copy of y first
    unless ``out is y``), or, without ``out``, into y itself (a contiguous copy of y when y is strided),
    and returned. Seen as (outer, C, inner) around the axis: one GEMM ones · biasᵀ when inner = 1 (a
    linear layer's output), else one rank-1 GEMM bias · onesᵀ per outer index (per image of a convolution)."""
    axis = checks._check_bias_add_arguments(y, bias, axis, out)
    xp = backend.get_array_module(y)
    if out is not None and out is not y:
        out[...] = y
        y = out
    y = y if y.flags.c_contiguous else xp.ascontiguousarray(y)
    outer, channels, inner = math.prod(y.shape[:axis]), y.shape[axis], math.prod(y.shape[axis + 1:])
    bias = xp.ascontiguousarray(bias)
    if inner == 1:
        blas.gemm(_bias_multiplier(outer, y).reshape(-1, 1), bias.reshape(1, -1), y.reshape(outer, channels), beta=1.0)
        return y
    planes = y.reshape(outer, channels, inner)
    ones = _bias_multiplier(inner, y).reshape(1, -1)
    for n in range(outer):
        blas.gemm(bias.reshape(-1, 1), ones, planes[n], beta=1.0)
    return y


def bias_backward(dy: Any, axis: int = 1) -> Any:
    """Σ dy over every axis but ``axis``: (C,). One GEMV with ones when dy is (rows, C), else one GEMV
    per outer index accumulating into a zeroed db (Caffe's solver zeroes the diffs before each step)."""
    xp = backend.get_array_module(dy)
    axis = checks._check_bias_backward_arguments(dy, axis)
    dy = xp.ascontiguousarray(dy)
    outer, channels, inner = math.prod(dy.shape[:axis]), dy.shape[axis], math.prod(dy.shape[axis + 1:])
    if inner == 1:
        return blas.gemm(_bias_multiplier(outer, dy).reshape(1, -1), dy.reshape(outer, channels)).reshape(channels)
    db = xp.zeros((channels, 1), dtype=dy.dtype)
    planes = dy.reshape(outer, channels, inner)
    ones = _bias_multiplier(inner, dy).reshape(-1, 1)
    for n in range(outer):
        blas.gemm(planes[n], ones, db, beta=1.0)
    return db.reshape(channels)
