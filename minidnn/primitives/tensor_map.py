"""Tensor maps: the 128-byte descriptors with which Hopper's bulk tensor copy (TMA, ``cp.async.bulk.tensor``) reads
a box of a tensor in global memory into shared memory, zero-filling what lies outside it, one thread issuing the
whole copy. The driver encodes them (``cuTensorMapEncodeTiled``, ``cuTensorMapEncodeIm2col``); CuPy has no binding.

Two kinds serve the implicit GEMM kernels:

* tiled: a box of ``box`` values (innermost first) of a row-major matrix, e.g. BLOCK_N filter rows × 128 bytes of
  their reduction;
* im2col: ``pixels`` consecutive output pixels (n, p, q) of a channels-last x (N, H, W, C), ``channels`` channels
  of each at one filter tap: the rows of the convolution's A matrix. The instruction names the first pixel's window
  corner (h, w) = (p·stride − pad, q·stride − pad), its image and first channel, and the tap (r·dilation,
  s·dilation) as offsets. The copy walks the pixels along W, then H, then N, through the window corners' box,
  [−pad, size + pad − (filter − 1)·dilation) strided, so that the box holds Q × P corners an image; pixels outside
  x (the padding, images past N) come in as zeros. An output cropped to fewer rows or columns (a strided
  backward-data's phase) ends the box sooner: its padding after the image is given apart.

Both keep the 128-byte swizzle of the kernels' tiles (16-byte chunk j of row r at chunk j ^ (r % 8)). A map is a
NumPy struct of 16 words (``MAP_DTYPE``) that a kernel takes by value as a ``const __grid_constant__`` parameter.
The arguments are worked out by :func:`tiled_arguments` and :func:`im2col_arguments` (plain Python, checked on the
CPU), the encoding is one driver call through ctypes, on the GPU only.
"""
from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple, Sequence

import numpy as np

