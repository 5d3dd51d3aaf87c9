"""Fully connected layer and bias primitives.

linear      y = x·weightᵀ + bias    x: (..., in_features), weight: (out_features, in_features)
bias_add    y + bias broadcast along one axis (axis 1 for NCHW convolutions, -1 for linear)

Every product flattens the leading dimensions of x into one batch axis M, so each direction is a
single 2-D GEMM (one BLAS call; on the GPU its compute type honours the TF32 switch), not a
batched matmul over the leading dimensions:

    forward          Y (M × out) = X (M × in) · Wᵀ
    backward-data    dX (M × in) = dY (M × out) · W
    backward-weight  dW (out × in) = dYᵀ (out × M) · X

The GEMMs go through :mod:`.blas` (BLAS on the CPU, cuBLAS on the GPU, capturable in a CUDA graph)
and the bias kernels are our own (linear.cu):
bias_add is one element-wise kernel (in place after the forward GEMM), bias_backward a
deterministic per-channel reduction accumulated in float64, in one launch.
"""
from __future__ import annotations

import math
from typing import Any

from .. import backend
from . import _cuda, blas, convert, layout
from ._checks import check_float, check_float_or_half, check_out, check_same_dtype, normalise_axis

# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def _check_features(a: Any, name: str, layout: str, half: bool = False) -> None:
    """a must be a float array (or, with ``half``, a half-precision one) of rank >= 1, laid out as ``layout``
    (e.g. ``"(..., in_features)"``). The public functions pass ``half`` for half arrays; the naive engine's,
    which share these checks with their defaults, take no half precision."""
    (check_float_or_half if half else check_float)(a, name)
    if a.ndim < 1:
        raise ValueError(f"linear: {name} must be at least 1-D {layout}, got a 0-D array")


def _check_weight(weight: Any, half: bool = False) -> None:
    (check_float_or_half if half else check_float)(weight, "weight")
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")


def _check_bias(bias: Any, x: Any, out_features: int, half: bool = False) -> None:
    """bias must be an (out_features,) array of x's dtype."""
    (check_float_or_half if half else check_float)(bias, "bias")
    if tuple(bias.shape) != (out_features,):
        raise ValueError(f"linear: bias must have shape (out_features,) = ({out_features},), got {tuple(bias.shape)}")
    check_same_dtype(x, bias, "x", "bias")


