"""Pooling primitives: max, average and adaptive average pooling over the H and W axes of NCHW.

Every parameter follows PyTorch (``torch.nn.functional.max_pool2d`` and friends):

* ``kernel_size``, ``stride``, ``padding``, ``dilation`` are an int or a pair (rows, columns);
  ``stride=None`` means stride = kernel_size.
* Output size per axis (:func:`pool_output_size`):
  ``(size + 2·padding − dilation·(kernel − 1) − 1) / stride + 1``, rounded down, or up with
  ``ceil_mode``; in ceil mode a last window that would start in the right padding (or beyond it)
  is dropped, so every window starts inside the input or the left padding.
* ``padding`` is at most ``kernel_size // 2`` (PyTorch's rule), so every average-pool window holds
  an input pixel. A max-pool window that still holds none (a dilation that skips over a tiny
  input) is a ``ValueError`` here, where PyTorch returns −inf with an index outside the plane.
* Max pooling: padding acts as −inf and is never chosen; on ties the first maximum in window order
  (row-major) wins; a NaN wins over any number (the last NaN in window order, as PyTorch's
  kernels). The forward returns, for each output, where its maximum is: with ``return_indices``
  PyTorch's int64 flat position ``h·W + w`` inside its (n, c) plane, otherwise the compact record
  a layer keeps for its backward, the winning tap ``r·kernel_w + c`` of the window as uint8 (an
  eighth of the memory; windows of more than 256 taps fall back to the int64 positions). The
  backward pass sends each dy entry to that pixel; it accepts either form.
* Average pooling divides by the window's area counted inside the padded input (the ceil-mode
  overhang past the padded border never counts), by the number of real input pixels with
  ``count_include_pad=False``, or by ``divisor_override``.
* Adaptive average pooling: output cell i of an axis of size L into n cells averages
  ``[floor(i·L/n), ceil((i+1)·L/n))``; windows may overlap and differ in size.

All functions take NumPy or CuPy arrays and keep the input's dtype (float32, float64, and float16 and
bfloat16 in the storage of primitives/convert.py). On CuPy arrays they run the kernels of ``pooling.cu``
(one launch per call, see the ``_gpu`` functions at the end): the same results, with the same argument
errors, but checks that would read device data (the range of ``indices`` in :func:`max_pool2d_backward`)
are skipped there to avoid a host sync. Half precision computes in float and rounds once: a maximum is
one of its window's values (exact), averages and the backward's sums are float32's; on the GPU in
pooling.cu's half build, on NumPy by widening (:func:`.convert.on_widened`).
"""
from __future__ import annotations

import functools
import numbers
from typing import Any

import numpy as np

from .. import backend
from . import _cuda, convert, layout
from ._checks import check_bool, check_float, check_float_or_half, check_gradient_part, check_int, check_rank, pair
from ._select import select, where_or_zero

# The most taps a window may have for the compact uint8 record of max pooling.
MAX_TAPS = 256

__all__ = [
    "pool_output_size", "max_pool2d_forward", "max_pool2d_backward", "avg_pool2d_forward", "avg_pool2d_backward",
    "adaptive_avg_pool2d_forward", "adaptive_avg_pool2d_backward",
]


# ----------------------------------------------------------------------------------------------
# Geometry and argument checks
# ----------------------------------------------------------------------------------------------
def pool_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """Number of pooling windows along one axis of ``size`` input pixels (PyTorch's formula).

    The result may be < 1 when the kernel does not fit; the pooling functions reject that.
    """
    size = check_int(size, "size", 0)
    kernel = check_int(kernel, "kernel", 1)
    stride = check_int(stride, "stride", 1)
    padding = check_int(padding, "padding", 0)
    dilation = check_int(dilation, "dilation", 1)
    ceil_mode = check_bool(ceil_mode, "ceil_mode")
    span = dilation * (kernel - 1) + 1
    # Python's // floors negative numerators too, as PyTorch's div_rtn does.
    out = (size + 2 * padding - span + (stride - 1 if ceil_mode else 0)) // stride + 1
    # Rounding up may add a window that starts in the right padding: it would pool padding only.
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _check_input(x: Any, name: str = "input", half: bool = False) -> None:
    """A float32/float64 (or, with ``half``, float16/bfloat16) (N, C, H, W) array; N may be 0, as in
    PyTorch, but not C, H or W."""
    (check_float_or_half if half else check_float)(x, name)
    check_rank(x, 4, name, "(N, C, H, W)")
    if min(x.shape[1:]) < 1:
        raise ValueError(f"{name} must have non-zero C, H and W, got shape {tuple(x.shape)}")


def _check_x_shape(x_shape: Any) -> tuple[int, int, int, int]:
    """x_shape of a backward call: four ints (N, C, H, W), C, H and W at least 1."""
    shape = tuple(x_shape) if isinstance(x_shape, (tuple, list)) else None
    if (shape is None or len(shape) != 4
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in shape)):
        raise ValueError(f"x_shape must be a tuple of 4 ints (N, C, H, W), got {x_shape!r}")
    if shape[0] < 0 or min(shape[1:]) < 1:
        raise ValueError(f"x_shape must have N >= 0 and C, H, W >= 1, got {x_shape!r}")
    return tuple(int(v) for v in shape)  # type: ignore[return-value]


