"""The ``implicit_gemm`` algorithm: the GEMM of the lowered convolution, without the lowered matrix.

cuDNN's own contribution (IMPLICIT_GEMM, the cuDNN paper §3.1): compute the same matrix product
as ``gemm`` (explicit im2col), but gather each tile of the lowered matrix from the input as the
product needs it, so the column buffer never exists and the workspace is zero. Each direction is
one GEMM per group (CUTLASS's mapping; see ``implicit_gemm.cu`` for the kernels):

    direction         rows M      columns N   reduction      gathered operand
    forward           N·P·Q       K/G         C/G·R·S        x   (y = A · w)
    backward-data     N·H·W       C/G         K/G·R·S        dy  (dx = A · w)
    backward-filter   C/G·R·S     K/G         N·P·Q          x   (dwᵀ = A · dy, split over N·P·Q)

On the GPU each direction is one kernel launch: 128 × 64 tiles of the product (64 × 64 in float64),
the reduction walked in steps whose operand tiles are gathered into shared memory, double-buffered;
SIMT FMAs, or TF32 tensor cores for float32 when :func:`minidnn.cuda.allow_tf32` is on.
Backward-filter reduces over N·P·Q, far longer than its M × N output, so the reduction is split
over many CTAs whose partial tiles are added into ``out`` with ``atomicAdd`` in the same kernel:
the order of those additions varies from run to run, so the algorithm is **not deterministic**
(``deterministic = False``, like cuDNN's BWD_FILTER_ALGO_0), its results differing in the last
bits between runs.

Half precision (float16, bfloat16): the kernels' half build gathers 16-bit tiles and multiplies them on
tensor cores (mma.sync m16n8k16) into float32 sums, which the epilogue rounds once to the half type, after
the bias and ReLU; backward-filter's partial sums go into a float32 accumulator in the workspace, rounded
to the half type when all are in. NumPy, the twin: the half operands widened to float32 (exactly), the
float32 code below, one rounding at the end. The two differ only in the order of the float32 sums.

On NumPy the same K-loop runs tap by tap: for each filter tap (r, s), the strided view of the
padded input that the tap reads is one (C/G × P·Q) slice of the lowered matrix, and one batched
matrix product per tap adds its contribution. Backward-data scatters each tap's product onto the
strided slice of dx it came from; backward-filter contracts each tap over (n, p, q).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from ... import backend
from .. import _cuda, convert
from .._checks import check_rank, check_same_dtype
from .problem import ConvProblem, check_conv_dtype
from .reference import padded, tap_slices
from .registry import ConvAlgorithm, register, store_filter_gradient, store_half_filter_gradient, workspace_array

# The kernels' CTA and tile sizes (implicit_gemm.cu): rows × columns of the product per CTA, and
# the reduction step, per dtype.
THREADS = 256
TILE_N = 64
TILE_M = {"float32": 128, "float64": 64, "float16": 128, "bfloat16": 128}
TILE_K = {"float32": 16, "float64": 8, "float16": 32, "bfloat16": 32}
# Backward-filter's split-K: aim for about four waves of two CTAs on each SM (2.7 waves of the
# three-CTA build it runs on), but give each CTA at least this many reduction steps, so its
# atomicAdd of one 128 × 64 tile stays a small fraction of its 128·64·16·steps multiply-adds.
SPLIT_K_CTAS_PER_SM = 2 * 4
MIN_STEPS_PER_SPLIT = 16
# CTAs per SM the kernels are compiled for (implicit_gemm.cu's CTAS_PER_SM): two, and a second build
# with three for SIMT grids longer than one wave of two per SM.
DEFAULT_CTAS_PER_SM = 2
WIDE_GRID_CTAS_PER_SM = 3
# An SM's time per CTA with two or three resident, relative to two: with three, latency hides better
# than the few spilled registers cost (measured: docs/convolution.md, implicit GEMM, Measured).
RELATIVE_CTA_COST = {DEFAULT_CTAS_PER_SM: 1.0, WIDE_GRID_CTAS_PER_SM: 0.9}


def _type(problem: ConvProblem) -> str:
    """The key of the tile tables: the half type's name, or float32 / float64."""
    return problem.half_type or problem.dtype.name