def _as_rows(a: Any) -> Any:
    """(..., F) -> (M, F) with M = prod(leading dims): free for contiguous arrays."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


# ----------------------------------------------------------------------------------------------
# Linear
# ----------------------------------------------------------------------------------------------


# Each public function checks its arguments with the helper named after it; the naive engine
# checks with the same helpers (one implementation of every check).
def _check_forward_arguments(x: Any, weight: Any, bias: Any, half: bool = False) -> None:
    backend.get_array_module(x, weight, bias)  # one device for all
    _check_features(x, "x", "(..., in_features)", half)
    _check_weight(weight, half)
    check_same_dtype(x, weight, "x", "weight")
    out_features, in_features = weight.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"linear: x has in_features={x.shape[-1]} (shape {tuple(x.shape)}) but weight "
                         f"expects in_features={in_features} (shape {tuple(weight.shape)})")
    if bias is not None:
        _check_bias(bias, x, out_features, half)


def _check_backward_data_arguments(dy: Any, weight: Any, half: bool = False) -> None:
    backend.get_array_module(dy, weight)
    _check_features(dy, "dy", "(..., out_features)", half)
    _check_weight(weight, half)
    check_same_dtype(dy, weight, "dy", "weight")
    if dy.shape[-1] != weight.shape[0]:
        raise ValueError(f"linear: dy has out_features={dy.shape[-1]} (shape {tuple(dy.shape)}) but weight "
                         f"has out_features={weight.shape[0]} (shape {tuple(weight.shape)})")


def _check_backward_weight_arguments(x: Any, dy: Any, half: bool = False) -> None:
    backend.get_array_module(x, dy)
    _check_features(x, "x", "(..., in_features)", half)
    _check_features(dy, "dy", "(..., out_features)", half)
    check_same_dtype(x, dy, "x", "dy")
    if tuple(x.shape[:-1]) != tuple(dy.shape[:-1]):
        raise ValueError(f"linear: x {tuple(x.shape)} and dy {tuple(dy.shape)} must have the same leading "
                         f"dimensions (..., in_features) and (..., out_features)")


def _check_bias_add_arguments(y: Any, bias: Any, axis: Any, out: Any = None, half: bool = False) -> int:
    """Returns the axis as a non-negative index."""
    backend.get_array_module(y, bias, out)
    check = check_float_or_half if half else check_float
    check(y, "y")
    if y.ndim < 1:
        raise ValueError("bias_add: y must be at least 1-D, got a 0-D array")
    axis = normalise_axis(axis, y.ndim, "y")
    check(bias, "bias")
    if tuple(bias.shape) != (y.shape[axis],):
        raise ValueError(f"bias must have shape ({y.shape[axis]},) (y.shape[{axis}] of y with shape "
                         f"{tuple(y.shape)}), got {tuple(bias.shape)}")
    check_same_dtype(y, bias, "y", "bias")
    if out is not None:
        check_out(out, y, "y")
    return axis


def _check_bias_backward_arguments(dy: Any, axis: Any, half: bool = False) -> int:
    (check_float_or_half if half else check_float)(dy, "dy")
    if dy.ndim < 1:
        raise ValueError("bias_backward: dy must be at least 1-D, got a 0-D array")
    return normalise_axis(axis, dy.ndim, "dy")


def linear_forward(x: Any, weight: Any, bias: Any = None) -> Any:
    """y = x·weightᵀ + bias.

    x: (..., in_features); weight: (out_features, in_features); bias: (out_features,) or None.
    Returns y: (..., out_features) of x's dtype. In half precision (float16 or bfloat16 arrays, all one
    type) the GEMM sums in float32 and rounds once; the bias is added in float32 and rounded again.
    """
    key, ready = _ready_call("linear_forward", x, weight, bias)
    if ready is not None:
        return ready(x, weight, bias)
    half = convert.half_type_of(x)
    _check_forward_arguments(x, weight, bias, half is not None)
    rows = _as_rows(backend.get_array_module(x).ascontiguousarray(x))
    y = product = blas.gemm(rows, weight.T)
    if bias is not None:
        if half is not None:
            y = bias_add(y, bias, 1, out=y)
        elif backend.is_cuda_array(y):
            y = _bias_add_gpu(y, bias, 1, out=y)
        else:
            y += bias
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    _keep_ready(key, half, (x, weight, bias), (rows, weight.T, product), y, bias is not None)
    return y


def linear_backward_data(dy: Any, weight: Any) -> Any:
    """dx = dy·weight.

    dy: (..., out_features); weight: (out_features, in_features). Returns dx: (..., in_features).
    """
    key, ready = _ready_call("linear_backward_data", dy, weight)
    if ready is not None:
        return ready(dy, weight)
    half = convert.half_type_of(dy)
    _check_backward_data_arguments(dy, weight, half is not None)
    xp = backend.get_array_module(dy, weight)
    rows = _as_rows(xp.ascontiguousarray(dy))
    product = blas.gemm(rows, weight)
    dx = product.reshape(*dy.shape[:-1], weight.shape[1])
    _keep_ready(key, half, (dy, weight), (rows, weight, product), dx, False)
    return dx


def linear_backward_weight(x: Any, dy: Any) -> Any:
    """dweight = Σ over every leading index of dy ⊗ x.

    x: (..., in_features); dy: (..., out_features) with the same leading dimensions.
    Returns dweight: (out_features, in_features) of x's dtype.
    """
    key, ready = _ready_call("linear_backward_weight", x, dy)
    if ready is not None:
        return ready(dy, x)
    half = convert.half_type_of(x)
    _check_backward_weight_arguments(x, dy, half is not None)
    xp = backend.get_array_module(x, dy)
    dy_rows, x_rows = _as_rows(xp.ascontiguousarray(dy)), _as_rows(xp.ascontiguousarray(x))
    dweight = blas.gemm(dy_rows.T, x_rows)
    _keep_ready(key, half, (x, dy), (dy_rows.T, x_rows, dweight), dweight, False)
    return dweight


# ----------------------------------------------------------------------------------------------
# The steady state on the GPU
# ----------------------------------------------------------------------------------------------
# A call seen before (its _cuda.steady_key: the direction, and of each array its type, shape, strides, dtype, GPU and
# address modulo 16; and the TF32 switch) -> its ready form (_Ready): a repeat of a training step's call neither checks
# nor works out its GEMM again. Kept for float32 and float64 calls whose arrays were all C-contiguous (the GEMM then
# reads them where they are); emptied when it reaches _MOST_READY keys.
_ready: dict[tuple, "_Ready"] = {}
_MOST_READY = 256


class _Ready:
    """One linear call's GEMM (blas.ReadyGemm) and bias launch (a PackedLaunch of bias_add, in place), worked out once:
    a repeat allocates its output and launches them."""

    __slots__ = ("gemm", "bias_add", "shape", "dtype", "empty")

    def __init__(self, gemm: Any, bias_add: Any, shape: tuple, dtype: Any, empty: Any) -> None:
        self.gemm, self.bias_add, self.shape, self.dtype, self.empty = gemm, bias_add, shape, dtype, empty

    def __call__(self, a: Any, b: Any, bias: Any = None) -> Any:
        """The GEMM's operands in its order (the arrays the call was keyed by), and the bias when there is one."""
        out = self.empty(self.shape, dtype=self.dtype)
        self.gemm(a.data.ptr, b.data.ptr, out.data.ptr)
        if self.bias_add is not None:
            self.bias_add(out, bias, out)
        return out


