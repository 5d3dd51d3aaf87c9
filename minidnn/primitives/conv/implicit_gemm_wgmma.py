"""The ``implicit_gemm_wgmma`` algorithm: ``implicit_gemm_nhwc`` with the products on Hopper's warpgroup MMA
(wgmma), the instruction Hopper's tensor cores reach their rate with; and the same kernel's TF32 build for float32
problems when :func:`minidnn.cuda.allow_tf32` is on.

mma.sync gives each warp a 16 × 8 product from fragments it loaded into registers; wgmma gives a warpgroup of
four warps a 64 × N product read straight from shared memory, issued asynchronously. The channels-last copies,
the chunks of images, the workspace and the NumPy twin are ``implicit_gemm_nhwc``'s; only the kernel differs
(``implicit_gemm_wgmma.cu``: its shared-memory layout is the one wgmma reads, 128-byte rows swizzled). Where a
group's channels fill whole 128-byte stages, the forward kernel's stages are copied by Hopper's bulk tensor copy engine
through tensor maps (``tensor_map.py``) instead of the threads' gathers: the TMA build, ``FORWARD_TMA``; the half
backward-filter and the strided backward-data's phase kernel have one too, ``FILTER_TMA`` and ``PHASES_TMA`` (off
until timed).

    direction         rows M      columns N   reduction      operands (channels last)
    forward           N·P·Q       K           R·S·C          x (N, H, W, C), w (K, R, S, C)
    backward-data     N·H·W       C           R·S·K          dy (N, P, Q, K), w turned (C, R, S, K)
    backward-filter   R·S·C       K           N·P·Q, split   x (N, H, W, C), dy (N, P, Q, K)

wgmma exists only in sm_90a code: on the GPU this algorithm supports a problem only on a GPU of compute
capability 9.0 (``_cuda.has_wgmma``). Numerics: as ``implicit_gemm_nhwc``'s (exact products, float32 sums, one
rounding; backward-filter's split sums added with atomicAdd, not deterministic), the sums in the tensor cores'
order.

TF32 (float32 problems on the GPU with TF32 allowed): the copies are float32 words, four to 16 bytes, so the
channels that form the reduction need only be multiples of 4 (a first layer's 3 are padded to 4, as the half
builds pad theirs to 8: ``implicit_gemm_nhwc.padded_problem``); wgmma multiplies each operand cut toward zero to
TF32's 10 fraction bits (the copies go straight to shared memory: no pass rounds them first, as
``implicit_gemm``'s TF32 kernels do to nearest) and sums in float32; y is stored as summed. wgmma reads TF32 tiles
K-major only: forward's are, and backward-filter, whose operands lie along M and N, copies them as they lie in
16-byte vectors into a staging buffer, then turns them into K-major tiles in shared memory (the .cu file says how).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import numpy as np

from ... import backend
from .. import _cuda, convert, layout, tensor_map
from . import implicit_gemm_nhwc
from .implicit_gemm_nhwc import ImplicitGemmNhwc
from .problem import ConvProblem
from .registry import register, store_half_filter_gradient

SOURCE = "conv/implicit_gemm_wgmma.cu"
THREADS = 256
# implicit_gemm_wgmma.cu's tile: implicit_gemm_nhwc's 128 rows (64 per warpgroup: its grid helpers count tiles of
# them), BLOCK_N columns (implicit_gemm_nhwc's rule), one 128-byte row of reduction values a stage (64 half
# values or 32 floats); the stages start on the swizzle's 1024-byte period, which the dynamic allocation may
# not: the launch asks for one period more.
BLOCK_M, ROW_BYTES, SWIZZLE_PERIOD = implicit_gemm_nhwc.BLOCK_M, 128, 1024
# The pipeline of each tile width: (STAGES, IN_FLIGHT), stages of shared memory and groups of products left in
# flight across a stage's barrier (the copies then run STAGES - 1 - IN_FLIGHT stages ahead). Three stages, none
# in flight, timed fastest at 128 and 64 (benchmarks/probes/wgmma_pipeline_depth.py): a fourth 128-wide stage
# leaves room for one CTA per SM instead of two. The same holds for the TF32 build, whose stage reduces half as many
# values in the same bytes: four to six stages were no faster (the probe's --tf32). A 256-wide tile holds one CTA
# an SM whatever its stages; three fill 145 KiB of the 227, and four were no faster (wgmma_tile_width.py).
PIPELINES = {128: (3, 0), 64: (3, 0), 256: (3, 0)}
# The forward kernel's other pipeline (implicit_gemm_wgmma.cu's PRODUCER build): one or two producer warpgroups copy
# beside the two that multiply, through mbarriers, one persistent CTA an SM (with the TMA build, the producer
# warpgroup's first thread issues the bulk tensor copies). It times slower than the barrier
# pipeline on every layer measured (benchmarks/probes/wgmma_forward_builds.py), so no width takes it: per tile width,
# None (the barrier pipeline) or (STAGES, IN_FLIGHT, producer warpgroups), the stages capped at what the shared memory
# holds beside the output tile.
FORWARD_PRODUCER: dict[int, tuple[int, int, int] | None] = {128: None, 64: None, 256: None}
SHARED_LIMIT = 227 * 1024  # Hopper's dynamic shared memory a CTA at most
# The forward kernel's TMA build (implicit_gemm_wgmma.cu's TMA): the barrier pipeline with each stage copied by the
# bulk tensor copy engine through tensor maps (tensor_map.py) instead of the threads' gathers, where the problem fits
# (tma_fits). Per tile width, whether it runs: at both, it took less time than the gathers summed over ResNet's 3×3
# layers, bf16 and TF32 (benchmarks/probes/wgmma_forward_builds.py's TMA variant); 256 is the TF32 backward-filter's.
FORWARD_TMA: dict[int, bool] = {128: True, 64: True, 256: False}
# The half backward-filter's TMA build: the same pipeline, each stage's 64 pixels copied by the bulk tensor copy
# engine, x through an im2col map (a 64-row panel of the tile's rows a copy), dy through a tiled map, where the problem
# fits (filter_tma_fits). Per tile width, whether it runs: off until it has been timed against the gathers
# (benchmarks/probes/wgmma_forward_builds.py's filter variants).
FILTER_TMA: dict[int, bool] = {128: False, 64: False}
# The strided backward-data's phase kernel's TMA build: each phase's stages through its own two maps, dy's im2col box
# ending after the phase's cropped output, where every phase of the launch fits (phases_tma_fits). Per tile width,
# whether it runs: off until timed against the gathers (benchmarks/probes/strided_dgrad_phases_one_launch.py
# --phases-tma).
PHASES_TMA: dict[int, bool] = {128: False, 64: False}
# Whether the half backward-filter of a network's first layer (3 channels, an even stride along W) runs on pixel pairs
# (implicit_gemm_nhwc.paired_problem: two taps a 16-byte copy, about half the GEMM's rows of the padded problem's).
# Off until timed against the padded channels (benchmarks/probes/first_layer_filter_pairs.py).
PAIRED_FILTER = False


class ProducerBuild(NamedTuple):
    stages: int
    in_flight: int
    producers: int  # warpgroups, beside the two that multiply
    shared_bytes: int

    @property
    def threads(self) -> int:
        return 128 * self.producers + THREADS


def producer_build(block_n: int, itemsize: int) -> ProducerBuild:
    """The PRODUCER build at ``block_n`` wide on values of ``itemsize`` bytes: FORWARD_PRODUCER's, its stages fewer
    if the shared memory holds fewer beside the output tile (BLOCK_M rows of block_n + 8 values, or block_n columns
    of BLOCK_M + 8) and two 8-byte mbarriers a stage. One CTA of 512 threads holds 128 registers a thread, which the
    consumers' accumulators need: so one or two producer warpgroups."""
    stages, in_flight, producers = FORWARD_PRODUCER[block_n]
    if producers not in (1, 2):
        raise ValueError(f"the PRODUCER build takes 1 or 2 producer warpgroups, got {producers}")
    stage_bytes = (BLOCK_M + block_n) * ROW_BYTES
    fixed = max(BLOCK_M * (block_n + 8), block_n * (BLOCK_M + 8)) * itemsize + SWIZZLE_PERIOD
    stages = min(stages, (SHARED_LIMIT - fixed) // (stage_bytes + 16))
    if stages <= in_flight:
        raise ValueError(f"the PRODUCER build at {block_n} wide needs more stages than the {in_flight} in flight")
    return ProducerBuild(stages, in_flight, producers, stages * (stage_bytes + 16) + fixed)


# Backward-filter's split of N·P·Q aims at two waves of CTAs, half implicit_gemm_nhwc's four: a stage here reduces
# twice the pixels, and the fewer, longer slices add fewer partial tiles with atomicAdd. Two waves timed fastest on
# 3×3 stride-1 layers and no slower than four on the others (benchmarks/probes/backward_filter_kernels.py). An SM
# holds two CTAs of a 64- or 128-wide tile, one of a 256-wide one (the kernels' launch bounds).
SPLIT_K_WAVES = 2
# Whether the split stays within those waves (implicit_gemm_nhwc.steps_per_split's within_waves). Rounded up, as it
# has been timed, ResNet-50's 3×3 layers of layer2 to layer4 at batch 128 get 531 to 576 CTAs for 528 slots on 132
# SMs: a third wave of 3 to 48. Off until wgmma_forward_builds.py's SPLIT_WITHIN_WAVES variant has timed it.
SPLIT_K_WITHIN_WAVES = False


def ctas_per_sm(block_n: int) -> int:
    """The backward-filter CTAs of a ``block_n``-wide tile an SM holds at once (implicit_gemm_wgmma.cu's launch
    bounds, which its shared memory sets), in both builds."""
    return 1 if block_n == 256 else 2


def tile_width(columns: int, kernel: str) -> int:
    """The tile's width for a product ``columns`` wide (one group's K, or C for backward-data) on ``kernel``
    ("forward", which backward-data runs too, or "backward_filter"), in either build: implicit_gemm_nhwc's 64 or
    128 (the probes set the two kernels' widths apart). A 256-wide tile copies and turns its 128 rows of x once for
    twice the filters: the TF32 backward-filter took it while it copied each word on its own, and its staged copies,
    turned in shared memory, timed faster at 128 on most ResNet layers of 256 and 512 filters
    (wgmma_forward_builds.py's FILTER_WIDTH); forward and backward-data at 256 were slower on most
    (benchmarks/probes/wgmma_tile_width.py)."""
    return implicit_gemm_nhwc._block_n(columns)


# TF32's copies: 16 bytes are four float32 values.
TF32_VECTOR = 4


class ImplicitGemmWgmma(ImplicitGemmNhwc):
    """``implicit_gemm_nhwc`` with its kernels on wgmma: float16 and bfloat16 problems, the reduction's
    channels per group multiples of 8 (or padded to them), backward-data at stride 1; on the GPU, Hopper only. And
    float32 problems on Hopper with TF32 allowed, in all three directions (backward-data at stride 1), the
    reduction's channels multiples of 4 (or padded to them)."""

    name = "implicit_gemm_wgmma"

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        if problem.dtype == np.float32:
            return _supports_tf32(problem, direction)
        return super().supports(problem, direction) and (problem.device != "cuda" or _cuda.has_wgmma())

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        if not backend.is_cuda_array(x):
            super().forward(x, w, problem, out, workspace)  # the NumPy twin
            return
        implicit_gemm_nhwc._forward_by_chunks(x, w, problem, out, workspace, "forward", _launch_forward)

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        if not backend.is_cuda_array(dy):
            super().backward_data(dy, w, problem, out, workspace)
            return
        implicit_gemm_nhwc._forward_by_chunks(dy, w, problem, out, workspace, "backward_data", _launch_forward)

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        pairs = paired(problem, direction)
        if pairs is None or problem.device != "cuda":
            return super().workspace_bytes(problem, direction)
        return implicit_gemm_nhwc.chunk_workspace_bytes(pairs, direction)

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        pairs = paired(problem, "backward_filter")
        if backend.is_cuda_array(x):
            implicit_gemm_nhwc._backward_filter_by_chunks(x, dy, problem, out, accumulate, workspace,
                                                          _launch_backward_filter, pairs is not None)
        elif pairs is not None:  # the NumPy twin on the same pixel pairs
            store_half_filter_gradient(implicit_gemm_nhwc.numpy_paired_backward_filter(x, dy, problem), out,
                                       problem.half_type, accumulate)
        else:
            super().backward_filter(x, dy, problem, out, accumulate, workspace)


def paired(problem: ConvProblem, direction: str) -> ConvProblem | None:
    """The pixel pairs' problem where PAIRED_FILTER runs backward-filter on them (implicit_gemm_nhwc.paired_problem),
    else None."""
    return implicit_gemm_nhwc.paired_problem(problem) if PAIRED_FILTER and direction == "backward_filter" else None


def _supports_tf32(problem: ConvProblem, direction: str) -> bool:
    """A float32 problem runs the TF32 build: on a Hopper GPU with TF32 allowed, the reduction's channels per group
    (C/G forward, K/G backward-data, both backward-filter) multiples of 4, backward-data at stride 1; or forward and
    backward-filter of one group whose C are padded to a multiple of 4 (``implicit_gemm_nhwc.pads_channels``)."""
    return (problem.device == "cuda" and _cuda.allow_tf32()
            and (implicit_gemm_nhwc.vectors_fit(problem, direction, TF32_VECTOR)
                 or implicit_gemm_nhwc.pads_channels(problem, direction))
            and _cuda.has_wgmma())


def shared_bytes(block_n: int) -> int:
    """The forward kernel's dynamic shared memory, and the half backward-filter's: the stages of 128-byte rows (the
    epilogue's output tile fits in them), plus a period."""
    stages, _ = PIPELINES[block_n]
    return stages * (BLOCK_M + block_n) * ROW_BYTES + SWIZZLE_PERIOD


# The TF32 backward-filter's stage: 32 pixels (one 128-byte row of float32 values); its copies land in a staging
# buffer of one row a pixel (A's 128 values, then B's block_n), each row padded by one 16-byte vector.
TF32_FILTER_STAGE_PIXELS = ROW_BYTES // 4


def backward_filter_shared_bytes(block_n: int, half: str | None) -> int:
    """The backward-filter kernel's dynamic shared memory: the half build's is forward's; the TF32 build's is two
    staging buffers and two stages of K-major tiles (one at 128 wide, so that two CTAs fit an SM), plus a period."""
    if half is not None:
        return shared_bytes(block_n)
    tiles = (BLOCK_M + block_n) * ROW_BYTES
    staging = TF32_FILTER_STAGE_PIXELS * (BLOCK_M + TF32_VECTOR + block_n + TF32_VECTOR) * 4
    return (1 if block_n == 128 else 2) * tiles + 2 * staging + SWIZZLE_PERIOD


# The build of each value type: a half type's, or float32's TF32 build (HALF 0).
_VALUE_BUILDS = {**_cuda.HALF_BUILDS, None: (("HALF", 0),)}


def _kernel(name: str, half: str | None, block_n: int, y_last: bool = False, placed: bool = False,
            tma: bool = False) -> Any:
    """``name``'s build for the half type (None: float32 on TF32) and tile width; ``y_last``: forward's store to a
    channels-last y; ``placed``: its rows stored at the shape's placement (channels_last.cuh's Y_PLACED: the phase
    kernel's build); ``tma``: the TMA build, its stages copied through tensor maps."""
    stages, in_flight = PIPELINES[block_n]
    return _cuda.function(SOURCE, name, np.float32, _VALUE_BUILDS[half] + (
        ("BLOCK_N", block_n), ("STAGES", stages), ("IN_FLIGHT", in_flight)) + ((("TMA", 1),) if tma else ())
        + ((("Y_LAST", 1),) if y_last else ()) + ((("Y_PLACED", 1),) if placed else ()))


def _launch_forward(x_last: Any, w_last: Any, out: Any, shape: np.void) -> None:
    """out (N, K, P, Q), C-contiguous or channels-last, = x_last (N, H, W, C) ⋆ w_last (K, R, S, C/G), for
    ``shape``."""
    _cuda.check_int32(x_last, w_last, out)
    half = convert.half_type_of(out)
    block_n = tile_width(int(shape["K"]), "forward")
    grid = implicit_gemm_nhwc.forward_grid(shape, block_n)
    if FORWARD_TMA.get(block_n) and tma_fits(shape, out.dtype.itemsize, x_last, w_last):
        _launch_tma(x_last, w_last, out, shape, half, block_n, grid)
        return
    kernel, grid, threads, shared = _forward_build(half, block_n, out, grid, tma=False)
    implicit_gemm_nhwc._launch_tile_kernel(kernel, grid, shared, (x_last, w_last, layout.flat(out), shape), threads)


def _forward_build(half: str | None, block_n: int, out: Any, grid: tuple[int, int, int],
                   tma: bool) -> tuple[Any, tuple[int, int, int], int, int]:
    """(kernel, grid, threads a CTA, dynamic shared bytes) of the forward kernel's build at ``block_n`` wide for
    ``out``, from the tiles' ``grid``: the barrier pipeline (PIPELINES), or with FORWARD_PRODUCER set at this width the
    PRODUCER build, one persistent CTA an SM, each running tiles gridDim.x apart; its copies the gathers', or with
    ``tma`` the bulk tensor copy's."""
    y_last = layout.is_channels_last(out)
    if FORWARD_PRODUCER.get(block_n) is None:
        shared = tma_shared_bytes(block_n) if tma else shared_bytes(block_n)
        return _kernel("implicit_gemm_wgmma_forward", half, block_n, y_last, tma=tma), grid, THREADS, shared
    build = producer_build(block_n, out.dtype.itemsize)
    pipeline = (("STAGES", build.stages), ("IN_FLIGHT", build.in_flight), ("PRODUCER", 1),
                ("PRODUCER_WARPGROUPS", build.producers))
    defines = _VALUE_BUILDS[half] + (("BLOCK_N", block_n),) + pipeline + ((("TMA", 1),) if tma else ()) + (
        (("Y_LAST", 1),) if y_last else ())
    grid = (min(grid[0], _cuda.sm_count()), 1, grid[2])
    return (_cuda.function(SOURCE, "implicit_gemm_wgmma_forward", np.float32, defines), grid, build.threads,
            build.shared_bytes)


def tma_fits(shape: np.void, itemsize: int, x_last: Any, w_last: Any) -> bool:
    """Whether the TMA build runs ``shape`` (an NhwcShape) on x_last (N, H, W, C) and w_last (K, R, S, C/G) of
    ``itemsize``-byte values: a stage is one tap of 128 bytes of a group's channels, so C per group is a multiple of
    them; the tensor maps take the convolution (tensor_map.im2col_fits) and both operands start on 16 bytes."""
    return (_shape_fits(shape.tobytes(), itemsize) and x_last.data.ptr % 16 == 0 and w_last.data.ptr % 16 == 0)


# Worked out once per shape: an eager step asks again at every call, and the checks cost several microseconds.
# ``cropped``: the shape's output is a strided backward-data's phase, cropped (its box of window corners ends after
# it: _padding_after).
@functools.lru_cache(maxsize=1024)
def _shape_fits(shape_bytes: bytes, itemsize: int, cropped: bool = False) -> bool:
    shape = _unpack(shape_bytes)
    return (int(shape["C"]) * itemsize % ROW_BYTES == 0
            and tensor_map.im2col_fits(int(shape["C"]) * int(shape["groups"]), itemsize, *_window(shape),
                                       ROW_BYTES // itemsize, BLOCK_M, _padding_after(shape) if cropped else None))


@functools.lru_cache(maxsize=1024)
def _map_arguments(shape_bytes: bytes, itemsize: int, block_n: int,
                   cropped: bool = False) -> tuple[tensor_map.MapArguments, tensor_map.MapArguments]:
    """The TMA build's two maps for an NhwcShape's bytes: x (N, H, W, C·G) read as im2col boxes of BLOCK_M pixels ×
    128 bytes (``cropped``: its box of window corners ending after the shape's cropped output), w (K·G, R·S·C) as
    boxes of block_n rows × 128 bytes."""
    shape = _unpack(shape_bytes)
    groups, channels = int(shape["groups"]), ROW_BYTES // itemsize
    x_map = tensor_map.im2col_arguments(int(shape["N"]), int(shape["H"]), int(shape["W"]),
                                        int(shape["C"]) * groups, itemsize, *_window(shape), channels, BLOCK_M,
                                        _padding_after(shape) if cropped else None)
    w_map = tensor_map.tiled_arguments(int(shape["K"]) * groups, int(shape["R"]) * int(shape["S"]) * int(shape["C"]),
                                       itemsize, channels, block_n)
    return x_map, w_map


def _unpack(shape_bytes: bytes) -> np.void:
    return np.frombuffer(shape_bytes, dtype=implicit_gemm_nhwc._NHWC_SHAPE)[0]


def _window(shape: np.void) -> tuple[tuple[int, int], ...]:
    """The convolution's window as tensor_map takes it: filter size, stride, padding and dilation, each (h, w)."""
    return tuple((int(shape[h]), int(shape[w])) for h, w in (("R", "S"), ("stride_h", "stride_w"),
                                                             ("pad_h", "pad_w"), ("dilation_h", "dilation_w")))


_maps = tensor_map.MapCache()


def _launch_tma(x_last: Any, w_last: Any, out: Any, shape: np.void, half: str | None, block_n: int,
                grid: tuple[int, int, int]) -> None:
    """The TMA build's launch: the barrier pipeline, or with FORWARD_PRODUCER set at this width the PRODUCER build's
    (one persistent CTA an SM, the producer warpgroup's first thread issuing the copies). Its maps hold the operands'
    addresses, which a recorded launch (_cuda.recording) must not keep: a recording gets a step that maps the
    addresses it is handed."""
    kernel, grid, threads, shared = _forward_build(half, block_n, out, grid, tma=True)
    implicit_gemm_nhwc.allow_shared_bytes(kernel, shared)
    x_arguments, w_arguments = _map_arguments(shape.tobytes(), x_last.dtype.itemsize, block_n)
    _launch_mapped(kernel, grid, threads, shared, functools.partial(_two_maps, x_arguments, w_arguments),
                   (x_last, w_last, layout.flat(out)), (shape,))


def _two_maps(first: tensor_map.MapArguments, second: tensor_map.MapArguments, first_address: int,
              second_address: int) -> tuple[np.void, np.void]:
    """A kernel's two tensor-map arguments, one over each operand (cached encodes)."""
    return _maps.get(first, first_address), _maps.get(second, second_address)


def _launch_mapped(kernel: Any, grid: tuple[int, int, int], threads: int, shared: int,
                   map_operands: Callable[[int, int], tuple[np.void, ...]], arrays: tuple[Any, Any, Any],
                   constants: tuple) -> None:
    """A TMA build's launch: its leading arguments the tensor maps ``map_operands`` makes of the first two of
    ``arrays``' addresses (the operands its maps read), then the third array (the one it writes) and ``constants``
    (the shape, ...). Its maps hold the operands' addresses, which a recorded launch (_cuda.recording, what a
    ReadyCall replays) must not keep: a recording gets a step that maps the addresses it is handed."""
    first, second, output = arrays
    leading = map_operands(first.data.ptr, second.data.ptr)
    kernel(grid, (threads,), (*leading, output, *constants), shared_mem=shared)
    _cuda.record(arrays, _mapped_launch_at, kernel, grid, threads, shared, map_operands, leading, constants)


def _mapped_launch_at(kernel: Any, grid: tuple[int, int, int], threads: int, shared: int,
                      map_operands: Callable[[int, int], tuple[np.void, ...]], leading: tuple[np.void, ...],
                      constants: tuple) -> Any:
    """A TMA launch as a recorded step: a callable taking the device addresses of its three arrays, which maps the
    first two anew (``leading``: the maps of the call recorded, whose slots each replay rewrites) and launches."""
    packed = _cuda.PackedLaunch(kernel, grid, (threads,), (*leading, _cuda.PER_CALL, *constants), shared)
    views = [packed.argument_view(position) for position in range(len(leading))]

    def launch_at(first_address: int, second_address: int, output_address: int) -> None:
        for view, value in zip(views, map_operands(first_address, second_address)):
            view[0] = value
        packed.launch_at(output_address)

    return launch_at


def tma_shared_bytes(block_n: int) -> int:
    """The TMA build's dynamic shared memory: the barrier build's, and an 8-byte mbarrier a stage after the
    stages."""
    return shared_bytes(block_n) + 8 * PIPELINES[block_n][0]


# implicit_gemm_wgmma.cu's Phases: a strided backward-data's phases (at most MAX_PHASES) in one launch.
MAX_PHASES = 4
_PHASES = np.dtype([("shape", implicit_gemm_nhwc._NHWC_SHAPE, (MAX_PHASES,)),
                    ("filter_offset", np.int32, (MAX_PHASES,)), ("first_tile", np.int32, (MAX_PHASES + 1,)),
                    ("count", np.int32)])


def phases_struct(shapes: list[np.void], filter_offsets: list[int]) -> tuple[np.void, tuple[int, int, int]]:
    """(the Phases argument, the grid) of one launch of up to MAX_PHASES placed forward products: ``shapes`` (each
    phase's NhwcShape, placed; all of one K and groups), ``filter_offsets`` (where each phase's turned sub-filter
    starts, in values, from the filters' base). The tiles of the phases follow one another along x, in the order
    given."""
    if not 0 < len(shapes) <= MAX_PHASES or len(filter_offsets) != len(shapes):
        raise ValueError(f"shapes and filter_offsets must be 1 to {MAX_PHASES} of each, got {len(shapes)} and "
                         f"{len(filter_offsets)}")
    block_n = tile_width(int(shapes[0]["K"]), "forward")
    phases = np.zeros((), dtype=_PHASES)
    first = 0
    for i, (shape, offset) in enumerate(zip(shapes, filter_offsets)):
        phases["shape"][i], phases["filter_offset"][i], phases["first_tile"][i] = shape, offset, first
        first += implicit_gemm_nhwc.forward_grid(shape, block_n)[0]
    phases["first_tile"][len(shapes):] = first
    phases["count"] = len(shapes)
    return phases[()], (first, 1, int(shapes[0]["groups"]))


def _launch_phases(dy_last: Any, filters: Any, dx: Any, phases: np.void, grid: tuple[int, int, int]) -> None:
    """dx (channels-last) receives every phase of ``phases`` (``phases_struct``'s): each a forward product of dy_last
    (N, P, Q, K) and its turned sub-filter in ``filters`` (C-contiguous, from its offset), stored at its places; with
    PHASES_TMA on at this width, through the TMA build where every phase fits."""
    _cuda.check_int32(dy_last, filters, dx)
    block_n = tile_width(int(phases["shape"][0]["K"]), "forward")
    tma = PHASES_TMA.get(block_n, False) and phases_tma_fits(phases, dy_last, filters)
    kernel = _kernel("implicit_gemm_wgmma_phases", convert.half_type_of(dx), block_n, y_last=True, placed=True,
                     tma=tma)
    if not tma:
        implicit_gemm_nhwc._launch_tile_kernel(kernel, grid, shared_bytes(block_n),
                                               (dy_last, filters, layout.flat(dx), phases))
        return
    shared = tma_shared_bytes(block_n)
    implicit_gemm_nhwc.allow_shared_bytes(kernel, shared)
    maps = _phase_map_arguments(phases.tobytes(), dy_last.dtype.itemsize, block_n)
    _launch_mapped(kernel, grid, THREADS, shared, functools.partial(_phase_maps, maps),
                   (dy_last, filters, layout.flat(dx)), (phases,))


def _launch_backward_filter(x_last: Any, dy_last: Any, sums: Any, problem: ConvProblem) -> None:
    """sums (K, R, S, C/G) float32 += x_last (N, H, W, C) and dy_last (N, P, Q, K), over slices of the N·P·Q pixels,
    the groups along the grid's z. A stage reduces one 128-byte row of pixels: 64 (half values) or 32 (TF32)."""
    _cuda.check_int32(x_last, dy_last, sums)
    block_n = tile_width(problem.K // problem.groups, "backward_filter")
    grid, per_split = implicit_gemm_nhwc.filter_gradient_grid(problem, ROW_BYTES // problem.itemsize,
                                                              SPLIT_K_WAVES * ctas_per_sm(block_n), block_n,
                                                              SPLIT_K_WITHIN_WAVES)
    if FILTER_TMA.get(block_n) and filter_tma_fits(problem, x_last, dy_last):
        _launch_filter_tma(x_last, dy_last, sums, problem, block_n, grid, per_split)
        return
    implicit_gemm_nhwc._launch_tile_kernel(_kernel("implicit_gemm_wgmma_backward_filter", problem.half_type, block_n),
                                           grid, backward_filter_shared_bytes(block_n, problem.half_type),
                                           (x_last, dy_last, sums, implicit_gemm_nhwc._shape_struct(problem),
                                            _cuda.i32(per_split)))


# The half backward-filter's stage: 64 pixels (a 128-byte row of half values, the MN-major panels' depth), and each
# panel 64 channels of x or 64 filters of dy wide: both maps' boxes are 64 × 64.
FILTER_STAGE_PIXELS = ROW_BYTES // 2


def filter_tma_fits(problem: ConvProblem, x_last: Any, dy_last: Any) -> bool:
    """Whether the half backward-filter's TMA build runs ``problem`` on x_last (N, H, W, C) and dy_last (N, P, Q, K):
    a half problem whose C per group fills whole 128-byte panels (64 values: an A panel is one tap's channels), whose
    x the copy engine can map as im2col boxes of a stage's pixels (tensor_map.im2col_fits) and whose dy rows lie a
    multiple of 16 bytes apart; both operands start on 16 bytes."""
    return (_filter_shape_fits(problem) and x_last.data.ptr % 16 == 0 and dy_last.data.ptr % 16 == 0)


@functools.lru_cache(maxsize=1024)
def _filter_shape_fits(problem: ConvProblem) -> bool:
    shape = implicit_gemm_nhwc._shape_struct(problem)
    return (problem.half_type is not None and int(shape["C"]) % FILTER_STAGE_PIXELS == 0 and problem.K % 8 == 0
            and tensor_map.im2col_fits(problem.C, 2, *_window(shape), FILTER_STAGE_PIXELS, FILTER_STAGE_PIXELS))


@functools.lru_cache(maxsize=1024)
def _filter_map_arguments(problem: ConvProblem) -> tuple[tensor_map.MapArguments, tensor_map.MapArguments]:
    """The half backward-filter's TMA maps: x (N, H, W, C) read as im2col boxes of a stage's 64 pixels × 128 bytes,
    dy (N·P·Q, K) as boxes of 64 pixel rows × 128 bytes of filters."""
    shape, pixels = implicit_gemm_nhwc._shape_struct(problem), FILTER_STAGE_PIXELS
    x_map = tensor_map.im2col_arguments(problem.N, problem.H, problem.W, problem.C, 2, *_window(shape), pixels,
                                        pixels)
    dy_map = tensor_map.tiled_arguments(problem.N * problem.P * problem.Q, problem.K, 2, pixels, pixels)
    return x_map, dy_map


def _launch_filter_tma(x_last: Any, dy_last: Any, sums: Any, problem: ConvProblem, block_n: int,
                       grid: tuple[int, int, int], per_split: int) -> None:
    """The half backward-filter's TMA launch, on the gathers' grid and split; recorded as the forward's is (its maps
    hold the operands' addresses)."""
    kernel = _kernel("implicit_gemm_wgmma_backward_filter", problem.half_type, block_n, tma=True)
    shared = tma_shared_bytes(block_n)
    implicit_gemm_nhwc.allow_shared_bytes(kernel, shared)
    x_arguments, dy_arguments = _filter_map_arguments(problem)
    _launch_mapped(kernel, grid, THREADS, shared, functools.partial(_two_maps, x_arguments, dy_arguments),
                   (x_last, dy_last, sums), (implicit_gemm_nhwc._shape_struct(problem), _cuda.i32(per_split)))


# implicit_gemm_wgmma.cu's PhaseMaps: the TMA phase kernel's two maps a phase, dy's then the sub-filters'.
_PHASE_MAPS = np.dtype([("dy", tensor_map.MAP_DTYPE, (MAX_PHASES,)), ("w", tensor_map.MAP_DTYPE, (MAX_PHASES,))])


def phases_tma_fits(phases: np.void, dy_last: Any, filters: Any) -> bool:
    """Whether the phase kernel's TMA build runs ``phases`` (``phases_struct``'s) on dy_last (N, P, Q, K) and the
    turned sub-filters in ``filters``: every phase's shape fits the TMA forward's checks, its box of window corners
    ending after its cropped output (``_padding_after``), and the operands start on 16 bytes (each sub-filter starts
    on 256, strided_dgrad's alignment)."""
    return (_phases_shape_fits(phases.tobytes(), dy_last.dtype.itemsize) and dy_last.data.ptr % 16 == 0
            and filters.data.ptr % 16 == 0)


def _padding_after(shape: np.void) -> tuple[int, int]:
    """The padding below and right of the image that makes an NhwcShape's output P × Q (h, w): a strided
    backward-data's phase is cropped to the dx rows and columns it reaches, so its padding after the image is not its
    padding before."""
    return tuple(int(shape[f"stride_{d}"]) * (int(shape[out]) - 1) + 1 + int(shape[f"dilation_{d}"])
                 * (int(shape[taps]) - 1) - int(shape[size]) - int(shape[f"pad_{d}"])
                 for d, out, taps, size in (("h", "P", "R", "H"), ("w", "Q", "S", "W")))


def _phase_shapes(phases_bytes: bytes) -> tuple[np.void, ...]:
    phases = np.frombuffer(phases_bytes, dtype=_PHASES)[0]
    return tuple(phases["shape"][i] for i in range(int(phases["count"])))


@functools.lru_cache(maxsize=256)
def _phases_shape_fits(phases_bytes: bytes, itemsize: int) -> bool:
    return all(_shape_fits(shape.tobytes(), itemsize, cropped=True) for shape in _phase_shapes(phases_bytes))


@functools.lru_cache(maxsize=256)
def _phase_map_arguments(phases_bytes: bytes, itemsize: int,
                         block_n: int) -> tuple[tuple[tensor_map.MapArguments, tensor_map.MapArguments, int], ...]:
    """Each phase's maps (the TMA forward's, dy's box of window corners ending after the phase's cropped output) and
    where its sub-filter (C·G, R_a·S_b·K) starts, in bytes from the filters' base."""
    offsets = np.frombuffer(phases_bytes, dtype=_PHASES)[0]["filter_offset"]
    return tuple((*_map_arguments(shape.tobytes(), itemsize, block_n, cropped=True), int(offsets[i]) * itemsize)
                 for i, shape in enumerate(_phase_shapes(phases_bytes)))


def _phase_maps(maps: tuple[tuple[tensor_map.MapArguments, tensor_map.MapArguments, int], ...], dy_address: int,
                filters_address: int) -> tuple[np.void]:
    """The TMA phase kernel's PhaseMaps argument over dy and the filters at these addresses (the phases past the
    launch's count left zero)."""
    packed = np.zeros((), dtype=_PHASE_MAPS)
    for i, (dy_map, w_map, offset) in enumerate(maps):
        packed["dy"][i] = _maps.get(dy_map, dy_address)
        packed["w"][i] = _maps.get(w_map, filters_address + offset)
    return (packed[()],)


register(ImplicitGemmWgmma())