def gemm_shape(problem: ConvProblem, direction: str) -> tuple[int, int, int]:
    """(rows M, columns N, reduction K) of one group's matrix product for ``direction``."""
    Cg, Kg = problem.C // problem.groups, problem.K // problem.groups
    taps = problem.R * problem.S
    pixels = problem.N * problem.P * problem.Q
    return {"forward": (pixels, Kg, Cg * taps),
            "backward_data": (problem.N * problem.H * problem.W, Cg, Kg * taps),
            "backward_filter": (Cg * taps, Kg, pixels)}[direction]


def steps_per_split(problem: ConvProblem, sms: int) -> int:
    """Backward-filter's reduction steps per CTA: enough slices of N·P·Q to fill a GPU of ``sms`` SMs."""
    rows, columns, reduction = gemm_shape(problem, "backward_filter")
    steps = -(-reduction // TILE_K[_type(problem)])
    output_tiles = -(-rows // TILE_M[_type(problem)]) * -(-columns // TILE_N) * problem.groups
    wanted_splits = -(-SPLIT_K_CTAS_PER_SM * sms // output_tiles)
    return max(MIN_STEPS_PER_SPLIT, -(-steps // wanted_splits))


class ImplicitGemm(ConvAlgorithm):
    """Implicit GEMM in all three directions; no workspace (but for a half backward-filter's float32
    accumulator on the GPU). Backward-filter on the GPU adds
    partial sums with ``atomicAdd``, so it is not bit-for-bit reproducible (``deterministic = False``);
    forward and backward-data write each output once, and the NumPy code has no atomics."""

    name = "implicit_gemm"
    deterministic = False
    half_precision = True
    float32_weight_gradient = True

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return True

    def is_deterministic(self, problem: ConvProblem, direction: str) -> bool:
        return not (direction == "backward_filter" and problem.device == "cuda")

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        # A half backward-filter on the GPU sums into a float32 dw before its one rounding.
        if direction == "backward_filter" and problem.half_type and problem.device == "cuda":
            return 4 * int(np.prod(problem.w_shape))
        return 0

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        forward_bias_activation(x, w, problem, out)

    def ready_launch(self, direction: str, problem: ConvProblem) -> Callable[[Any, Any], Any] | None:
        """On the GPU, ``direction`` as its output allocated and one launch of the kernel, grid and shape worked out
        now for the current device and math mode, packed (_cuda.PackedLaunch; :meth:`ConvAlgorithm.ready_launch`).
        None on the CPU and for a half weight gradient (its float32 accumulator takes more than one launch)."""
        if problem.device != "cuda" or (direction == "backward_filter" and problem.half_type):
            return None
        tensor_cores = problem.dtype == np.float32 and _cuda.allow_tf32()
        kernel, grid, extra = _launch_configuration(direction, problem, False, False, None, 1, tensor_cores,
                                                    _cuda.current_device())
        empty, dtype, tail, P = backend.cupy().empty, problem.dtype, (_shape_struct(problem), *extra), _cuda.PER_CALL
        if direction == "forward":
            shape = problem.y_shape
            packed = _cuda.PackedLaunch(kernel, grid, (THREADS,), (P, P, P, P, *tail))

            def launch(x: Any, w: Any) -> Any:
                y = empty(shape, dtype)
                packed(x, w, y, y)  # y stands in for the absent bias, never read
                return y
        elif direction == "backward_data":
            shape = problem.x_shape
            packed = _cuda.PackedLaunch(kernel, grid, (THREADS,), (P, P, P, *tail))

            def launch(dy: Any, w: Any) -> Any:
                dx = empty(shape, dtype)
                packed(dy, w, dx)
                return dx
        else:
            shape = problem.w_shape
            packed = _cuda.PackedLaunch(kernel, grid, (THREADS,), (P, P, P, *tail))

            def launch(x: Any, dy: Any) -> Any:
                dw = empty(shape, dtype)
                dw.data.memset_async(0, dw.nbytes)  # the split reduction adds into it
                packed(x, dy, dw)
                return dw
        return launch

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        if backend.is_cuda_array(dy):
            _launch("backward_data", (dy, w, out), problem)
        elif problem.half_type:
            _numpy_in_float32(_numpy_backward_data, dy, w, problem, out)
        else:
            _numpy_backward_data(dy, w, problem, out)

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        half = problem.half_type
        if backend.is_cuda_array(x):
            # The kernel adds into its dw (beta = 1): for a half problem a float32 one, carved from the workspace
            # unless out is float32 itself.
            rounded = half and out.dtype != np.float32
            dw = workspace_array(workspace, problem.w_shape, np.float32) if rounded else out
            if accumulate and rounded:
                convert.half_to_float(out, half, out=dw)
            elif not accumulate:
                dw.fill(0)
            _launch("backward_filter", (x, dy, dw), problem)
            if rounded:
                convert.float_to_half(dw, half, out=out)
        elif half:
            dw = _numpy_backward_filter(convert.half_to_float(x, half), convert.half_to_float(dy, half), problem)
            store_half_filter_gradient(dw, out, half, accumulate)
        else:
            store_filter_gradient(_numpy_backward_filter(x, dy, problem), out, accumulate)


def forward_bias_activation(x: Any, w: Any, problem: ConvProblem, out: Any, bias: Any = None,
                            relu: bool = False) -> None:
    """y = x ⋆ w, plus bias[k] when given, then max(·, 0) when ``relu``, into ``out`` (cuDNN's
    ConvolutionBiasActivationForward).

    x: (N, C, H, W), w: (K, C/groups, R, S), out: (N, K, P, Q), all C-contiguous and of ``problem``'s
    dtype; bias: (K,) or None. On the GPU bias and ReLU run in the kernel's epilogue, so y is
    written once (for a half problem: the float32 sum plus bias, ReLU'd, rounded once).
    """
    if bias is not None:
        check_conv_dtype(bias, "bias")
        check_rank(bias, 1, "bias", "(K,)")
        check_same_dtype(bias, x, "bias", "input")
        if bias.shape[0] != problem.K:
            raise ValueError(f"bias must have K={problem.K} values, one per output channel, got {bias.shape[0]}")
        backend.get_array_module(x, bias)  # a ValueError if bias is on another device
    if not isinstance(relu, bool):
        raise TypeError(f"relu must be a bool, got {relu!r}")
    if backend.is_cuda_array(x):
        _launch("forward", (x, w, out), problem, bias=bias, relu=relu)
        return
    if problem.half_type:
        half = problem.half_type
        _numpy_in_float32(_numpy_forward, x, w, problem, out,
                          None if bias is None else convert.half_to_float(bias, half), relu)
        return
    _numpy_forward(x, w, problem, out)
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    if relu:
        np.maximum(out, 0, out=out)


def _numpy_in_float32(compute: Any, first: Any, second: Any, problem: ConvProblem, out: Any, bias: Any = None,
                      relu: bool = False) -> None:
    """The NumPy twin of the half build: ``compute`` (forward or backward-data) on the half operands widened
    to float32, bias and ReLU in float32, then one rounding into ``out``."""
    half = problem.half_type
    wide = np.empty(out.shape, dtype=np.float32)
    compute(convert.half_to_float(first, half), convert.half_to_float(second, half), problem, wide)
    if bias is not None:
        wide += bias.reshape(1, -1, 1, 1)
    if relu:
        np.maximum(wide, 0, out=wide)
    convert.float_to_half(wide, half, out=out)


# ----------------------------------------------------------------------------------------------
# NumPy: the K-loop taken tap by tap
# ----------------------------------------------------------------------------------------------
def _taps(problem: ConvProblem, x_padded: Any):
    """Each filter tap (r, s) with the (N, G, C/G, P, Q) strided view of the padded input it reads."""
    for r in range(problem.R):
        for s in range(problem.S):
            rows, cols = tap_slices(problem, r, s)
            view = x_padded[:, :, rows, cols]
            yield r, s, view.reshape(problem.N, problem.groups, -1, problem.P, problem.Q)


def _weight_taps(w: Any, problem: ConvProblem) -> np.ndarray:
    """w as (R, S, G, K/G, C/G): each tap's per-group filter matrices, contiguous for BLAS."""
    G = problem.groups
    grouped = w.reshape(G, problem.K // G, problem.C // G, problem.R, problem.S)
    return np.ascontiguousarray(grouped.transpose(3, 4, 0, 1, 2))


def _numpy_forward(x: np.ndarray, w: np.ndarray, problem: ConvProblem, out: np.ndarray) -> None:
    G, PQ = problem.groups, problem.P * problem.Q
    weights = _weight_taps(w, problem)
    y = out.reshape(problem.N, G, problem.K // G, PQ)
    for r, s, view in _taps(problem, padded(x, problem)):
        columns = np.ascontiguousarray(view).reshape(problem.N, G, -1, PQ)  # this tap's rows of D_m
        if r == 0 and s == 0:
            np.matmul(weights[r, s], columns, out=y)
        else:
            y += np.matmul(weights[r, s], columns)


def _numpy_backward_data(dy: np.ndarray, w: np.ndarray, problem: ConvProblem, out: np.ndarray) -> None:
    G, (ph, pw) = problem.groups, problem.padding
    weights = _weight_taps(w, problem).transpose(0, 1, 2, 4, 3)  # each tap's W_gᵀ: (C/G, K/G)
    dy_groups = dy.reshape(problem.N, G, problem.K // G, problem.P * problem.Q)
    dx = np.zeros((problem.N, problem.C, problem.H + 2 * ph, problem.W + 2 * pw), dtype=dy.dtype)
    for r in range(problem.R):
        for s in range(problem.S):
            rows, cols = tap_slices(problem, r, s)
            dx[:, :, rows, cols] += np.matmul(weights[r, s], dy_groups).reshape(
                problem.N, problem.C, problem.P, problem.Q)
    out[...] = dx[:, :, ph:ph + problem.H, pw:pw + problem.W]


def _numpy_backward_filter(x: np.ndarray, dy: np.ndarray, problem: ConvProblem) -> np.ndarray:
    G, N = problem.groups, problem.N
    Kg, Cg = problem.K // G, problem.C // G
    # dy as G matrices (K/G × N·P·Q); each tap's input slice as G matrices (C/G × N·P·Q).
    dy_rows = np.ascontiguousarray(dy.reshape(N, G, Kg, -1).transpose(1, 2, 0, 3)).reshape(G, Kg, -1)
    dw = np.empty((problem.R, problem.S, G, Kg, Cg), dtype=x.dtype)
    for r, s, view in _taps(problem, padded(x, problem)):
        columns = np.ascontiguousarray(view.transpose(1, 2, 0, 3, 4)).reshape(G, Cg, -1)
        np.matmul(dy_rows, columns.transpose(0, 2, 1), out=dw[r, s])
    return dw.transpose(2, 3, 4, 0, 1).reshape(problem.w_shape)


# ----------------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------------
def every_phase_has_taps(problem: ConvProblem) -> bool:
    """True when the stride is no wider than the filter (R ≥ u and S ≥ v): no stride phase is all zeros."""
    return problem.R >= problem.stride[0] and problem.S >= problem.stride[1]


def backward_data_by_phase(dy: Any, w: Any, problem: ConvProblem, out: Any, rows: int) -> None:
    """dx = backward-data of a strided problem into ``out``, every stride phase in one launch
    (implicit_gemm.cu's BACKWARD_DATA_BY_PHASE, blockIdx.z the phase; strided_dgrad.py's idea): each
    phase gathers only the filter taps that reach its pixels. ``rows``: the largest phase's pixels,
    N·H_a·W_b, which the grid's row tiles cover. GPU only; every pixel of ``out`` is written.

    Every phase must have taps (R ≥ u, S ≥ v): a phase without any has an empty reduction, which the
    kernel does not handle (its job count divides by the reduction's steps; its first GPU run left
    such phases unwritten). strided_dgrad runs those problems phase by phase."""
    if not every_phase_has_taps(problem):
        raise ValueError(f"backward_data_by_phase needs a filter at least as large as the stride, got "
                         f"{problem.R}x{problem.S} with stride {problem.stride}")
    _launch("backward_data_by_phase", (dy, w, out), problem, rows=rows, phases=problem.stride[0] * problem.stride[1])


def _launch(direction: str, arrays: tuple, problem: ConvProblem, bias: Any = None, relu: bool = False,
            rows: int | None = None, phases: int = 1) -> None:
    """One launch of ``direction``'s kernel: the SIMT one, the TF32 tensor-core one for float32
    when TF32 is allowed, or the half build's for float16 and bfloat16 (backward-filter's out is then the
    float32 accumulator). ``arrays`` are (first input, second input, out) as the kernel takes them;
    backward-data by phase gives its largest phase's ``rows`` and the ``phases`` (the grid's z)."""
    _cuda.check_int32(*arrays)
    tensor_cores = problem.dtype == np.float32 and _cuda.allow_tf32()
    kernel, grid, extra = _launch_configuration(direction, problem, bias is not None, relu, rows, phases,
                                                tensor_cores, _cuda.current_device())
    if direction == "forward":
        x, w, out = arrays
        # out stands in for an absent bias: a pointer the kernel never reads.
        bias = out if bias is None else backend.get_array_module(bias).ascontiguousarray(bias)
        arrays = (x, w, bias, out)
    _cuda.launch_blocks(kernel, grid, THREADS, (*arrays, _shape_struct(problem), *extra))


@functools.lru_cache(maxsize=4096)
def _launch_configuration(direction: str, problem: ConvProblem, has_bias: bool, relu: bool, rows: int | None,
                          phases: int, tensor_cores: bool, device: int) -> tuple[Any, tuple[int, int, int], tuple]:
    """(kernel, grid, the arguments after the shape) of one launch: worked out on a problem's first call of each
    kind, then looked up, since a training step repeats every call (``device``: whose kernels and SMs)."""
    half = problem.half_type
    if direction == "backward_data_by_phase":
        _, columns, reduction = gemm_shape(problem, "backward_data")
    else:
        rows, columns, reduction = gemm_shape(problem, direction)
    steps = -(-reduction // TILE_K[_type(problem)])
    splits, extra = 1, ()
    if direction == "backward_filter":
        per_split = steps_per_split(problem, _cuda.sm_count())
        splits, extra = -(-steps // per_split), (_cuda.i32(per_split),)
    elif direction == "forward":
        extra = (_cuda.i32(has_bias), _cuda.i32(relu))
    tiles = -(-rows // TILE_M[_type(problem)]) * -(-columns // TILE_N)
    grid = (tiles, min(problem.groups * splits, _cuda.MAX_GRID_Y), phases)  # the kernel loops over further (group, split) jobs
    if half:  # one build, two CTAs per SM: three would leave its tensor-core loop 85 registers a thread
        kernel = _cuda.element_function("conv/implicit_gemm.cu", f"implicit_gemm_{direction}_half", half, None)
    else:
        ctas_per_sm = ctas_per_sm_for(direction, grid[0] * grid[1] * grid[2], _cuda.sm_count())
        build = () if ctas_per_sm == DEFAULT_CTAS_PER_SM else (("CTAS_PER_SM", ctas_per_sm),)
        kernel = _cuda.function("conv/implicit_gemm.cu",
                                f"implicit_gemm_{direction}" + ("_tf32" if tensor_cores else ""), problem.dtype, build)
    return kernel, grid, extra


def ctas_per_sm_for(direction: str, ctas: int, sms: int) -> int:
    """Which build of the kernels runs a grid of ``ctas`` CTAs on ``sms`` SMs: two CTAs per SM or three.

    A grid runs in waves of (CTAs per SM × SMs); the last wave may be nearly empty, yet costs a whole
    wave. Estimate each build's time as waves × CTAs per SM × its relative cost per CTA, and take the
    cheaper. Backward-filter always takes three: it sizes its split-K grid to several waves, and the
    three-CTA build ran it faster on every measured layer (docs/convolution.md, implicit GEMM, Measured)."""
    if direction == "backward_filter":
        return WIDE_GRID_CTAS_PER_SM

    def cost(per_sm: int) -> float:
        return -(-ctas // (per_sm * sms)) * per_sm * RELATIVE_CTA_COST[per_sm]

    return WIDE_GRID_CTAS_PER_SM if cost(WIDE_GRID_CTAS_PER_SM) < cost(DEFAULT_CTAS_PER_SM) else DEFAULT_CTAS_PER_SM


@functools.lru_cache(maxsize=1024)
def _shape_struct(problem: ConvProblem) -> np.void:
    """The problem as implicit_gemm.cu's ImplicitGemmShape (built once per problem)."""
    return np.array([(problem.N, problem.C, problem.H, problem.W, problem.K, problem.R, problem.S, problem.P,
                      problem.Q, *problem.stride, *problem.padding, *problem.dilation, problem.groups)],
                    dtype=_IMPLICIT_GEMM_SHAPE)[0]


_IMPLICIT_GEMM_SHAPE = np.dtype([(name, np.int32) for name in (
    "N", "C", "H", "W", "K", "R", "S", "P", "Q", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
    "groups")])


register(ImplicitGemm())