def _check_grad(dy: Any, expected: tuple[int, ...], what: str, half: bool = False) -> None:
    (check_float_or_half if half else check_float)(dy, "grad_output")
    check_rank(dy, 4, "grad_output", "(N, C, P, Q)")
    if tuple(dy.shape) != expected:
        raise ValueError(f"grad_output must have shape {expected} ({what}), got {tuple(dy.shape)}")


def _window_params(kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any):
    """Validated pairs (kernel, stride, padding, dilation) and ceil_mode."""
    kernel = pair(kernel_size, "kernel_size", minimum=1)
    stride = kernel if stride is None else pair(stride, "stride", minimum=1)
    padding = pair(padding, "padding", minimum=0)
    dilation = pair(dilation, "dilation", minimum=1)
    ceil_mode = check_bool(ceil_mode, "ceil_mode")
    # PyTorch's rule (half of the undilated kernel): it keeps a real pixel in every window of an
    # average pool, so no divisor is zero.
    if padding[0] > kernel[0] // 2 or padding[1] > kernel[1] // 2:
        raise ValueError(f"padding must be at most half of kernel_size, got padding={padding} "
                         f"for kernel_size={kernel}")
    return kernel, stride, padding, dilation, ceil_mode


def _output_hw(hw: tuple[int, int], kernel, stride, padding, dilation, ceil_mode) -> tuple[int, int]:
    out = tuple(pool_output_size(hw[a], kernel[a], stride[a], padding[a], dilation[a], ceil_mode) for a in (0, 1))
    if min(out) < 1:
        span = tuple(dilation[a] * (kernel[a] - 1) + 1 for a in (0, 1))
        dilated = f" (dilated {span})" if dilation != (1, 1) else ""
        raise ValueError(f"kernel_size {kernel}{dilated} with padding {padding} is too large for input of size "
                         f"{tuple(hw)}: the output size would be {out}")
    return out  # type: ignore[return-value]


def _padded(x: Any, padding: tuple[int, int], extent: tuple[int, int], value: float) -> Any:
    """x padded by ``padding`` on the top/left and up to ``extent`` (at least H + padding) on the bottom/right.

    The bottom/right padding may exceed ``padding``: ceil mode's last window overhangs the padded input.
    """
    xp = backend.get_array_module(x)
    N, C, H, W = x.shape
    (ph, pw), (eh, ew) = padding, extent
    out = xp.full((N, C, eh, ew), value, dtype=x.dtype)
    out[:, :, ph:ph + H, pw:pw + W] = x
    return out


def _tap_slices(r: int, s: int, stride, dilation, out_hw) -> tuple[slice, slice]:
    """Rows and columns of the padded input that window tap (r, s) reads, one per output pixel."""
    top, left = r * dilation[0], s * dilation[1]
    return (slice(top, top + stride[0] * (out_hw[0] - 1) + 1, stride[0]),
            slice(left, left + stride[1] * (out_hw[1] - 1) + 1, stride[1]))


def _padded_extent(hw, kernel, stride, padding, dilation, out_hw) -> tuple[int, int]:
    """Padded size that holds every window: the last window's end, or the input, whichever is further."""
    return tuple(max(padding[a] + hw[a], stride[a] * (out_hw[a] - 1) + dilation[a] * (kernel[a] - 1) + 1)
                 for a in (0, 1))  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# Max pooling
# ----------------------------------------------------------------------------------------------
def _first_input_tap(size: int, kernel: int, stride: int, padding: int, dilation: int, out: int,
                     axis: str) -> np.ndarray:
    """Per output position along one axis, the input coordinate of the window's first tap inside the input.

    That is where PyTorch's kernels point the index of a window whose input pixels are all −inf.
    A window with no input tap at all can only come from a dilation larger than the input: PyTorch
    returns −inf with an index outside the plane there, which no backward pass could use, so it is
    an error here.
    """
    starts = np.arange(out) * stride - padding
    taps_in_padding = np.maximum(0, -starts + dilation - 1) // dilation  # ceil(-start / dilation) when start < 0
    first = starts + taps_in_padding * dilation
    empty = (taps_in_padding >= kernel) | (first >= size)
    if empty.any():
        raise ValueError(f"max_pool2d: with dilation {dilation} and padding {padding}, the window of output "
                         f"{axis} {int(np.argmax(empty))} holds no input pixel (input {axis}s: {size})")
    return first