def _ready_call(direction: str, *arrays: Any) -> tuple[tuple | None, "_Ready | None"]:
    """(the call's steady-state key, its ready form or None); (None, None) for a call off the GPU."""
    if not backend.is_cuda_array(arrays[0]):
        return None, None
    key = _cuda.steady_key(direction, *arrays)
    if key is None:
        return None, None
    key = (key, _cuda.allow_tf32())
    return key, _ready.get(key)


def _keep_ready(key: tuple | None, half: str | None, arrays: tuple, operands: tuple, out: Any, with_bias: bool) -> None:
    """Keep the ready form of a checked call (see ``_ready``): ``arrays`` the call's, ``operands`` the GEMM's (a, b and
    its output, views of C-contiguous arrays), ``out`` what it returned."""
    if key is None or half is not None or not all(a is None or a.flags.c_contiguous for a in arrays) \
            or out.size == 0 or 0 in operands[0].shape:
        return
    cupy = backend.cupy()
    bias_add = None
    if with_bias:
        out_features = out.shape[-1]
        P = _cuda.PER_CALL
        bias_add = _cuda.PackedLaunch(_kernel("bias_add", out), (_cuda.grid_stride_blocks(out.size),), (_cuda.THREADS,),
                                      (P, P, P, _cuda.i32(out_features), _cuda.i32(1), _cuda.i32(out.size)))
    if len(_ready) >= _MOST_READY:
        _ready.clear()
    _ready[key] = _Ready(blas.ReadyGemm(*operands), bias_add, tuple(out.shape), out.dtype, cupy.empty)


# ----------------------------------------------------------------------------------------------
# Bias
# ----------------------------------------------------------------------------------------------


