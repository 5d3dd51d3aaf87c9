"""Memory layouts of (N, C, H, W) arrays: C-contiguous, or channels-last (PyTorch's ``channels_last``).

A channels-last array is an (N, C, H, W) view of an (N, H, W, C) C-contiguous buffer: its strides put the
channels innermost, so a kernel that reads it as that buffer finds 8 half-precision channels of one pixel in
16 contiguous bytes. The array keeps the (N, C, H, W) shape every primitive takes; only its strides say the
layout. A primitive that keeps layouts returns its output in its input's layout (PyTorch's rule): with a
kernel of its own for channels-last buffers, or by running on C-contiguous copies and laying the result out
again (:func:`like`). An array whose two layouts coincide (C = 1, or H = W = 1) counts as C-contiguous.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import numpy as np

from .. import backend
from . import _cuda

# The axis orders between the (N, C, H, W) view and the (N, H, W, C) buffer.
TO_BUFFER = (0, 2, 3, 1)
TO_VIEW = (0, 3, 1, 2)


def is_channels_last(array: Any) -> bool:
    """True for a 4-D array that is an (N, C, H, W) view of an (N, H, W, C) C-contiguous buffer (the strides of
    that buffer's transpose) and not C-contiguous itself. Asked on every call of the primitives that keep
    layouts: strides compared, no view made."""
    if getattr(array, "ndim", 0) != 4:
        return False
    strides, item = array.strides, array.itemsize
    if strides[1] != item:  # the channels not innermost: the answer for nearly every array, from one read
        return False
    N, C, H, W = array.shape
    # Those strides with C = 1, H = W = 1 or no elements are also C-contiguous (an axis of length 1 has any stride).
    return strides == (H * W * C * item, item, W * C * item, C * item) and C != 1 and H * W != 1 and N * C * H * W != 0


def coincide(shape: Sequence[int]) -> bool:
    """Whether the two layouts of an (N, C, H, W) shape are one memory order (C = 1, or H = W = 1)."""
    return shape[1] == 1 or shape[2] * shape[3] == 1


def same_order(a: Any, b: Any) -> bool:
    """Whether two arrays of one shape and item size hold their elements in one memory order: equal strides on
    every axis longer than 1 (an axis of length 1 moves nowhere, so its stride is anything)."""
    return a.shape == b.shape and (a.strides == b.strides or all(
        n == 1 or p == q for n, p, q in zip(a.shape, a.strides, b.strides)))


def buffer(array: Any) -> Any:
    """The C-contiguous (N, H, W, C) buffer of a channels-last array (a view, no copy)."""
    return array.transpose(TO_BUFFER)


def flat(array: Any) -> Any:
    """What a kernel walking memory in order is given: a channels-last array's buffer, any other array itself."""
    return buffer(array) if is_channels_last(array) else array


def empty(shape: Sequence[int], dtype: Any, xp: Any, channels_last: bool) -> Any:
    """A new (N, C, H, W) array of ``shape``: channels-last when asked (and the shape is 4-D), else C-contiguous."""
    if channels_last and len(shape) == 4:
        N, C, H, W = shape
        return xp.empty((N, H, W, C), dtype=dtype).transpose(TO_VIEW)
    return xp.empty(tuple(shape), dtype=dtype)


def to_channels_last(array: Any) -> Any:
    """``array`` laid out channels-last (itself when it already is, or when its layouts coincide). On the GPU a
    C-contiguous array goes through layout.cu's transpose (one pass; CuPy's strided copy is several times slower)."""
    if array.ndim != 4 or is_channels_last(array) or (array.flags.c_contiguous and coincide(array.shape)):
        return array
    xp = backend.get_array_module(array)
    if xp is not np and array.flags.c_contiguous and array.itemsize in (2, 4, 8):
        N, C, H, W = array.shape
        out = xp.empty((N, H, W, C), dtype=array.dtype)
        transpose_planes(array, out, C, H * W)
        return out.transpose(TO_VIEW)
    return xp.ascontiguousarray(array.transpose(TO_BUFFER)).transpose(TO_VIEW)


def contiguous(array: Any) -> Any:
    """``array`` C-contiguous (itself when it is); a channels-last one on the GPU through layout.cu's transpose."""
    if array.flags.c_contiguous:
        return array
    xp = backend.get_array_module(array)
    if xp is not np and is_channels_last(array) and array.itemsize in (2, 4, 8):
        N, C, H, W = array.shape
        out = xp.empty(array.shape, dtype=array.dtype)
        transpose_planes(buffer(array), out, H * W, C)
        return out
    return xp.ascontiguousarray(array)


def copy_into(out: Any, source: Any) -> None:
    """out[...] = source, for a channels-last ``out`` and a C-contiguous ``source`` on the GPU through layout.cu's
    transpose into out's buffer."""
    if is_channels_last(out) and source.flags.c_contiguous and source.itemsize in (2, 4, 8) \
            and backend.get_array_module(out) is not np:
        N, C, H, W = out.shape
        transpose_planes(source, buffer(out), C, H * W)
    else:
        out[...] = source


# Below this many rows or columns a matrix is narrow: a 32 x 32 tile of it would hold mostly nothing (layout.cu).
NARROW = 16


def transpose_planes(source: Any, out: Any, rows: int, cols: int) -> None:
    """out (N, cols, rows) = each image of C-contiguous ``source`` (N, rows, cols) transposed, on the GPU:
    (N, C, H·W) -> (N, H·W, C) with rows = C, or back with rows = H·W. Words of the arrays' item size."""
    images = source.size // max(rows * cols, 1)
    if images == 0 or rows == 0 or cols == 0:
        return
    _cuda.check_int32(source)
    name, grid, threads = transpose_launch(rows, cols, images, source.itemsize, _cuda.max_blocks())
    arguments = (source, out, _cuda.i32(rows), _cuda.i32(cols))
    if name.startswith("transpose_narrow"):  # its grid-stride loop over the images needs their count
        arguments += (_cuda.i32(images),)
    _cuda.launch_blocks(_cuda.function("layout.cu", name, np.float32), grid, threads, arguments)


def transpose_launch(rows: int, cols: int, images: int, itemsize: int, max_blocks: int
                     ) -> tuple[str, tuple[int, int, int] | tuple[int, int], int]:
    """The kernel, grid and block size of :func:`transpose_planes`: 32 x 32 tiles, one block each, for a wide
    matrix; for a narrow one (rows or cols under NARROW) single words in grid-stride loops, as many blocks as fill
    ``max_blocks``, shared by the images."""
    if min(rows, cols) >= NARROW:
        return f"transpose_planes_{itemsize}", (-(-cols // 32), -(-rows // 32), images), _cuda.THREADS
    plane_blocks = -(-rows * cols // _cuda.THREADS)
    image_rows = min(images, _cuda.MAX_GRID_Y)
    return f"transpose_narrow_{itemsize}", (max(1, min(plane_blocks, max_blocks // image_rows)), image_rows), \
        _cuda.THREADS


def filter_to_channels_last(w: Any, out: Any, turned: bool, groups: int) -> None:
    """On the GPU: w (K, C/G, R, S) -> out (K, R, S, C/G), or turned (C, R, S, K/G) with r and s reversed, each
    group's filter turned on its own (G, C/G, R, S, K/G). w is read at its strides, so any layout or strided view
    of one (a phase w[:, :, a::u, b::v] of a strided filter) is copied in the one pass. Words of w's item size (2 or
    4 bytes), layout.cu's filter_to_channels_last."""
    K, group_channels, R, S = w.shape
    kernel = _cuda.function("layout.cu", f"filter_to_channels_last_{w.itemsize}", np.float32)
    _cuda.launch(kernel, w.size, (w, out, _cuda.i32(K), _cuda.i32(group_channels), _cuda.i32(R), _cuda.i32(S),
                                  _cuda.i32(turned), _cuda.i32(groups), *_element_strides(w)))


def _element_strides(array: Any) -> list[np.int64]:
    """``array``'s strides in elements, as layout.cu's kernels that read an array at its strides take them."""
    return [np.int64(stride // array.itemsize) for stride in array.strides]


def to_channels_last_padded(array: Any, out: Any) -> None:
    """out (N, H, W, C') = ``array`` (N, C, H, W) of any layout, each pixel's C channels followed by C' − C zeros:
    a channels-last copy whose pixels fill whole 16-byte vectors, for kernels that copy 16 bytes at a time (the 3
    colour channels of a first layer). Also a filter's (K, C, R, S) -> (K, R, S, C'). Words are copied as they are
    (float16 values into a workspace of 16-bit words keep their bits). ``out`` C-contiguous. On the GPU one pass of
    layout.cu's pad_pixels (a pixel's 16 bytes one vector, where C' words are 16 bytes and out is 16-byte aligned) or
    pad_channels_last (one word a thread), which read ``array`` at its strides and write the zeros with the values;
    in NumPy two, the whole of ``out`` zeroed, then the channels."""
    if backend.get_array_module(out) is not np and array.itemsize == out.itemsize and array.itemsize in (2, 4):
        _, C, H, W = array.shape
        _cuda.check_int32(out)
        strides = _element_strides(array)
        if out.shape[-1] * out.itemsize == _cuda.PACK_BYTES and out.data.ptr % _cuda.PACK_BYTES == 0:
            kernel = _cuda.function("layout.cu", f"pad_pixels_{array.itemsize}", np.float32)
            pixels = out.size // out.shape[-1]
            _cuda.launch(kernel, pixels, (array, out, _cuda.i32(pixels), _cuda.i32(C), _cuda.i32(H), _cuda.i32(W),
                                          *strides))
            return
        kernel = _cuda.function("layout.cu", f"pad_channels_last_{array.itemsize}", np.float32)
        _cuda.launch(kernel, out.size, (array, out, _cuda.i32(out.size), _cuda.i32(C), _cuda.i32(out.shape[-1]),
                                        _cuda.i32(H), _cuda.i32(W), *strides))
        return
    channels, source = array.shape[1], array.transpose(TO_BUFFER)
    out.fill(0)
    out[..., :channels] = source if source.dtype == out.dtype else source.view(out.dtype)


def leads_channels_last(operands: Sequence[Any]) -> bool:
    """Whether an element-wise result of ``operands`` is channels-last by PyTorch's rule: where the first 4-D operand
    whose two layouts differ (:func:`coincide`) is (None, scalars and arrays of other ranks have no say)."""
    lead = next((a for a in operands if getattr(a, "ndim", 0) == 4 and not coincide(a.shape)), None)
    return lead is not None and is_channels_last(lead)


def elementwise(function: Callable[..., Any], *operands: Any) -> Any:
    """``function(*operands)``, an element-wise operation of the array module (an operator, a ufunc, ``where``),
    with its result laid out as PyTorch lays one out: channels-last where the first 4-D operand whose two layouts
    differ (:func:`coincide`) is channels-last, as the operation computes it otherwise. CuPy's element-wise kernels
    write a new C-contiguous array and walk their inputs in its order, which crosses a channels-last array's strides
    on every step (and NumPy's keep a layout only where the operands agree): here every operand goes in as its
    (N, H, W, C) view, one of fewer dimensions first given leading axes of 1 as broadcasting would, so that the
    result is an (N, H, W, C) buffer written in memory order, returned as its channels-last view. Scalars and
    operands of more than 4 dimensions are left as they are (the latter: no layout of ours)."""
    if not leads_channels_last(operands) or any(getattr(a, "ndim", 0) > 4 for a in operands):
        return function(*operands)
    return function(*map(_buffer_view, operands)).transpose(TO_VIEW)


def _buffer_view(operand: Any) -> Any:
    """An operand of an element-wise operation on channels-last buffers: a scalar as it is, an array of 1 to 4
    dimensions given leading axes of 1 up to 4 (broadcasting's alignment), then its (N, H, W, C) view."""
    dimensions = getattr(operand, "ndim", 0)
    if dimensions == 0:
        return operand
    if dimensions < 4:
        operand = operand.reshape((1,) * (4 - dimensions) + tuple(operand.shape))
    return operand.transpose(TO_BUFFER)


def add(a: Any, b: Any) -> Any:
    """a + b (:func:`elementwise`): two channels-last arrays are added as their (N, H, W, C) buffers, one pass in
    memory order, and the sum stays channels-last (as NumPy's and PyTorch's do)."""
    return elementwise(operator.add, a, b)


def write_channels_last(out: Any, write: Callable[[Any], None]) -> None:
    """``write(target)`` for a kernel that writes a channels-last (N, C, H, W) array: ``out`` itself where it is
    channels-last (or its two layouts coincide), else a channels-last temporary laid out as ``out`` afterwards."""
    if is_channels_last(out) or coincide(out.shape):
        write(out)
        return
    result = empty(out.shape, out.dtype, backend.get_array_module(out), True)
    write(result)
    out[...] = contiguous(result)


def like(result: Any, channels_last: bool) -> Any:
    """``result`` in the layout asked for: channels-last, or C-contiguous."""
    return to_channels_last(result) if channels_last else contiguous(result)


def common(arrays: Sequence[Any], out: Any = None) -> tuple[tuple[Any, ...], bool]:
    """The arrays (None kept) in one layout an element-wise kernel can walk as flat buffers, and whether
    it is channels-last: with ``out`` given, out's (out itself is what the caller reads, so it is never the one
    replaced); else the one a new result takes by PyTorch's rule (:func:`leads_channels_last`: the first array
    whose layouts differ decides), the others copied into it where they are not already. 0-d arrays stay as they
    are."""
    channels_last = is_channels_last(out) if out is not None else leads_channels_last(arrays)
    return tuple(a if a is None or getattr(a, "ndim", 0) == 0 else like(a, channels_last) for a in arrays), \
        channels_last