def max_pool2d_forward(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                       ceil_mode: bool = False, return_indices: bool = False) -> tuple[Any, Any]:
    """Maximum over each (dilated) window.

    x: (N, C, H, W); returns y: (N, C, P, Q) of x's dtype and where each maximum is, (N, C, P, Q):
    with ``return_indices`` int64 flat positions h·W + w in its (n, c) plane (PyTorch's), else
    the uint8 winning tap r·kernel_w + c of its window (int64 positions for windows of > 256 taps).
    A channels-last x gives a channels-last y and indices (PyTorch's rule): on the GPU from kernels of that
    layout, on the CPU from a C-contiguous copy.
    """
    _check_input(x, half=True)
    if layout.is_channels_last(x) and not backend.is_cuda_array(x):
        y, indices = max_pool2d_forward(layout.contiguous(x), kernel_size, stride, padding, dilation, ceil_mode,
                                        return_indices)
        return layout.to_channels_last(y), layout.to_channels_last(indices)
    half = convert.half_type_of(x)
    if half is not None and not backend.is_cuda_array(x):  # the half kernels' twin: the float32 maximum, exact
        return convert.on_widened_first(max_pool2d_forward, x, kernel_size, stride, padding, dilation, ceil_mode,
                                        return_indices)
    kernel, stride, padding, dilation, ceil_mode = _window_params(kernel_size, stride, padding, dilation, ceil_mode)
    taps = not check_bool(return_indices, "return_indices") and kernel[0] * kernel[1] <= MAX_TAPS
    xp = backend.get_array_module(x)
    N, C, H, W = x.shape
    P, Q = _output_hw((H, W), kernel, stride, padding, dilation, ceil_mode)
    first_h = _first_input_tap(H, kernel[0], stride[0], padding[0], dilation[0], P, "row")
    first_w = _first_input_tap(W, kernel[1], stride[1], padding[1], dilation[1], Q, "column")
    if backend.is_cuda_array(x):
        return _max_pool2d_forward_gpu(x, kernel, stride, padding, dilation, (P, Q), taps)
    # Padding is −inf and only a strictly greater value replaces the running maximum, so padding
    # is never chosen and ties keep the first maximum. The loop runs over the R·S taps (a running
    # max, like Caffe's kernel), never over pixels, and needs no R·S-times copy of the input.
    x_padded = _padded(x, padding, _padded_extent((H, W), kernel, stride, padding, dilation, (P, Q)), -np.inf)
    y = xp.full((N, C, P, Q), -np.inf, dtype=x.dtype)
    start_h = np.arange(P) * stride[0] - padding[0]
    start_w = np.arange(Q) * stride[1] - padding[1]
    indices = xp.empty((N, C, P, Q), dtype=xp.uint8 if taps else xp.int64)
    if taps:  # the first tap inside the input, where the running maximum starts
        indices[...] = xp.asarray(((first_h - start_h) // dilation[0])[:, None] * kernel[1]
                                  + ((first_w - start_w) // dilation[1])[None, :], dtype=xp.uint8)
    else:
        indices[...] = xp.asarray(first_h[:, None] * W + first_w[None, :], dtype=xp.int64)
    for r in range(kernel[0]):
        for s in range(kernel[1]):
            window = x_padded[(slice(None), slice(None)) + _tap_slices(r, s, stride, dilation, (P, Q))]
            better = (window > y) | xp.isnan(window)  # NaN propagates, as in PyTorch
            if taps:
                tap = r * kernel[1] + s
            else:
                tap = (start_h + r * dilation[0])[:, None] * W + (start_w + s * dilation[1])[None, :]
            # Selects rather than copies under a mask: NumPy's masked copy (and np.where) branches on every
            # element, and about half of them take each branch here; select picks through the bits. The
            # indices blend in integers (uint8 wraps modulo 256, and better is 0 or 1, so
            # indices + better·(tap − indices) is tap or indices exactly).
            y = select(better, window, y)
            indices += better * (xp.asarray(tap, dtype=indices.dtype) - indices)
    return y, indices


def _check_max_backward_arguments(dy: Any, indices: Any, x_shape: Any, kernel_size: Any, stride: Any, padding: Any,
                                  dilation: Any, ceil_mode: Any) -> tuple[tuple[int, int, int, int], tuple | None]:
    """The arguments of :func:`max_pool2d_backward`; returns x_shape and the window parameters (or None).

    The range of int64 ``indices`` is checked on NumPy only: on the GPU it would read device memory.
    """
    N, C, H, W = _check_x_shape(x_shape)
    check_float_or_half(dy, "grad_output")
    check_rank(dy, 4, "grad_output", "(N, C, P, Q)")
    if tuple(dy.shape[:2]) != (N, C):
        raise ValueError(f"grad_output must have x_shape's N and C {(N, C)} in its first two axes, "
                         f"got shape {tuple(dy.shape)}")
    if kernel_size is None:
        if (stride, padding, dilation, ceil_mode) != (None, 0, 1, False):
            raise ValueError("max_pool2d_backward: give kernel_size with the other window parameters "
                             "(stride, padding, dilation, ceil_mode), or none of them")
        window = None
    else:
        window = _window_params(kernel_size, stride, padding, dilation, ceil_mode)
        _check_grad(dy, (N, C) + _output_hw((H, W), *window), "the pooling output for x_shape", half=True)
    dtype = getattr(indices, "dtype", None)
    if dtype is None or dtype.kind not in "iu":
        raise TypeError(f"indices must be an integer array (int64 positions or uint8 taps from max_pool2d_forward), "
                        f"got {dtype if dtype is not None else type(indices).__name__}")
    if tuple(indices.shape) != tuple(dy.shape):
        raise ValueError(f"indices must have grad_output's shape {tuple(dy.shape)}, got {tuple(indices.shape)}")
    backend.get_array_module(dy, indices)  # refuses dy and indices on different devices
    if dtype == np.uint8 and window is None:
        raise ValueError("max_pool2d_backward: uint8 taps need the window parameters (kernel_size, ...)")
    if not backend.is_cuda_array(dy) and indices.size:
        if dtype == np.uint8:
            _check_taps(indices, window, (N, C, H, W))
        elif int(indices.min()) < 0 or int(indices.max()) >= H * W:
            raise ValueError(f"indices must lie in [0, H*W) = [0, {H * W}) for x_shape {(N, C, H, W)}, "
                             f"got values in [{int(indices.min())}, {int(indices.max())}]")
    return (N, C, H, W), window


def _check_taps(taps: np.ndarray, window: tuple, x_shape: tuple[int, int, int, int]) -> None:
    """uint8 taps must each name a tap r·kernel_w + c of its window whose pixel lies in the input (as the forward's
    do: it never picks padding). Checked without widening the record: one pass for the largest tap, then, along each
    axis, only the outputs whose windows reach past the input (the borders; none without padding or ceil mode)."""
    N, C, H, W = x_shape
    kernel, stride, padding, dilation, _ = window

    def refuse(found: str) -> ValueError:
        return ValueError(f"indices must lie in [0, H*W) = [0, {H * W}) for x_shape {(N, C, H, W)}: uint8 taps must "
                          f"name window taps on input pixels, got {found}")

    largest = int(taps.max())
    if largest >= kernel[0] * kernel[1]:
        raise refuse(f"a tap {largest} of a {kernel[0]} x {kernel[1]} window")
    for axis, size in ((0, H), (1, W)):
        # (outputs, taps along the axis): the input coordinate each tap of each output's window reads
        coordinates = (np.arange(taps.shape[2 + axis]) * stride[axis] - padding[axis])[:, None] \
            + np.arange(kernel[axis])[None, :] * dilation[axis]
        inside = (coordinates >= 0) & (coordinates < size)
        border = np.flatnonzero(~inside.all(axis=1))
        if border.size == 0:
            continue
        along = np.take(taps, border, axis=2 + axis)
        along = along // kernel[1] if axis == 0 else along % kernel[1]
        output = np.arange(border.size).reshape((-1, 1) if axis == 0 else (1, -1))  # broadcast against along's axes
        if not inside[border][output, along].all():
            raise refuse(f"a tap on the padding or past the input ({('row', 'column')[axis]}s: {size})")


def max_pool2d_backward(dy: Any, indices: Any, x_shape: tuple, kernel_size: Any = None, stride: Any = None,
                        padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False, *, dy_other: Any = None) -> Any:
    """dx = ∂L/∂x: each dy entry added to the input pixel its window chose (overlapping windows add).

    dy: (N, C, P, Q); indices: (N, C, P, Q) from :func:`max_pool2d_forward`, int64 positions or
    uint8 taps; x_shape: (N, C, H, W); returns dx: x_shape of dy's dtype.

    The window parameters are optional with int64 positions (the NumPy code needs only those);
    given, they must be the forward's, dy's shape is checked against them, and on the GPU each
    input pixel then gathers from the few windows that cover it. Without them the GPU adds each
    (n, c) plane's gradients in one thread (deterministic, but only N·C threads): pass them for
    speed. uint8 taps need them. dx is channels-last when dy is (on the GPU from kernels of that layout when the
    window parameters are given; otherwise from C-contiguous copies).

    dy_other: None, or a second part of y's gradient (dy's shape and dtype), for a y that fed two operations, as
    ResNet's stem pooling feeds the first block's convolution and its shortcut: dx is then the backward of
    dy + dy_other, the sum rounded to the dtype as :func:`.convert.add` rounds it. On the GPU with the window
    parameters and float32 or float64 parts, the gather reads both (pooling.cu's *_sum kernels), which spares the
    sum a pass of its own over three arrays; elsewhere the parts are summed first. (The gather is bound by its
    loop's latency more than by its bytes: a second array read in it cost the half types more than the packed sum
    of two half arrays, benchmarks/results/2026-12-07-h100-padded-pixels-and-pooling-parts.)
    """
    (N, C, H, W), window = _check_max_backward_arguments(dy, indices, x_shape, kernel_size, stride, padding,
                                                         dilation, ceil_mode)
    half = convert.half_type_of(dy)
    gathers = backend.is_cuda_array(dy) and window is not None  # the GPU's gather kernels, in either layout
    if dy_other is not None:
        check_gradient_part(dy_other, dy, "dy_other", "grad_output", half=True)
        if not gathers or half is not None:
            dy, dy_other = convert.add(dy, dy_other), None  # the sum in dy's layout, and so dx
    if layout.is_channels_last(dy) and not gathers:
        return layout.to_channels_last(max_pool2d_backward(layout.contiguous(dy), layout.contiguous(indices), x_shape,
                                                           kernel_size, stride, padding, dilation, ceil_mode))
    xp = backend.get_array_module(dy, indices)
    if half is not None and not gathers:
        # The twin of the half kernels (float32 sums, one rounding); on the GPU also the serial path, whose
        # in-place additions the half build does not have.
        return convert.on_widened(max_pool2d_backward, dy, indices, x_shape, kernel_size, stride, padding,
                                  dilation, ceil_mode)
    if backend.is_cuda_array(dy):
        return _max_pool2d_backward_gpu(dy, indices, (N, C, H, W), window, dy_other)
    if indices.dtype == np.uint8:
        return _max_pool2d_backward_by_tap(dy, indices, (N, C, H, W), window)
    # Scatter-add into the flattened batch; np.add.at is unbuffered (repeated indices accumulate),
    # deterministic, and in NumPy 2 faster than bincount (which also computes in float64).
    planes = xp.arange(N * C, dtype=xp.int64).reshape(N, C, 1, 1) * (H * W)
    dx = xp.zeros(N * C * H * W, dtype=dy.dtype)
    xp.add.at(dx, (planes + indices).reshape(-1), dy.reshape(-1))
    return dx.reshape(N, C, H, W)


def _max_pool2d_backward_by_tap(dy: np.ndarray, taps: np.ndarray, x_shape: tuple, window: tuple) -> np.ndarray:
    """The NumPy backward from uint8 taps: for each window tap, the dy entries whose window chose it, added
    onto the strided slice of the padded input that tap reads (the forward's loop, run backwards).

    One pass per tap over (N, C, P, Q) arrays, where a scatter by flat position (np.add.at) handles each
    entry on its own; overlapping windows add in tap order instead of pixel order."""
    N, C, H, W = x_shape
    kernel, stride, padding, dilation, _ = window
    out_hw = tuple(dy.shape[2:])
    extent = _padded_extent((H, W), kernel, stride, padding, dilation, out_hw)
    dx = np.zeros((N, C) + tuple(extent), dtype=dy.dtype)
    for r in range(kernel[0]):
        for s in range(kernel[1]):
            chosen = taps == r * kernel[1] + s
            dx[(slice(None), slice(None)) + _tap_slices(r, s, stride, dilation, out_hw)] += where_or_zero(chosen, dy)
    return np.ascontiguousarray(dx[:, :, padding[0]:padding[0] + H, padding[1]:padding[1] + W])


# ----------------------------------------------------------------------------------------------
# Average pooling
# ----------------------------------------------------------------------------------------------
def _check_divisor(divisor_override: Any) -> int | None:
    if divisor_override is None:
        return None
    if not isinstance(divisor_override, numbers.Integral) or isinstance(divisor_override, bool):
        raise TypeError(f"divisor_override must be None or a non-zero int, got {divisor_override!r}")
    if divisor_override == 0:
        raise ValueError("divisor_override must be None or a non-zero int, got 0")
    return int(divisor_override)


def _axis_divisor(size: int, kernel: int, stride: int, padding: int, out: int, count_include_pad: bool) -> np.ndarray:
    """Per output position along one axis, how many of its window's taps count in the divisor."""
    starts = np.arange(out) * stride - padding
    ends = np.minimum(starts + kernel, size + padding)  # the overhang past the padded border never counts
    if count_include_pad:
        return ends - starts
    return np.minimum(ends, size) - np.maximum(starts, 0)


def _avg_divisor(xp, hw, kernel, stride, padding, out_hw, count_include_pad, divisor_override, dtype) -> Any:
    """The divisor of every output pixel, (P, Q) of ``dtype``; the window area is separable in rows × columns."""
    if divisor_override is not None:
        return xp.asarray(divisor_override, dtype=dtype)
    rows = _axis_divisor(hw[0], kernel[0], stride[0], padding[0], out_hw[0], count_include_pad)
    cols = _axis_divisor(hw[1], kernel[1], stride[1], padding[1], out_hw[1], count_include_pad)
    return xp.asarray(rows[:, None] * cols[None, :], dtype=dtype)


def _avg_params(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, dilation, ceil_mode = _window_params(kernel_size, stride, padding, 1, ceil_mode)
    count_include_pad = check_bool(count_include_pad, "count_include_pad")
    return kernel, stride, padding, dilation, ceil_mode, count_include_pad, _check_divisor(divisor_override)


def avg_pool2d_forward(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                       count_include_pad: bool = True, divisor_override: int | None = None) -> Any:
    """Mean over each window (see the module docstring for the divisor).

    x: (N, C, H, W); returns y: (N, C, P, Q) of x's dtype, channels-last for a channels-last x (computed on a
    C-contiguous copy).
    """
    _check_input(x, half=True)
    if layout.is_channels_last(x):
        return layout.to_channels_last(avg_pool2d_forward(layout.contiguous(x), kernel_size, stride, padding,
                                                          ceil_mode, count_include_pad, divisor_override))
    kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override = _avg_params(
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    xp = backend.get_array_module(x)
    N, C, H, W = x.shape
    out_hw = _output_hw((H, W), kernel, stride, padding, dilation, ceil_mode)
    if backend.is_cuda_array(x):
        return _avg_pool2d_forward_gpu(x, kernel, stride, padding, out_hw, count_include_pad, divisor_override)
    if convert.half_type_of(x) is not None:
        return convert.on_widened(avg_pool2d_forward, x, kernel_size, stride, padding, ceil_mode,
                                  count_include_pad, divisor_override)
    x_padded = _padded(x, padding, _padded_extent((H, W), kernel, stride, padding, dilation, out_hw), 0.0)
    total = xp.zeros((N, C) + out_hw, dtype=x.dtype)
    for r in range(kernel[0]):
        for s in range(kernel[1]):
            total += x_padded[(slice(None), slice(None)) + _tap_slices(r, s, stride, dilation, out_hw)]
    return total / _avg_divisor(xp, (H, W), kernel, stride, padding, out_hw, count_include_pad, divisor_override,
                                x.dtype)


def avg_pool2d_backward(dy: Any, x_shape: tuple, kernel_size: Any, stride: Any = None, padding: Any = 0,
                        ceil_mode: bool = False, count_include_pad: bool = True,
                        divisor_override: int | None = None) -> Any:
    """dx = ∂L/∂x: each dy entry divided by its divisor and spread over its window's input pixels.

    dy: (N, C, P, Q); x_shape: (N, C, H, W); returns dx: x_shape of dy's dtype.
    """
    N, C, H, W = _check_x_shape(x_shape)
    kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override = _avg_params(
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    out_hw = _output_hw((H, W), kernel, stride, padding, dilation, ceil_mode)
    _check_grad(dy, (N, C) + out_hw, "the pooling output for x_shape", half=True)
    if backend.is_cuda_array(dy):
        return _avg_pool2d_backward_gpu(dy, (N, C, H, W), kernel, stride, padding, count_include_pad,
                                        divisor_override)
    if convert.half_type_of(dy) is not None:
        return convert.on_widened(avg_pool2d_backward, dy, x_shape, kernel_size, stride, padding, ceil_mode,
                                  count_include_pad, divisor_override)
    xp = backend.get_array_module(dy)
    share = dy / _avg_divisor(xp, (H, W), kernel, stride, padding, out_hw, count_include_pad, divisor_override,
                              dy.dtype)
    extent = _padded_extent((H, W), kernel, stride, padding, dilation, out_hw)
    dx_padded = xp.zeros((N, C) + extent, dtype=dy.dtype)
    # Within one tap the output pixels read distinct input pixels, so a strided += is a scatter.
    for r in range(kernel[0]):
        for s in range(kernel[1]):
            dx_padded[(slice(None), slice(None)) + _tap_slices(r, s, stride, dilation, out_hw)] += share
    return xp.ascontiguousarray(dx_padded[:, :, padding[0]:padding[0] + H, padding[1]:padding[1] + W])


# ----------------------------------------------------------------------------------------------
# Adaptive average pooling
# ----------------------------------------------------------------------------------------------
def _adaptive_output_size(output_size: Any, hw: tuple[int, int]) -> tuple[int, int]:
    """int or (h, w), a None entry keeping that input size; each size at least 1."""
    values = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    if len(values) != 2 or not all(v is None or (isinstance(v, numbers.Integral) and not isinstance(v, bool))
                                   for v in values):
        raise TypeError(f"output_size must be an int or a pair of ints (or None), got {output_size!r}")
    sizes = tuple(hw[a] if values[a] is None else int(values[a]) for a in (0, 1))
    if min(sizes) < 1:
        raise ValueError(f"output_size must be >= 1, got {output_size!r}")
    return sizes  # type: ignore[return-value]


def _averaging_matrix(xp, size: int, out: int, dtype) -> Any:
    """(out, size) matrix whose row i averages input cells [floor(i·size/out), ceil((i+1)·size/out)).

    Averaging over a rectangle is separable, so adaptive pooling is A_h · x · A_wᵀ per plane: two
    GEMMs, however unequal or overlapping the windows are.
    """
    i = np.arange(out)
    starts = (i * size) // out
    ends = -((-(i + 1) * size) // out)  # ceil division in integers, exact for any size
    cells = np.arange(size)
    inside = (cells[None, :] >= starts[:, None]) & (cells[None, :] < ends[:, None])
    return xp.asarray(inside / (ends - starts)[:, None], dtype=dtype)


def adaptive_avg_pool2d_forward(x: Any, output_size: Any) -> Any:
    """Mean over windows that tile the input into ``output_size`` cells (PyTorch's adaptive_avg_pool2d).

    x: (N, C, H, W); output_size: int or (P, Q), a None entry keeping H or W; returns y: (N, C, P, Q)
    of x's dtype, channels-last for a channels-last x (computed on a C-contiguous copy).
    """
    key = _ready_key("adaptive_avg_pool2d_forward", x, output_size)
    ready = _ready_adaptive_forward.get(key)
    if ready is not None:
        return ready(x)[0]
    _check_input(x, half=True)
    if layout.is_channels_last(x):
        return layout.to_channels_last(adaptive_avg_pool2d_forward(layout.contiguous(x), output_size))
    xp = backend.get_array_module(x)
    H, W = x.shape[2:]
    P, Q = _adaptive_output_size(output_size, (H, W))
    if backend.is_cuda_array(x):
        with _cuda.recording() as launches:
            y = _adaptive_avg_pool2d_gpu("adaptive_avg_pool_forward", x, tuple(x.shape[:2]) + (P, Q), x.shape, (P, Q))
        _ready_adaptive_forward.keep(key, launches, (x,), (y,), (y,))
        return y
    if convert.half_type_of(x) is not None:
        return convert.on_widened(adaptive_avg_pool2d_forward, x, output_size)
    rows, cols = _averaging_matrix(xp, H, P, x.dtype), _averaging_matrix(xp, W, Q, x.dtype)
    # Columns first: one (N·C·H, W) × (W, Q) GEMM, then a batched (P, H) × (H, Q) per plane.
    return xp.matmul(rows, xp.matmul(x, cols.T))


# Repeated adaptive average pooling on the GPU (the array's steady key and the size argument) -> its launch
# (_cuda.ReadyCall): a network's global pooling is called once a step with the same shapes.
_ready_adaptive_forward = _cuda.ReadyCalls()
_ready_adaptive_backward = _cuda.ReadyCalls()


def _ready_key(name: str, array: Any, size: Any) -> tuple | None:
    """A ready call's key: the array's steady key and a size argument made of plain ints (and None); None for a call
    off the GPU or with any other size argument (which its checks judge)."""
    values = size if type(size) is tuple else (size,)
    if not backend.is_cuda_array(array) or not all(v is None or type(v) is int for v in values):
        return None
    key = _cuda.steady_key(name, array)
    return None if key is None else (*key, size)


def _check_adaptive_backward_arguments(dy: Any, x_shape: Any) -> tuple[int, int, int, int]:
    N, C, H, W = _check_x_shape(x_shape)
    check_float_or_half(dy, "grad_output")
    check_rank(dy, 4, "grad_output", "(N, C, P, Q)")
    if tuple(dy.shape[:2]) != (N, C) or min(dy.shape[2:]) < 1:
        raise ValueError(f"grad_output must have shape ({N}, {C}, P, Q) with P, Q >= 1 for x_shape "
                         f"{(N, C, H, W)}, got {tuple(dy.shape)}")
    return N, C, H, W


def adaptive_avg_pool2d_backward(dy: Any, x_shape: tuple) -> Any:
    """dx = ∂L/∂x = A_hᵀ · dy · A_w per plane, the output size read from dy.

    dy: (N, C, P, Q); x_shape: (N, C, H, W); returns dx: x_shape of dy's dtype.
    """
    key = _ready_key("adaptive_avg_pool2d_backward", dy, x_shape)
    ready = _ready_adaptive_backward.get(key)
    if ready is not None:
        return ready(dy)[0]
    N, C, H, W = _check_adaptive_backward_arguments(dy, x_shape)
    if backend.is_cuda_array(dy):
        with _cuda.recording() as launches:
            dx = _adaptive_avg_pool2d_gpu("adaptive_avg_pool_backward", dy, (N, C, H, W), (N, C, H, W), dy.shape[2:])
        _ready_adaptive_backward.keep(key, launches, (dy,), (dx,), (dx,))
        return dx
    if convert.half_type_of(dy) is not None:
        return convert.on_widened(adaptive_avg_pool2d_backward, dy, x_shape)
    xp = backend.get_array_module(dy)
    P, Q = dy.shape[2:]
    rows, cols = _averaging_matrix(xp, H, P, dy.dtype), _averaging_matrix(xp, W, Q, dy.dtype)
    return xp.ascontiguousarray(xp.matmul(rows.T, xp.matmul(dy, cols)))


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of pooling.cu, one launch per call (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
# The C struct PoolShape of pooling.cu: sixteen ints, in this order.
_POOL_SHAPE = np.dtype([(name, np.int32) for name in (
    "N", "C", "H", "W", "P", "Q", "kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w",
    "dilation_h", "dilation_w", "count_include_pad", "divisor_override")])


def _pool_shape(x_shape, out_hw, kernel=(1, 1), stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                count_include_pad=True, divisor_override=None) -> np.void:
    """The PoolShape struct argument; divisor_override None travels as 0 (0 itself is refused)."""
    for a, axis in enumerate(("height", "width")):
        # The kernels' int arithmetic stays below size + 2·padding + stride + span (pooling.cu).
        span = dilation[a] * (kernel[a] - 1) + 1
        if x_shape[2 + a] + 2 * padding[a] + stride[a] + span > _cuda.INT32_LIMIT:
            raise ValueError(f"pooling window (kernel_size {kernel}, stride {stride}, padding {padding}, dilation "
                             f"{dilation}) over an input {axis} of {x_shape[2 + a]} is too large for the GPU "
                             "kernels' 32-bit indexing")
    return _pool_shape_of((*x_shape, *out_hw, *kernel, *stride, *padding, *dilation, int(count_include_pad),
                           0 if divisor_override is None else divisor_override))


@functools.lru_cache(maxsize=256)
def _pool_shape_of(values: tuple[int, ...]) -> np.void:
    """The PoolShape struct of sixteen values, made once per set of values (a layer's every call passes the same);
    the launches only read it."""
    return np.array([tuple(_cuda.i32(v) for v in values)], dtype=_POOL_SHAPE)[0]


def _kernel(name: str, arrays: tuple) -> Any:
    """Kernel ``name`` of pooling.cu compiled for arrays[0]'s dtype (its half build for half storage), the
    arrays checked for 32-bit indexing."""
    _cuda.check_int32(*arrays)
    return _cuda.element_function("pooling.cu", name, convert.half_type_of(arrays[0]), arrays[0].dtype)


def _launch(name: str, count: int, arrays: tuple, shape: np.void) -> None:
    """Run kernel ``name`` of pooling.cu on ``count`` threads (grid-stride)."""
    _cuda.launch(_kernel(name, arrays), count, (*arrays, shape))


def _launch_by_planes(name: str, arrays: tuple, shape: np.void, channels_last: bool) -> None:
    """Run max-pool backward kernel ``name`` of pooling.cu over dx (``shape``'s N, C, H, W): a thread per
    position of a plane, an H × W plane of an (n, c) (channels-last: an H × W × C image), in blocks of a warp or more
    of them, up to _cuda.THREADS, and as many rows of blocks over the N·C planes (the N images) as fill the GPU
    (_cuda.max_blocks), each looping over its share; an empty batch makes no rows, which _cuda.launch_blocks does
    not launch."""
    N, C, H, W = (int(shape[axis]) for axis in "NCHW")
    positions, planes = (H * W * C, N) if channels_last else (H * W, N * C)
    threads = min(_cuda.THREADS, -(-positions // 32) * 32)
    blocks = -(-positions // threads)
    rows = min(planes, _cuda.MAX_GRID_Y, -(-_cuda.max_blocks() // blocks))
    _cuda.launch_blocks(_kernel(name + ("_last" if channels_last else ""), arrays), (blocks, rows), threads,
                        (*arrays, shape))


def _max_pool2d_forward_gpu(x, kernel, stride, padding, dilation, out_hw, taps: bool) -> tuple[Any, Any]:
    """y and its record, both in x's layout (a RawKernel sees only the base pointer: any other x is copied
    C-contiguous first)."""
    cupy = backend.cupy()
    last = layout.is_channels_last(x)
    x = layout.flat(x) if last else cupy.ascontiguousarray(x)
    N, C = (x.shape[0], x.shape[3]) if last else x.shape[:2]
    out_shape = (N, C) + tuple(out_hw)
    y = layout.empty(out_shape, x.dtype, cupy, last)
    indices = layout.empty(out_shape, cupy.uint8 if taps else cupy.int64, cupy, last)
    x_shape = (N, C, *(x.shape[1:3] if last else x.shape[2:]))
    _launch(("max_pool_forward_taps" if taps else "max_pool_forward") + ("_last" if last else ""), y.size,
            (x, layout.flat(y), layout.flat(indices)), _pool_shape(x_shape, out_hw, kernel, stride, padding, dilation))
    return y, indices


def _max_pool2d_backward_gpu(dy, indices, x_shape, window, dy_other=None) -> Any:
    """dx in dy's layout (channels-last only with the window parameters: max_pool2d_backward copies otherwise);
    ``indices`` and ``dy_other`` (given only with the window parameters) laid out as dy for the kernels."""
    cupy = backend.cupy()
    last = layout.is_channels_last(dy)
    if last:
        indices = layout.to_channels_last(indices)
        dy_other = None if dy_other is None else layout.to_channels_last(dy_other)
    else:
        dy, indices = cupy.ascontiguousarray(dy), layout.contiguous(indices)
        dy_other = None if dy_other is None else cupy.ascontiguousarray(dy_other)
    out_hw = tuple(dy.shape[2:])
    if indices.dtype != cupy.uint8:
        indices = indices.astype(cupy.int64, copy=False)  # no copy for max_pool2d_forward's own
    if window is None:
        # One thread per plane adds into a zeroed dx (see max_pool_backward_serial).
        dx = cupy.zeros(x_shape, dtype=dy.dtype)
        _launch("max_pool_backward_serial", x_shape[0] * x_shape[1], (dy, indices, dx), _pool_shape(x_shape, out_hw))
        return dx
    kernel, stride, padding, dilation, _ = window
    dx = layout.empty(x_shape, dy.dtype, cupy, last)
    name = ("max_pool_backward_taps" if indices.dtype == cupy.uint8 else "max_pool_backward") + \
        ("" if dy_other is None else "_sum")
    gradients = (dy,) if dy_other is None else (dy, dy_other)
    _launch_by_planes(name, (*map(layout.flat, gradients), layout.flat(indices), layout.flat(dx)),
                      _pool_shape(x_shape, out_hw, kernel, stride, padding, dilation), last)
    return dx


def _avg_pool2d_forward_gpu(x, kernel, stride, padding, out_hw, count_include_pad, divisor_override) -> Any:
    cupy = backend.cupy()
    x = layout.contiguous(x)
    y = cupy.empty(tuple(x.shape[:2]) + tuple(out_hw), dtype=x.dtype)
    _launch("avg_pool_forward", y.size, (x, y),
            _pool_shape(x.shape, out_hw, kernel, stride, padding, (1, 1), count_include_pad, divisor_override))
    return y


def _avg_pool2d_backward_gpu(dy, x_shape, kernel, stride, padding, count_include_pad, divisor_override) -> Any:
    cupy = backend.cupy()
    dy = layout.contiguous(dy)
    dx = cupy.empty(x_shape, dtype=dy.dtype)
    _launch("avg_pool_backward", dx.size, (dy, dx),
            _pool_shape(x_shape, dy.shape[2:], kernel, stride, padding, (1, 1), count_include_pad, divisor_override))
    return dx


def _adaptive_avg_pool2d_gpu(name: str, source: Any, target_shape: tuple, x_shape: tuple, out_hw: tuple) -> Any:
    """Forward (source x, target y) or backward (source dy, target dx) of adaptive average pooling.

    The kernels' window bounds multiply an axis size by its output size; the 32-bit build serves
    whenever (size + 1)·(out + 1) fits in an int on both axes, else the slower 64-bit one.
    """
    cupy = backend.cupy()
    source = layout.contiguous(source)
    target = cupy.empty(target_shape, dtype=source.dtype)
    (H, W), (P, Q) = x_shape[2:], out_hw
    narrow = max((H + 1) * (P + 1), (W + 1) * (Q + 1)) <= _cuda.INT32_LIMIT
    _launch(name if narrow else name + "_wide", target.size, (source, target), _pool_shape(x_shape, out_hw))
    return target