def _channels_last_axis(y: Any, axis: Any) -> bool:
    """Whether ``axis`` of y is the channel axis of a channels-last y, the last one of its buffer."""
    return axis in (1, -3) and layout.is_channels_last(y)


def bias_add(y: Any, bias: Any, axis: int = 1, out: Any = None) -> Any:
    """y + bias, with bias broadcast along ``axis`` of y: a new array, or written into ``out``
    (``out`` may be y itself: the bias added in place, with no copy of the output).

    y: any shape with rank >= 1; bias: (y.shape[axis],) of y's dtype. axis = 1 for (N, C, H, W),
    -1 for (..., out_features). Half-precision arrays are added in float32 and rounded once (on the GPU in
    linear.cu's half build, one pass; on NumPy by widening).
    """
    if _channels_last_axis(y, axis) and (out is None or layout.is_channels_last(out)):
        # The channels are the buffer's last axis: one bias per element of each (N·H·W, C) row.
        return bias_add(layout.buffer(y), bias, -1, None if out is None else layout.buffer(out)).transpose(
            layout.TO_VIEW)
    half = convert.half_type_of(y)
    axis = _check_bias_add_arguments(y, bias, axis, out, half is not None)
    if half is not None and not backend.is_cuda_array(y):
        xp = backend.get_array_module(y)
        wide = convert.half_to_float(xp.ascontiguousarray(y), half)
        bias_add(wide, convert.half_to_float(xp.ascontiguousarray(bias), half), axis, out=wide)
        return convert.float_to_half(wide, half, out=out)
    if backend.is_cuda_array(y):
        return _bias_add_gpu(backend.cupy().ascontiguousarray(y), bias, axis, out)
    broadcast = [1] * y.ndim
    broadcast[axis] = -1
    return backend.get_array_module(y).add(y, bias.reshape(broadcast), out=out)


def bias_backward(dy: Any, axis: int = 1) -> Any:
    """dbias = Σ dy over every axis except ``axis``.

    dy: any shape with rank >= 1. Returns dbias: (dy.shape[axis],) of dy's dtype. The sum is
    accumulated in float64 and rounded once, as a per-channel sum over a whole batch can hold
    millions of terms. Half precision: that float64 sum of the exact values, rounded to float32 and then to dy's
    type (what the float32 primitive on the widened dy gives; on the GPU in linear.cu's half build).
    """
    if _channels_last_axis(dy, axis):
        return bias_backward(layout.buffer(dy), -1)
    key = _cuda.steady_key("bias_backward", dy) if type(axis) is int and backend.is_cuda_array(dy) else None
    ready = _ready_bias_backward.get(None if key is None else (*key, axis))
    if ready is not None:
        return ready(dy, _cuda.block_counters(dy, 0))[0]  # the GPU's counters, as many as the kept call's or more
    xp = backend.get_array_module(dy)
    half = convert.half_type_of(dy)
    checked_axis = _check_bias_backward_arguments(dy, axis, half is not None)
    if half is not None and not backend.is_cuda_array(dy):
        return convert.on_widened(bias_backward, xp.ascontiguousarray(dy), checked_axis)
    if backend.is_cuda_array(dy):
        with _cuda.recording() as launches:
            dbias, made = _bias_backward_gpu(dy, checked_axis)
        inputs = (dy, _cuda.block_counters(dy, 0))  # the counters the launch took: the GPU's largest array
        _ready_bias_backward.keep(None if key is None else (*key, axis), launches, inputs, made, (dbias,))
        return dbias
    others = tuple(a for a in range(dy.ndim) if a != checked_axis)
    return xp.sum(dy, axis=others, dtype=xp.float64).astype(dy.dtype)


# ----------------------------------------------------------------------------------------------
# GPU: the bias kernels of linear.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
_SOURCE = "linear.cu"
# Per-channel sums run on (channel blocks, splits) grids: aim at about as many 256-thread blocks as
# the GPU holds at once (_cuda.reduction_split), with enough work per block that its fixed cost (the tree
# sum, the partial write) stays small: 4096 values per (channel, split) block, 64 rows per
# (32-column, split) block.
_MIN_ROWS_PER_BLOCK = 64