MAP_BYTES = 128
MAP_DTYPE = np.dtype([("words", np.uint64, (MAP_BYTES // 8,))])

# The driver's enumerations (cuda.h's CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion): 16-bit words
# (a half type's bits, copied as they are), float32 words; the 128-byte swizzle; L2 lines promoted to 128 bytes.
DATA_TYPES = {2: 1, 4: 7}  # itemsize -> CU_TENSOR_MAP_DATA_TYPE_UINT16, _FLOAT32
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
MAX_BOX = 256  # values along any dimension of a box (channels and pixels alike)
# A 4-D im2col map shares a few bits among its two spatial dimensions: we keep its window corners within −128 ... 127
# and the instruction's tap offsets below 256, bounds taken on the safe side (ResNet's and CaffeNet's layers lie far
# inside them); the element strides (the convolution's stride) are 1 to 8.
CORNER_RANGE = range(-128, 128)
MAX_TAP_OFFSET = 255
MAX_ELEMENT_STRIDE = 8


class MapArguments(NamedTuple):
    """One encode call's arguments after the map itself: values innermost first, strides in bytes of dimensions
    1 on (dimension 0's is the item size)."""

    data_type: int
    dims: tuple[int, ...]
    byte_strides: tuple[int, ...]
    box: tuple[int, ...]  # tiled: the box; im2col: (channels per pixel, pixels per column)
    element_strides: tuple[int, ...]
    lower_corner: tuple[int, ...] = ()  # im2col: the window corners' box, (w, h)
    upper_corner: tuple[int, ...] = ()


def tiled_arguments(rows: int, columns: int, itemsize: int, box_columns: int, box_rows: int) -> MapArguments:
    """A row-major matrix (``rows``, ``columns``) of ``itemsize``-byte values, read in boxes of ``box_rows`` rows of
    ``box_columns`` values (at most 128 bytes, the swizzle's row)."""
    if itemsize not in DATA_TYPES:
        raise ValueError(_itemsize_misfit(itemsize))
    if (columns * itemsize) % 16:
        raise ValueError(f"a tensor map's rows must be a multiple of 16 bytes apart, got {columns} × {itemsize}")
    if box_columns * itemsize > 128 or not 0 < box_rows <= MAX_BOX:
        raise ValueError(f"box_columns × itemsize must be at most 128 bytes and box_rows 1 to {MAX_BOX}, got "
                         f"{box_columns}, {box_rows}")
    return MapArguments(DATA_TYPES[itemsize], (columns, rows), (columns * itemsize,), (box_columns, box_rows), (1, 1))


def im2col_arguments(N: int, H: int, W: int, C: int, itemsize: int, filter_size: tuple[int, int],
                     stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int], channels: int,
                     pixels: int, padding_after: tuple[int, int] | None = None) -> MapArguments:
    """A channels-last x (N, H, W, C) of ``itemsize``-byte values, read ``pixels`` output pixels × ``channels``
    channels a copy, for a convolution of ``filter_size`` (R, S), ``stride``, ``padding`` and ``dilation``, each
    (h, w); ``padding_after``: the padding below the last row and right of the last column where it is not
    ``padding`` (an output cropped to fewer rows or columns, as a strided backward-data's phase is). ValueError where
    the copy engine cannot: :func:`im2col_fits` says which beforehand."""
    reason = _im2col_misfit(C, itemsize, filter_size, stride, padding, dilation, channels, pixels, padding_after)
    if reason:
        raise ValueError(reason)
    (R, S), (pad_h, pad_w), (dilation_h, dilation_w) = filter_size, padding, dilation
    after_h, after_w = padding_after or padding
    return MapArguments(DATA_TYPES[itemsize], (C, W, H, N), (C * itemsize, W * C * itemsize, H * W * C * itemsize),
                        (channels, pixels), (1, stride[1], stride[0], 1), (-pad_w, -pad_h),
                        (after_w - (S - 1) * dilation_w, after_h - (R - 1) * dilation_h))


def im2col_fits(C: int, itemsize: int, filter_size: tuple[int, int], stride: tuple[int, int],
                padding: tuple[int, int], dilation: tuple[int, int], channels: int, pixels: int,
                padding_after: tuple[int, int] | None = None) -> bool:
    """Whether :func:`im2col_arguments` can map this convolution's x."""
    return not _im2col_misfit(C, itemsize, filter_size, stride, padding, dilation, channels, pixels, padding_after)


def _im2col_misfit(C: int, itemsize: int, filter_size: Sequence[int], stride: Sequence[int],
                   padding: Sequence[int], dilation: Sequence[int], channels: int, pixels: int,
                   padding_after: Sequence[int] | None = None) -> str:
    if itemsize not in DATA_TYPES:
        return _itemsize_misfit(itemsize)
    if (C * itemsize) % 16:
        return f"a tensor map's pixels must be a multiple of 16 bytes apart, got {C} channels of {itemsize} bytes"
    if channels * itemsize > 128 or not 0 < pixels <= MAX_BOX:
        return f"channels × itemsize must be at most 128 bytes and pixels 1 to {MAX_BOX}, got {channels}, {pixels}"
    if not all(1 <= s <= MAX_ELEMENT_STRIDE for s in stride):
        return f"the copy engine strides 1 to {MAX_ELEMENT_STRIDE} values, got stride {tuple(stride)}"
    for size, pad, after, step in zip(filter_size, padding, padding_after or padding, dilation):
        offset = (size - 1) * step
        if offset > MAX_TAP_OFFSET or -pad not in CORNER_RANGE or after - offset not in CORNER_RANGE:
            return (f"the window's corners must lie within {CORNER_RANGE.start} ... {CORNER_RANGE.stop - 1} and the "
                    f"taps within {MAX_TAP_OFFSET}: padding {tuple(padding)}, after {tuple(padding_after or padding)}, "
                    f"filter {tuple(filter_size)}, dilation {tuple(dilation)}")
    return ""


def _itemsize_misfit(itemsize: int) -> str:
    return f"tensor maps hold 2- or 4-byte values here, got {itemsize}-byte ones"


@functools.lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL:
    driver = ctypes.CDLL("libcuda.so.1")
    u64p, u32p, intp = (ctypes.POINTER(t) for t in (ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int))
    driver.cuTensorMapEncodeTiled.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p,
                                              u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_int]
    driver.cuTensorMapEncodeIm2col.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p,
                                               u64p, intp, intp, ctypes.c_uint32, ctypes.c_uint32, u32p, ctypes.c_int,
                                               ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return driver


@functools.lru_cache(maxsize=1)
def _driver_version() -> int:
    version = ctypes.c_int()
    _driver().cuDriverGetVersion(ctypes.byref(version))
    return version.value


def _array(kind: type, values: Sequence[int]) -> ctypes.Array:
    return (kind * len(values))(*values)


def encode(arguments: MapArguments, address: int) -> np.void:
    """The tensor map of ``arguments`` over the tensor at device ``address`` (16-byte aligned)."""
    if address % 16:
        raise ValueError(f"a tensor map's tensor must start on 16 bytes, got address {address:#x}")
    words = np.zeros(1, dtype=MAP_DTYPE)  # NumPy aligns it to 16 bytes; the driver asks 64
    storage = (ctypes.c_uint64 * (MAP_BYTES // 8 + 8))()
    aligned = -(-ctypes.addressof(storage) // 64) * 64
    a = arguments
    dims, strides = _array(ctypes.c_uint64, a.dims), _array(ctypes.c_uint64, a.byte_strides)
    element_strides = _array(ctypes.c_uint32, a.element_strides)
    if a.lower_corner:
        result = _driver().cuTensorMapEncodeIm2col(
            aligned, a.data_type, len(a.dims), address, dims, strides, _array(ctypes.c_int, a.lower_corner),
            _array(ctypes.c_int, a.upper_corner), a.box[0], a.box[1], element_strides, 0, SWIZZLE_128B,
            L2_PROMOTION_128B, 0)
    else:
        result = _driver().cuTensorMapEncodeTiled(
            aligned, a.data_type, len(a.dims), address, dims, strides, _array(ctypes.c_uint32, a.box),
            element_strides, 0, SWIZZLE_128B, L2_PROMOTION_128B, 0)
    if result != 0:
        raise RuntimeError(f"the driver refused a tensor map (CUresult {result}) for {arguments}")
    ctypes.memmove(words.ctypes.data, aligned, MAP_BYTES)
    if a.lower_corner and _driver_version() <= 13010 and _tensor_bytes(a) < 131072:
        # Drivers up to 13.1 encode an im2col map of a tensor under 128 KiB with a bit that corrupts its copies;
        # CUTLASS clears the same bit (make_im2col_tma_copy_desc).
        words["words"][0, 1] &= ~np.uint64(1 << 21)
    return words[0]


def _tensor_bytes(arguments: MapArguments) -> int:
    return arguments.byte_strides[-1] * arguments.dims[-1]


class MapCache:
    """Encoded maps by (arguments, address), emptied when it reaches ``most``: a training step maps the same few
    tensors at the same few addresses every time, and an encode costs a driver call."""

    def __init__(self, most: int = 1024) -> None:
        self.maps: dict[tuple[MapArguments, int], np.void] = {}
        self.most = most

    def get(self, arguments: MapArguments, address: int) -> np.void:
        key = (arguments, address)
        found = self.maps.get(key)
        if found is None:
            if len(self.maps) >= self.most:
                self.maps.clear()
            found = self.maps[key] = encode(arguments, address)
        return found
