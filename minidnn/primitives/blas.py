"""Matrix products for every primitive: one place that calls BLAS (NumPy) or cuBLAS (GPU).

    gemm(a, b, out)          out = alpha · op(a) · op(b) + beta · out          2-D
    gemm_batched(a, b, out)  the same for each of G matrices                   (G, M, K) · (G, K, N)
    gemm_batched_split_k(a, b, out)   the same, the reduction cut into S ranges, one partial product each
                                      (S, G, M, N): our own kernel (split_k_gemm.cu), for small outputs
                                      with long reductions, which cuBLAS leaves to too few CTAs

Arrays are row-major (C order) matrices or plain transposes of them (``w.T``): a transposed view
is passed to BLAS as the original storage with the "transpose" flag, so no copy is made. float32,
float64, complex64 and complex128 are accepted; ``beta = 1`` accumulates into ``out`` (the
micro-batched weight gradient uses it).

float16 and bfloat16 (stored as :mod:`.convert` stores them: bfloat16 is ``ml_dtypes.bfloat16`` on the
CPU and uint16 words on the GPU) are mixed precision: products and sums in float32 (cuBLAS's
``CUBLAS_COMPUTE_32F`` on the tensor cores), alpha, beta and ``beta · out`` in float32, one rounding to
the half type at the end; or, with a float32 ``out``, no rounding at all (half operands, float32 result:
partial sums that more sums will follow). NumPy, the twin, widens the operands to float32 and rounds its
float32 result to ``out``'s type.

Why not ``cupy.matmul`` on the GPU: CuPy 14 refuses every cuBLAS call during CUDA-graph stream
capture, and its batched matmul ignores the TF32 compute type. Here cuBLAS is called directly
on the very library and handle CuPy loaded (a second copy of libcublas would crash on CuPy's
handle): through CuPy's low-level Cython bindings in eager calls, and through ``ctypes`` while the
stream is being captured into a graph (CuPy's bindings refuse those calls), with the TF32 choice made
per call by ``cublasGemmEx``'s compute type:
``CUBLAS_COMPUTE_32F_FAST_TF32`` when :func:`minidnn.cuda.allow_tf32` is on. Those calls
capture into a graph like our own kernels (see :func:`prepare_capture`).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from .. import backend
from . import _cuda, convert

__all__ = ["gemm", "gemm_batched", "gemm_batched_split_k", "split_length", "prepare_capture", "ReadyGemm"]


# ----------------------------------------------------------------------------------------------
# Operand layout: a row-major matrix (lead = row stride) or the transpose of one
# ----------------------------------------------------------------------------------------------
def _matrix(a: Any, name: str, batched: bool = False) -> tuple[bool, int]:
    """(transposed, leading dimension in elements) of a 2-D operand (of each matrix of a 3-D one when
    ``batched``), or a clear error.

    ``transposed`` means ``a`` is the transpose of a row-major matrix stored at ``a``'s pointer.
    """
    if a.ndim != 2 + batched:
        raise ValueError(f"gemm: {name} must be 2-D, got shape {tuple(a.shape)}")
    item = a.itemsize
    row, col = a.strides[batched:]  # read off the array: indexing a CuPy array costs microseconds
    rows, cols = a.shape[batched:]
    if (col == item or cols == 1) and row >= max(cols, 1) * item and row % item == 0:
        return False, max(row // item, cols, 1)
    if (row == item or rows == 1) and col >= max(rows, 1) * item and col % item == 0:
        return True, max(col // item, rows, 1)
    raise ValueError(f"gemm: {name} must be a row-major matrix or the transpose of one, got strides "
                     f"{a.strides[batched:]} for shape {tuple(a.shape[batched:])} (make it contiguous first)")


def _check(a: Any, b: Any, out: Any, batched: bool) -> tuple[int, int, int]:
    rank = 3 if batched else 2
    for name, array in (("a", a), ("b", b), ("out", out)):
        if array.ndim != rank:
            raise ValueError(f"{'gemm_batched' if batched else 'gemm'}: {name} must be {rank}-D, "
                             f"got shape {tuple(array.shape)}")
    half = a.dtype not in _DATA_TYPES and convert.half_type_of(a) is not None
    if a.dtype != b.dtype or not (out.dtype == a.dtype or (half and out.dtype == np.float32)) \
            or (a.dtype not in _DATA_TYPES and not half):
        raise TypeError(f"gemm: a, b and out must share one dtype of float32, float64, complex64, complex128, float16 "
                        f"or bfloat16 (ml_dtypes on the CPU, uint16 words on the GPU), or be half operands with a "
                        f"float32 out, got {a.dtype}, {b.dtype}, {out.dtype}")
    M, K = a.shape[-2:]
    K2, N = b.shape[-2:]
    if K != K2 or out.shape[-2:] != (M, N) or (batched and not a.shape[0] == b.shape[0] == out.shape[0]):
        raise ValueError(f"gemm: shapes {tuple(a.shape)} · {tuple(b.shape)} -> {tuple(out.shape)} do not match")
    return M, N, K


def gemm(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0) -> Any:
    """out = alpha · a · b + beta · out for 2-D a (M × K), b (K × N), out (M × N); returns out.

    ``a`` and ``b`` may be transposed views (``w.T``); ``out`` must be a row-major matrix (a
    contiguous array, or rows of one). Without ``out`` a new array is made (``beta`` must be 0).
    """
    xp = backend.get_array_module(a, b, out)
    if out is None:
        if beta != 0:
            raise ValueError("gemm: beta != 0 needs an out array to accumulate into")
        out = xp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    M, N, K = _check(a, b, out, batched=False)
    if xp is np or 0 in (M, N, K):
        _numpy_gemm(a, b, out, alpha, beta)
        return out
    out_transposed, ldc = _matrix(out, "out")
    if out_transposed:
        raise ValueError("gemm: out must be a row-major matrix, not a transposed view")
    a_t, lda = _matrix(a, "a")
    b_t, ldb = _matrix(b, "b")
    # cuBLAS is column-major: the row-major C = A·B is the column-major Cᵀ = Bᵀ·Aᵀ, so the
    # operands swap places, and a row-major operand is already the transpose cuBLAS wants.
    _cublas().gemm(b_t, a_t, N, M, K, alpha, b, ldb, 0, a, lda, 0, beta, out, ldc, 0, 1)
    return out


def gemm_batched(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
                 tf32: bool | None = None) -> Any:
    """out[g] = alpha · a[g] · b[g] + beta · out[g] for g < G: a (G, M, K), b (G, K, N), out (G, M, N).

    Each operand's matrices must lie at a fixed stride from one another (a stride of 0 repeats
    one matrix for every g); each matrix may be transposed as in :func:`gemm`. ``tf32=False`` keeps
    float32 products in full float32 even when :func:`minidnn.cuda.allow_tf32` is on (for callers whose
    arithmetic magnifies TF32's rounding); None follows the switch.
    """
    if tf32 not in (None, True, False):
        raise TypeError(f"gemm_batched: tf32 must be None, True or False, got {tf32!r}")
    xp = backend.get_array_module(a, b, out)
    if out is None:
        if beta != 0:
            raise ValueError("gemm_batched: beta != 0 needs an out array to accumulate into")
        out = xp.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype)
    M, N, K = _check(a, b, out, batched=True)
    if xp is np or 0 in (M, N, K):
        _numpy_gemm(a, b, out, alpha, beta)
        return out
    if out.shape[0] == 0:
        return out
    a_t, lda = _matrix(a, "a", batched=True)
    b_t, ldb = _matrix(b, "b", batched=True)
    out_transposed, ldc = _matrix(out, "out", batched=True)
    if out_transposed:
        raise ValueError("gemm_batched: out must hold row-major matrices, not transposed views")
    strides = [array.strides[0] // array.itemsize if array.shape[0] > 1 else 0 for array in (a, b, out)]
    _cublas().gemm(b_t, a_t, N, M, K, alpha, b, ldb, strides[1], a, lda, strides[0], beta, out, ldc, strides[2],
                   out.shape[0], tf32)
    return out


class ReadyGemm:
    """:func:`gemm` (2-D operands) or :func:`gemm_batched` (3-D) of one call, worked out once for its repeats:
    operands of the same shapes, strides and dtypes at other addresses, as a training step's are. The checks, the
    operands' layouts and leading dimensions, cuBLAS's types and scalars are settled when it is made; a call passes
    the three operands' device addresses (a C-contiguous array's is all a repeat needs, however it is viewed). Its
    math mode is the TF32 switch's when it was made: a caller keeps it under that switch."""

    __slots__ = ("cublas", "entry", "arguments", "slots")

    def __init__(self, a: Any, b: Any, out: Any, *, alpha: float = 1.0, beta: float = 0.0) -> None:
        batched = a.ndim == 3
        M, N, K = _check(a, b, out, batched=batched)
        if not backend.is_cuda_array(out) or 0 in (M, N, K) or (batched and out.shape[0] == 0):
            raise ValueError("a ready GEMM takes GPU operands with work to do")
        a_t, lda = _matrix(a, "a", batched)
        b_t, ldb = _matrix(b, "b", batched)
        out_transposed, ldc = _matrix(out, "out", batched)
        if out_transposed:
            raise ValueError("gemm: out must be a row-major matrix, not a transposed view")
        strides = [array.strides[0] // array.itemsize if batched and array.shape[0] > 1 else 0 for array in (a, b, out)]
        self.cublas = _cublas()
        # As gemm does: the column-major product Cᵀ = Bᵀ·Aᵀ, so a takes cuBLAS's B slot and b its A slot.
        self.entry, self.arguments, (slot_b, slot_a, slot_c) = self.cublas.gemm_arguments(
            b_t, a_t, N, M, K, alpha, b.dtype, ldb, strides[1], lda, strides[0], beta, out.dtype, ldc, strides[2],
            out.shape[0] if batched else 1)
        self.slots = (slot_a, slot_b, slot_c)

    @classmethod
    def of_arguments(cls, cublas: "_Cublas", entry: str, arguments: tuple, slots: tuple[int, int, int]) -> "ReadyGemm":
        """The ready form of a GEMM already worked out (a step of a recorded call, :func:`_cuda.recording`): cuBLAS's
        ``entry`` with ``arguments`` after the handle, the operands' addresses to go in positions ``slots``. Called
        with the addresses in the order of ``slots``."""
        ready = cls.__new__(cls)
        ready.cublas, ready.entry, ready.arguments, ready.slots = cublas, entry, list(arguments), slots
        return ready

    def __call__(self, a_address: int, b_address: int, out_address: int) -> None:
        """out = alpha · a · b + beta · out on the current stream, for operands at these addresses."""
        arguments, (slot_a, slot_b, slot_c) = self.arguments, self.slots
        arguments[slot_a], arguments[slot_b], arguments[slot_c] = a_address, b_address, out_address
        self.cublas.call(self.entry, *arguments)


# split_k_gemm.cu's tile: TILE_M rows (128 for float, 64 for double) × 48 columns, 128 threads; every
# split is a whole number of its reduction steps (16 floats, 8 doubles).
SPLIT_K_TILE_M = {np.dtype(np.float32): 128, np.dtype(np.float64): 64}
SPLIT_K_TILE_N = 48
SPLIT_K_THREADS = 128
SPLIT_K_STEP = 16
SPLIT_K_BUILD: tuple = ()  # split_k_gemm.cu's build defines: its defaults (benchmarks/probes/winograd_weight_gradient_split_k.py tries others)


def split_k_tile_grid(M: int, N: int, dtype: Any) -> tuple[int, int]:
    """(column tiles, row tiles) split_k_gemm.cu covers one M × N product with, per split: 128 × 48 tiles
    (64 × 48 for double)."""
    return -(-N // SPLIT_K_TILE_N), -(-M // SPLIT_K_TILE_M[np.dtype(dtype)])


def split_k_tiles(M: int, N: int, dtype: Any) -> int:
    """CTAs split_k_gemm.cu gives one M × N product per split."""
    columns, rows = split_k_tile_grid(M, N, dtype)
    return columns * rows


def split_length(reduction: int, splits: int) -> int:
    """Reduction indices per split when ``reduction`` is cut into ``splits`` ranges: ⌈reduction/splits⌉
    rounded up to a multiple of 16, so that the last ranges may be short or empty."""
    if splits < 1:
        raise ValueError(f"split_length: splits must be at least 1, got {splits}")
    per = -(-reduction // splits)
    return max(SPLIT_K_STEP, -(-per // SPLIT_K_STEP) * SPLIT_K_STEP)


def gemm_batched_split_k(a: Any, b: Any, out: Any, *, beta: float = 0.0) -> Any:
    """out[s, g] = a[g][:, range s] · b[g][range s, :] + beta · out[s, g]: the partial products of the S ranges
    of ``split_length(L, S)`` consecutive reduction indices, whose sum over s is a[g] · b[g]; returns out.

    a (G, M, L) row-major matrices and b (G, L, N) transposes of row-major ones (both contiguous along the
    reduction L, as Winograd's transformed tiles lie; each operand's matrices a fixed stride apart), out
    (S, G, M, N) C-contiguous; ``beta`` 0 or 1. On the GPU our own kernel, in plain float arithmetic (never
    TF32: the caller picks cuBLAS when TF32 is wanted); on the CPU NumPy's matmul per range.
    """
    xp = backend.get_array_module(a, b, out)
    if out.ndim != 4:
        raise ValueError(f"gemm_batched_split_k: out must be 4-D (splits, G, M, N), got shape {tuple(out.shape)}")
    M, N, L = _check(a, b, out[0], batched=True)
    if beta not in (0.0, 1.0):
        raise ValueError(f"gemm_batched_split_k: beta must be 0 or 1, got {beta}")
    if np.dtype(a.dtype) not in (np.float32, np.float64):
        raise TypeError(f"gemm_batched_split_k: float32 or float64 operands, got {a.dtype}")
    splits = out.shape[0]
    per = split_length(L, splits)
    if xp is np:
        for split in range(splits):
            reduction = slice(split * per, (split + 1) * per)
            _numpy_gemm(a[:, :, reduction], b[:, reduction, :], out[split], 1.0, beta)
        return out
    a_t, lda = _matrix(a, "a", batched=True)
    b_t, ldb = _matrix(b, "b", batched=True)
    if a_t or not b_t:
        raise ValueError("gemm_batched_split_k: a must hold row-major matrices and b transposes of row-major ones "
                         "(both contiguous along the reduction)")
    if not out.flags.c_contiguous:
        raise ValueError("gemm_batched_split_k: out must be C-contiguous")
    if 0 in out.shape:
        return out
    _cuda.check_int32(a, b, out)
    batch_strides = tuple(array.strides[0] // array.itemsize if array.shape[0] > 1 else 0 for array in (a, b))
    shape = _split_k_shape(M, N, L, lda, ldb, *batch_strides, a.shape[0], per, int(beta))
    grid = (*split_k_tile_grid(M, N, a.dtype), a.shape[0] * splits)
    if grid[2] > 65535:
        raise ValueError(f"gemm_batched_split_k: {a.shape[0]} matrices × {splits} splits exceed the grid's 65535")
    # 16-byte copies where every row and matrix starts 16-byte aligned, else one value per copy.
    vector = 16 // a.itemsize
    aligned = all(value % vector == 0 for value in (lda, ldb, *batch_strides)) and \
        a.data.ptr % 16 == 0 and b.data.ptr % 16 == 0
    name = "split_k_gemm_aligned" if aligned else "split_k_gemm"
    kernel = _cuda.function("split_k_gemm.cu", name, a.dtype, SPLIT_K_BUILD)
    _cuda.launch_blocks(kernel, grid, SPLIT_K_THREADS, (a, b, out, shape))
    return out


# The C struct SplitKShape of split_k_gemm.cu: ten ints, in this order.
_SPLIT_K_SHAPE = np.dtype([(name, np.int32) for name in ("M", "N", "L", "lda", "ldb", "batch_a", "batch_b", "batch",
                                                          "per_split", "accumulate")])


@functools.lru_cache(maxsize=1024)  # a training step repeats the same few shapes: build each struct once
def _split_k_shape(*fields: int) -> np.void:
    return np.array([fields], dtype=_SPLIT_K_SHAPE)[0]


def _numpy_gemm(a: Any, b: Any, out: Any, alpha: float, beta: float) -> None:
    """The same arithmetic with the array module's matmul (NumPy, or CuPy for empty products); for a half
    type, in float32 on the widened operands, rounded once into ``out``."""
    xp = backend.get_array_module(out)
    half = None if a.dtype in _DATA_TYPES else convert.half_type_of(a)
    if half is not None and out.dtype == np.float32:  # half operands, a float32 result: no rounding
        _numpy_gemm(*(convert.half_to_float(xp.ascontiguousarray(m), half) for m in (a, b)), out,
                    np.float32(alpha), np.float32(beta))
        return
    if half is not None:
        wide = xp.empty(out.shape, dtype=np.float32)
        _numpy_gemm(*(convert.half_to_float(xp.ascontiguousarray(m), half) for m in (a, b)),
                    convert.half_to_float(xp.ascontiguousarray(out), half, out=wide) if beta != 0 else wide,
                    np.float32(alpha), np.float32(beta))
        if out.flags.c_contiguous:
            convert.float_to_half(wide, half, out=out)
        else:  # rows of a larger matrix
            out[...] = convert.float_to_half(wide, half)
        return
    if beta == 0:
        xp.matmul(a, b, out=out)
        if alpha != 1:
            out *= alpha
        return
    product = a @ b
    if alpha != 1:
        product *= alpha
    if beta != 1:
        out *= beta
    out += product


# ----------------------------------------------------------------------------------------------
# cuBLAS on CuPy's own library and handle
# ----------------------------------------------------------------------------------------------
# cudaDataType_t and cublasComputeType_t values (cuda's library_types.h, cublas_api.h).
_DATA_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.complex64): 4,
               np.dtype(np.complex128): 5}
# The half types' GPU storage (convert.py): float16, and bfloat16 as uint16 words; CUDA_R_16F, CUDA_R_16BF.
_HALF_DATA_TYPES = {np.dtype(np.float16): 2, np.dtype(np.uint16): 14}
_COMPUTE_32F, _COMPUTE_32F_PEDANTIC, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 69, 77, 70
_GEMM_DEFAULT = -1
_OP_N, _OP_T = 0, 1
# The cuBLAS workspace set before graph capture: cuBLAS would otherwise allocate its own per graph.
CAPTURE_WORKSPACE_BYTES = 32 << 20


class _Cublas:
    """The handful of cuBLAS entry points minidnn needs, on CuPy's handle, bound twice (:func:`_bindings`):

    * ``eager``: CuPy's own Cython bindings where it has them, which convert a GEMM's twenty-odd arguments
      in compiled code, where ``ctypes`` goes through a converter object per argument;
    * ``capturable``: all through ``ctypes`` with exact C signatures, for calls made while the stream is
      being captured into a CUDA graph, which CuPy's bindings refuse.

    ``cython=False`` makes both the ``ctypes`` ones. Each entry point takes the C arguments in order and
    raises on a failed status."""

    def __init__(self, cupy: Any, cython: bool = True) -> None:
        self.cupy = cupy
        self.handle = cupy.cuda.device.get_cublas_handle()  # makes CuPy load libcublas first
        self.capturable = _bindings(cython=False)
        self.eager = _bindings(cython) if cython else self.capturable
        self.workspace = None

    def call(self, entry: str, *args: Any) -> None:
        """The entry point named ``entry`` with ``(handle, *args)`` on the current stream (set on the handle
        every call: CuPy's own cuBLAS calls may have left it on another)."""
        stream = self.cupy.cuda.get_current_stream()
        bindings = self.capturable if stream.is_capturing() else self.eager
        bindings["setStream"](self.handle, stream.ptr)
        bindings[entry](self.handle, *args)

    def gemm(self, a_t: bool, b_t: bool, m: int, n: int, k: int, alpha: float, a: Any, lda: int, stride_a: int,
             b: Any, ldb: int, stride_b: int, beta: float, c: Any, ldc: int, stride_c: int, batch: int,
             tf32: bool | None = None) -> None:
        """Column-major C = alpha·op(A)·op(B) + beta·C (strided batched when batch > 1); ``tf32`` as in
        :func:`gemm_batched`."""
        entry, arguments, (slot_a, slot_b, slot_c) = self.gemm_arguments(
            a_t, b_t, m, n, k, alpha, a.dtype, lda, stride_a, ldb, stride_b, beta, c.dtype, ldc, stride_c, batch, tf32)
        _cuda.record((a, b, c), ReadyGemm.of_arguments, self, entry, tuple(arguments), (slot_a, slot_b, slot_c))
        arguments[slot_a], arguments[slot_b], arguments[slot_c] = a.data.ptr, b.data.ptr, c.data.ptr
        self.call(entry, *arguments)

    @staticmethod
    def gemm_arguments(a_t: bool, b_t: bool, m: int, n: int, k: int, alpha: float, a_dtype: Any, lda: int,
                       stride_a: int, ldb: int, stride_b: int, beta: float, c_dtype: Any, ldc: int, stride_c: int,
                       batch: int, tf32: bool | None = None) -> tuple[str, list, tuple[int, int, int]]:
        """(the entry point, its arguments after the handle with A's, B's and C's addresses left 0, their positions in
        the list) of :meth:`gemm`, its math mode read from the TF32 switch now."""
        dtype = np.dtype(c_dtype)
        data_type = _HALF_DATA_TYPES.get(np.dtype(a_dtype))
        if data_type is not None:  # float32 products and sums (tensor cores), float32 alpha and beta
            compute, dtype = _COMPUTE_32F, np.dtype(np.float32)
            out_type = _HALF_DATA_TYPES.get(np.dtype(c_dtype), _DATA_TYPES[np.dtype(np.float32)])
        else:
            data_type = out_type = _DATA_TYPES[dtype]
            if dtype in (np.float64, np.complex128):
                compute = _COMPUTE_64F
            elif tf32 is None or tf32 == _cuda.allow_tf32():
                compute = _COMPUTE_32F_FAST_TF32 if _cuda.allow_tf32() else _COMPUTE_32F
            else:  # against the switch: with TF32 on, CuPy's handle is in TF32 math mode, which plain 32F obeys
                compute = _COMPUTE_32F_FAST_TF32 if tf32 else _COMPUTE_32F_PEDANTIC
        _, alpha_p, beta_p = _scalars(dtype, alpha, beta)  # cached for the process: held until cuBLAS has read them
        op_a, op_b = (_OP_T if a_t else _OP_N), (_OP_T if b_t else _OP_N)
        if batch == 1:
            return "gemmEx", [op_a, op_b, m, n, k, alpha_p, 0, data_type, lda, 0, data_type, ldb, beta_p, 0, out_type,
                              ldc, compute, _GEMM_DEFAULT], (6, 9, 13)
        return "gemmStridedBatchedEx", [op_a, op_b, m, n, k, alpha_p, 0, data_type, lda, stride_a, 0, data_type, ldb,
                                        stride_b, beta_p, 0, out_type, ldc, stride_c, batch, compute,
                                        _GEMM_DEFAULT], (6, 10, 15)

    def prepare_capture(self) -> None:
        """Give the handle a workspace that outlives every graph (PyTorch does the same). It comes from the device
        itself, not from the caching pool: held for the process's life, a block of the pool would keep the cached
        chunk it was carved from (whichever free one was large enough) from ever going back to the device."""
        if self.workspace is None:
            memory = self.cupy.cuda.memory
            try:
                self.workspace = memory.Memory(CAPTURE_WORKSPACE_BYTES)
            except self.cupy.cuda.runtime.CUDARuntimeError:  # the pool's cached blocks fill the device: hand them back
                self.cupy.get_default_memory_pool().free_all_blocks()
                self.workspace = memory.Memory(CAPTURE_WORKSPACE_BYTES)
            self.capturable["setWorkspace"](self.handle, self.workspace.ptr, CAPTURE_WORKSPACE_BYTES)


@functools.lru_cache(maxsize=None)  # a few (dtype, alpha, beta) in practice; kept, as ready GEMMs hold their addresses
def _scalars(dtype: np.dtype, alpha: float, beta: float) -> tuple[np.ndarray, int, int]:
    """alpha and beta in the compute type's scalar type, with their host addresses, which cuBLAS reads
    during the call (the caller holds the buffer until then). Cached: building it cost more than the call."""
    buffer = np.array([alpha, beta], dtype=np.complex64 if dtype == np.complex64 else dtype)
    return buffer, buffer.ctypes.data, buffer.ctypes.data + buffer.itemsize


# Each entry point: CuPy's Cython name, the C name and the C argument types for ctypes.
_INT, _POINTER, _INT64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong
_ENTRY_POINTS = (
    ("setStream", "cublasSetStream_v2", [_POINTER, _POINTER]),
    ("gemmEx", "cublasGemmEx", [_POINTER, _INT, _INT, _INT, _INT, _INT, _POINTER, _POINTER, _INT, _INT, _POINTER,
                                _INT, _INT, _POINTER, _POINTER, _INT, _INT, _INT, _INT]),
    ("gemmStridedBatchedEx", "cublasGemmStridedBatchedEx",
     [_POINTER, _INT, _INT, _INT, _INT, _INT, _POINTER, _POINTER, _INT, _INT, _INT64, _POINTER, _INT, _INT, _INT64,
      _POINTER, _POINTER, _INT, _INT, _INT64, _INT, _INT, _INT]),
    ("setWorkspace", "cublasSetWorkspace_v2", [_POINTER, _POINTER, ctypes.c_size_t]),
)


def _bindings(cython: bool = True) -> dict[str, Any]:
    """The entry points of :data:`_ENTRY_POINTS` by their CuPy names, each CuPy's Cython binding where this
    CuPy has it (and ``cython``), else bound with ``ctypes`` to CuPy's loaded libcublas; both raise on a
    failed status."""
    module = None
    if cython:
        try:
            from cupy_backends.cuda.libs import cublas as module  # noqa: PLC0415 - CuPy is there: the GPU is in use
        except ImportError:
            pass
    library, found = None, {}
    for cython_name, c_name, argtypes in _ENTRY_POINTS:
        function = getattr(module, cython_name, None)
        if function is None:
            library = library or ctypes.CDLL(_loaded_library("libcublas.so"))
            function = _checked(getattr(library, c_name), c_name, argtypes)
        found[cython_name] = function
    return found


def _checked(function: Any, name: str, argtypes: list) -> Any:
    """A ctypes cuBLAS function with exact C argument types, raising on a failed status."""
    function.argtypes, function.restype = argtypes, ctypes.c_int

    def call(*args: Any) -> None:
        status = function(*args)
        if status != 0:
            raise RuntimeError(f"cuBLAS {name} failed with status {status}")
    return call


def _loaded_library(stem: str) -> str:
    """The path of the already-loaded shared library whose file name starts with ``stem``."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            path = line.rstrip("\n").split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
            name = path.rsplit("/", 1)[-1]
            if name.startswith(stem):
                return path
    raise RuntimeError(f"{stem} is not loaded in this process: cannot call cuBLAS without CuPy's copy")


@functools.lru_cache(maxsize=None)
def _cublas_for_device(device_id: int) -> _Cublas:
    return _Cublas(backend.cupy())


def _cublas() -> _Cublas:
    return _cublas_for_device(backend.cupy().cuda.runtime.getDevice())


def prepare_capture() -> None:
    """Call before capturing a CUDA graph that contains GEMMs on the current device."""
    _cublas().prepare_capture()