def _outer_channel_inner(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """The (outer, C, inner) view of a contiguous array around its bias axis."""
    return math.prod(shape[:axis]), int(shape[axis]), math.prod(shape[axis + 1:])


def _kernel(name: str, array: Any) -> Any:
    """linear.cu's kernel ``name`` for ``array``'s dtype, or its half build for half storage."""
    return _cuda.element_function(_SOURCE, name, convert.half_type_of(array), array.dtype)


def _bias_add_gpu(y: Any, bias: Any, axis: int, out: Any = None) -> Any:
    """One element-wise launch into ``out`` (a new array when None; y itself for an in-place add)."""
    xp = backend.get_array_module(y)
    y = y if y.flags.c_contiguous else xp.ascontiguousarray(y)  # a RawKernel sees only the base pointer
    bias = bias if bias.flags.c_contiguous else xp.ascontiguousarray(bias)
    _cuda.check_int32(y)
    out = xp.empty(y.shape, dtype=y.dtype) if out is None else out
    _, channels, inner = _outer_channel_inner(tuple(y.shape), axis)
    _cuda.launch(_kernel("bias_add", y), y.size,
                 (y, bias, out, _cuda.i32(channels), _cuda.i32(inner), _cuda.i32(y.size)))
    return out


# A repeated bias_backward on the GPU (its dy's steady key and axis) -> its launch (_cuda.ReadyCall), made with
# (dy, the GPU's block counters) as its inputs.
_ready_bias_backward = _cuda.ReadyCalls()


def _counter_count(dy: Any, axis: int) -> int:
    """How many "last block done" counters dy's reduction uses: one per channel, or per block of 32 channels
    for (rows, C) arrays."""
    _, channels, inner = _outer_channel_inner(tuple(dy.shape), axis)
    return -(-channels // 32) if inner == 1 else channels


def _bias_backward_gpu(dy: Any, axis: int) -> tuple[Any, tuple]:
    """One launch: per-(channels, split) float64 partial sums, the last block of each channel adding its splits in
    a fixed order and rounding once to dy's dtype. Returns (dbias, the arrays it allocated)."""
    xp = backend.get_array_module(dy)
    dy = dy if dy.flags.c_contiguous else xp.ascontiguousarray(dy)
    _cuda.check_int32(dy)
    outer, channels, inner = _outer_channel_inner(tuple(dy.shape), axis)
    dbias = xp.empty(channels, dtype=dy.dtype)
    if channels == 0:
        return dbias, (dbias,)
    i32 = _cuda.i32
    counters = _cuda.block_counters(dy, _counter_count(dy, axis))
    if inner == 1:
        # dy is (rows, C): a warp reads 32 consecutive channels of a row (coalesced).
        column_blocks = -(-channels // 32)
        splits, per = _cuda.reduction_split(column_blocks, outer, _MIN_ROWS_PER_BLOCK)
        partial = xp.empty((splits, channels), dtype=xp.float64)
        _cuda.launch_blocks(_kernel("bias_grad_columns", dy), (column_blocks, splits),
                            _cuda.THREADS, (dy, partial, counters, dbias, i32(outer), i32(channels), i32(per)))
    else:
        # Planes of `inner` contiguous values: a block per (channel, split).
        splits, per = _cuda.reduction_split(channels, outer * inner)
        partial = xp.empty((splits, channels), dtype=xp.float64)
        _cuda.launch_blocks(_kernel("bias_grad_planes", dy), (channels, splits),
                            _cuda.THREADS, (dy, partial, counters, dbias, i32(outer), i32(channels), i32(inner),
                                            i32(per)))
    return dbias, (partial, dbias)
