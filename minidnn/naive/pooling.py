"""Pooling as Caffe ran it (src/caffe/layers/pooling_layer.cu): one kernel per layer direction.

On the GPU, windows without dilation run Caffe's four kernels (caffe_layers.cu):

    max forward     MaxPoolForward    one thread per output: the maximum and its index (the mask) in one pass
    max backward    MaxPoolBackward   one thread per input pixel gathers dy from the covering windows
                                      whose mask points at it
    avg forward     AvePoolForward    one thread per output: the window's sum over its divisor
    avg backward    AvePoolBackward   one thread per input pixel gathers dy / divisor from the covering windows

with PyTorch's semantics, so that the engines agree: ceil_mode (Caffe always rounded up), padding,
count_include_pad and divisor_override, int64 indices h·W + w, ties to the first maximum, a NaN
wins. Arguments are checked by the primitives' own helpers (:mod:`minidnn.primitives.pooling`).

Caffe had no dilated pooling and no adaptive pooling: those, and the CPU, use plain array code
(a loop over the window's taps, or over the output cells), which is also the NumPy twin of the
kernels' arithmetic.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from ..primitives import _cuda, convert
from ..primitives import pooling as checks
from ..primitives._checks import check_bool, check_float_or_half, check_gradient_part
from . import kernels


# ----------------------------------------------------------------------------------------------
# Max pooling
# ----------------------------------------------------------------------------------------------
def max_pool2d_forward(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                       ceil_mode: bool = False, return_indices: bool = False) -> tuple[Any, Any]:
    """Maximum over each window. x: (N, C, H, W); returns y: (N, C, P, Q) and the flat position h·W + w
    of each maximum in its plane (N, C, P, Q): Caffe's int32 ``max_idx_`` mask (MaxPoolForward), or
    int64 with ``return_indices`` (PyTorch's). Caffe had no half precision: a half x runs the float32 layer on
    its widening, and the maximum is rounded back exactly."""
    if hasattr(x, "dtype") and convert.half_type_of(x) is not None:
        return convert.on_widened_first(max_pool2d_forward, x, kernel_size, stride, padding, dilation, ceil_mode,
                                        return_indices)
    checks._check_input(x)
    index_type = np.int64 if check_bool(return_indices, "return_indices") else np.int32
    kernel, stride, padding, dilation, ceil_mode = checks._window_params(kernel_size, stride, padding, dilation,
                                                                         ceil_mode)
    N, C, H, W = x.shape
    out = checks._output_hw((H, W), kernel, stride, padding, dilation, ceil_mode)
    first_h = checks._first_input_tap(H, kernel[0], stride[0], padding[0], dilation[0], out[0], "row")
    first_w = checks._first_input_tap(W, kernel[1], stride[1], padding[1], dilation[1], out[1], "column")
    if backend.is_cuda_array(x) and dilation == (1, 1):
        cupy = backend.cupy()
        x = cupy.ascontiguousarray(x)
        y = cupy.empty((N, C) + out, dtype=x.dtype)
        indices = cupy.empty((N, C) + out, dtype=cupy.int32)
        kernels.launch("max_pool_forward", x.dtype, y.size, (x, y, indices) + _window(x.shape, out, kernel, stride,
                                                                                      padding))
        return y, indices.astype(index_type, copy=False)
    # Plain: a running maximum over the taps. Padding is −inf and only a strictly greater value (or a
    # NaN) replaces the maximum, so padding never wins, ties keep the first maximum, and a window
    # whose pixels are all −inf keeps its first input pixel's index, as the kernel.
    xp = backend.get_array_module(x)
    padded = _padded(x, padding, kernel, stride, dilation, out, -math.inf)
    y = xp.full((N, C) + out, -math.inf, dtype=x.dtype)
    indices = xp.empty((N, C) + out, dtype=index_type)
    indices[...] = xp.asarray(first_h[:, None] * W + first_w[None, :])
    for r, s, rows, cols in _taps(kernel, stride, dilation, out):
        window = padded[:, :, rows, cols]
        better = (window > y) | xp.isnan(window)
        h = np.arange(out[0]) * stride[0] - padding[0] + r * dilation[0]
        w = np.arange(out[1]) * stride[1] - padding[1] + s * dilation[1]
        xp.copyto(y, window, where=better)
        xp.copyto(indices, xp.asarray(h[:, None] * W + w[None, :]), where=better)
    return y, indices


def max_pool2d_backward(dy: Any, indices: Any, x_shape: tuple, kernel_size: Any = None, stride: Any = None,
                        padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False, *, dy_other: Any = None) -> Any:
    """dx: each dy entry added to the input pixel its window chose. dy, indices: (N, C, P, Q); returns dx: x_shape.

    With the window parameters (as :mod:`minidnn.functional` passes them) the GPU gathers per input
    pixel (MaxPoolBackward); without them, or with dilation, a plain scatter-add of dy at the indices.
    A half dy runs the float32 layer on its widening and dx is rounded once. dy_other, a second part of the
    gradient (a y that fed two operations), is summed into dy first, as Caffe's SplitLayer sums the gradients of a
    blob it split.
    """
    if dy_other is not None:
        check_float_or_half(dy, "grad_output")
        check_gradient_part(dy_other, dy, "dy_other", "grad_output", half=True)
        dy = convert.add(dy, dy_other)
    if hasattr(dy, "dtype") and convert.half_type_of(dy) is not None:
        return convert.on_widened(max_pool2d_backward, dy, indices, x_shape, kernel_size, stride, padding,
                                  dilation, ceil_mode)
    (N, C, H, W), window = checks._check_max_backward_arguments(dy, indices, x_shape, kernel_size, stride, padding,
                                                                dilation, ceil_mode)
    if backend.is_cuda_array(dy) and window is not None and window[3] == (1, 1):
        cupy = backend.cupy()
        dy = cupy.ascontiguousarray(dy)
        indices = cupy.ascontiguousarray(indices, dtype=cupy.int32)  # no copy for the forward's own mask
        dx = cupy.empty((N, C, H, W), dtype=dy.dtype)
        kernels.launch("max_pool_backward", dy.dtype, dx.size,
                       (dy, indices, dx) + _window(dx.shape, dy.shape[2:], *window[:3]))
        return dx
    xp = backend.get_array_module(dy)
    dx = xp.zeros((N * C, H * W), dtype=dy.dtype)
    planes = xp.arange(N * C).reshape(-1, 1)
    backend.add_at(dx, (planes, indices.reshape(N * C, -1)), dy.reshape(N * C, -1))
    return dx.reshape(N, C, H, W)


# ----------------------------------------------------------------------------------------------
# Average pooling
# ----------------------------------------------------------------------------------------------
def avg_pool2d_forward(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                       count_include_pad: bool = True, divisor_override: int | None = None) -> Any:
    """Mean over each window (AvePoolForward). x: (N, C, H, W); returns y: (N, C, P, Q). A half x runs the
    float32 layer on its widening, rounded once."""
    checks._check_input(x, half=True)
    if convert.half_type_of(x) is not None:
        return convert.on_widened(avg_pool2d_forward, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                  divisor_override)
    kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override = checks._avg_params(
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    N, C, H, W = x.shape
    out = checks._output_hw((H, W), kernel, stride, padding, dilation, ceil_mode)
    if backend.is_cuda_array(x):
        cupy = backend.cupy()
        x = cupy.ascontiguousarray(x)
        y = cupy.empty((N, C) + out, dtype=x.dtype)
        kernels.launch("avg_pool_forward", x.dtype, y.size,
                       (x, y) + _window(x.shape, out, kernel, stride, padding, count_include_pad, divisor_override))
        return y
    padded = _padded(x, padding, kernel, stride, dilation, out, 0.0)
    total = sum(padded[:, :, rows, cols] for _, _, rows, cols in _taps(kernel, stride, dilation, out))
    return total / _divisor(x.shape, kernel, stride, padding, out, count_include_pad, divisor_override, x.dtype)


def avg_pool2d_backward(dy: Any, x_shape: tuple, kernel_size: Any, stride: Any = None, padding: Any = 0,
                        ceil_mode: bool = False, count_include_pad: bool = True,
                        divisor_override: int | None = None) -> Any:
    """dx: each dy entry over its divisor, spread over its window's input pixels (AvePoolBackward).
    dy: (N, C, P, Q); returns dx: x_shape (half dy: as the forward)."""
    N, C, H, W = checks._check_x_shape(x_shape)
    kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override = checks._avg_params(
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    out = checks._output_hw((H, W), kernel, stride, padding, dilation, ceil_mode)
    checks._check_grad(dy, (N, C) + out, "the pooling output for x_shape", half=True)
    if convert.half_type_of(dy) is not None:
        return convert.on_widened(avg_pool2d_backward, dy, x_shape, kernel_size, stride, padding, ceil_mode,
                                  count_include_pad, divisor_override)
    if backend.is_cuda_array(dy):
        cupy = backend.cupy()
        dy = cupy.ascontiguousarray(dy)
        dx = cupy.empty((N, C, H, W), dtype=dy.dtype)
        kernels.launch("avg_pool_backward", dy.dtype, dx.size,
                       (dy, dx) + _window(dx.shape, out, kernel, stride, padding, count_include_pad, divisor_override))
        return dx
    xp = backend.get_array_module(dy)
    share = dy / _divisor((N, C, H, W), kernel, stride, padding, out, count_include_pad, divisor_override, dy.dtype)
    dx = _padded(xp.zeros((N, C, H, W), dtype=dy.dtype), padding, kernel, stride, dilation, out, 0.0)
    for _, _, rows, cols in _taps(kernel, stride, dilation, out):  # one tap's outputs read distinct pixels
        dx[:, :, rows, cols] += share
    return xp.ascontiguousarray(dx[:, :, padding[0]:padding[0] + H, padding[1]:padding[1] + W])


def _divisor(x_shape: tuple, kernel, stride, padding, out, count_include_pad: bool, divisor_override: Any,
             dtype: Any) -> Any:
    """Each window's divisor, (P, Q), as AvePoolForward counts it: the window's area inside the padded input
    (the ceil-mode overhang past it never counts), its real pixels only, or divisor_override."""
    if divisor_override is not None:
        return divisor_override
    sides = []
    for a in (0, 1):
        start = np.arange(out[a]) * stride[a] - padding[a]
        end = np.minimum(start + kernel[a], x_shape[2 + a] + padding[a])
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, x_shape[2 + a])
        sides.append(end - start)
    return np.asarray(sides[0][:, None] * sides[1][None, :], dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Adaptive average pooling (no Caffe layer: plain array code on every device)
# ----------------------------------------------------------------------------------------------
def _cells(size: int, out: int) -> list[tuple[int, int]]:
    """Output cell i of an axis averages [floor(i·size/out), ceil((i+1)·size/out))."""
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def adaptive_avg_pool2d_forward(x: Any, output_size: Any) -> Any:
    """One mean per output cell, a reduction each. x: (N, C, H, W); returns (N, C, P, Q) (half x: widened,
    rounded once)."""
    checks._check_input(x, half=True)
    if convert.half_type_of(x) is not None:
        return convert.on_widened(adaptive_avg_pool2d_forward, x, output_size)
    xp = backend.get_array_module(x)
    P, Q = checks._adaptive_output_size(output_size, x.shape[2:])
    y = xp.empty(x.shape[:2] + (P, Q), dtype=x.dtype)
    for p, (h0, h1) in enumerate(_cells(x.shape[2], P)):
        for q, (w0, w1) in enumerate(_cells(x.shape[3], Q)):
            y[:, :, p, q] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return y


def adaptive_avg_pool2d_backward(dy: Any, x_shape: tuple) -> Any:
    """dx: each cell's dy spread evenly over its window. dy: (N, C, P, Q); returns dx: x_shape (half dy:
    widened, rounded once)."""
    N, C, H, W = checks._check_adaptive_backward_arguments(dy, x_shape)
    if convert.half_type_of(dy) is not None:
        return convert.on_widened(adaptive_avg_pool2d_backward, dy, x_shape)
    xp = backend.get_array_module(dy)
    dx = xp.zeros((N, C, H, W), dtype=dy.dtype)
    for p, (h0, h1) in enumerate(_cells(H, dy.shape[2])):
        for q, (w0, w1) in enumerate(_cells(W, dy.shape[3])):
            dx[:, :, h0:h1, w0:w1] += (dy[:, :, p, q] / ((h1 - h0) * (w1 - w0)))[:, :, None, None]
    return dx


# ----------------------------------------------------------------------------------------------
# Helpers: the kernels' arguments, and the plain code's padded views
# ----------------------------------------------------------------------------------------------
def _window(x_shape: tuple, out: tuple, kernel, stride, padding, *average: Any) -> tuple:
    """The kernels' shape arguments as int32: planes N·C, H, W, P, Q, the window (and for average pooling
    count_include_pad and divisor_override, 0 when not given)."""
    for a in (0, 1):  # the kernels' window arithmetic stays below size + 2·padding + stride + kernel
        if x_shape[2 + a] + 2 * padding[a] + stride[a] + kernel[a] > _cuda.INT32_LIMIT:
            raise ValueError(f"pooling window (kernel_size {kernel}, stride {stride}, padding {padding}) over an "
                             f"input of {tuple(x_shape[2:])} is too large for the GPU kernels' 32-bit indexing")
    _cuda.check_int32(math.prod(x_shape), math.prod(x_shape[:2]) * math.prod(out))
    extra = () if not average else (int(average[0]), average[1] or 0)
    return tuple(_cuda.i32(v) for v in (x_shape[0] * x_shape[1], *x_shape[2:], *out, *kernel, *stride, *padding,
                                        *extra))


def _taps(kernel, stride, dilation, out):
    """(r, s, rows, cols): the slices of the padded input that tap (r, s) reads, one per output pixel."""
    for r in range(kernel[0]):
        for s in range(kernel[1]):
            top, left = r * dilation[0], s * dilation[1]
            yield (r, s, slice(top, top + stride[0] * (out[0] - 1) + 1, stride[0]),
                   slice(left, left + stride[1] * (out[1] - 1) + 1, stride[1]))


def _padded(x: Any, padding, kernel, stride, dilation, out, value: float) -> Any:
    """x padded by ``padding`` on the top and left, and on the bottom and right as far as the last window
    reaches (ceil mode's overhang), with ``value``."""
    xp = backend.get_array_module(x)
    extra = [max(0, stride[a] * (out[a] - 1) + dilation[a] * (kernel[a] - 1) + 1 - x.shape[2 + a] - padding[a])
             for a in (0, 1)]
    return xp.pad(x, ((0, 0), (0, 0), (padding[0], extra[0]), (padding[1], extra[1])), constant_values=value)
