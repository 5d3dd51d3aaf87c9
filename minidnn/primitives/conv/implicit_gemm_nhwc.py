"""The ``implicit_gemm_nhwc`` algorithm: half-precision implicit GEMM on channels-last copies of the operands.

With the channels innermost, eight consecutive reduction values are 16 contiguous bytes: the kernels gather
whole 16-byte vectors (cp.async, three stages deep) where ``implicit_gemm`` gathers 2-byte values one by one.

A C-contiguous (NCHW) operand is first copied to (N, H, W, C) in the workspace (one transpose, a pass over
memory; layout.cu), the filter to (K, R, S, C); a channels-last operand (primitives/layout.py) is read as it is,
its buffer being that copy already. Forward writes y from its epilogue in y's layout: (N, K, P, Q), or a
channels-last y's (N, P, Q, K) buffer. Each direction is one GEMM (``implicit_gemm_nhwc.cu`` has the kernels):

    direction         rows M      columns N   reduction      operands (channels last)
    forward           N·P·Q       K           R·S·C          x (N, H, W, C), w (K, R, S, C)
    backward-data     N·H·W       C           R·S·K          dy (N, P, Q, K), w turned (C, R, S, K)
    backward-filter   R·S·C       K           N·P·Q, split   x (N, H, W, C), dy (N, P, Q, K)

Backward-data of a stride-1 convolution is a forward convolution of dy with the filter turned (its K and C swapped,
r and s reversed) and padding d·(R − 1) − pad, so it runs the forward kernel; strided ones are left to
``implicit_gemm`` and ``strided_dgrad``. A 16-byte vector must lie inside one tap (and one group), so the channels
that form the reduction (C/G forward, K/G backward-data, C/G and K/G backward-filter) must be multiples of 8. Where
one group's C are not (a first layer's 3 colour channels), forward and backward-filter run on copies padded with
zero channels to the next multiple (``padded_problem``), as cuDNN pads NHWC channels for its tensor cores: the zeros
add nothing to y, and backward-filter drops their sums. Groups: each is its own GEMM of the sizes above with one
group's C/G and K/G, on a slice of every pixel's channels; one launch runs them all, group g on the CTAs of
blockIdx.z = g. Backward-filter splits its long reduction over CTAs that add their partial sums into a float32 sum
with ``atomicAdd`` (not deterministic, like ``implicit_gemm``'s), laid (K, R, S, C/G) as the tiles' rows run so that
a warp's additions fall on few cache sectors; one launch lays it out as dw (K, C/G, R, S) when all are in, rounded
to the half type unless dw is float32. The kernels walk their pixels stage by stage without dividing.

Numerics: products of half values are exact in float32, the sums are float32, and each output is rounded
once, as in ``implicit_gemm``'s half build. The NumPy twin does the same on
the CPU: the same channels-last copies and turned filter, widened to float32, one product per tap, one
rounding.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import numpy as np

from ... import backend
from .. import _cuda, convert, layout
from .problem import ConvProblem
from . import registry
from .registry import ConvAlgorithm, register, store_half_filter_gradient, workspace_array
from .workspace import carved

SOURCE = "conv/implicit_gemm_nhwc.cu"
THREADS = 256
# implicit_gemm_nhwc.cu's tile: 128 rows, BLOCK_N columns (128, or 64 for products 64 columns wide or less),
# BLOCK_K reduction values a stage, STAGES stages, rows padded by PAD values (the half types' HALF macro:
# _cuda.HALF_BUILDS).
BLOCK_M, BLOCK_K, STAGES, PAD, VECTOR = 128, 32, 3, 8, 8
# A kernel gets more than 48 KiB of shared memory only when its dynamic limit is raised.
STATIC_SHARED_LIMIT = 48 * 1024
# Backward-filter's split of N·P·Q: about four waves of two CTAs per SM, but at least this many stages
# (BLOCK_K pixels each) per CTA, so that its atomicAdd of one tile stays small beside its products.
SPLIT_K_CTAS_PER_SM = 2 * 4
MIN_STEPS_PER_SPLIT = 16
# Workspace pieces start on 256-byte boundaries (the kernels' 16-byte copies need 16).
ALIGNMENT = 256
# The most workspace one call takes: larger batches run in chunks of images (a launch per chunk).
CHUNK_WORKSPACE = 60 << 20


def _aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


def _pieces(problem: ConvProblem, direction: str, images: int) -> list[tuple[tuple[int, ...], Any]]:
    """The workspace's arrays for ``direction`` on a chunk of ``images`` images, in order: (shape, dtype). What
    every chunk shares comes first (the filter's copy, the float32 dw), at the same place for a shorter last chunk.
    The copies hold 16-bit words for a half problem, float32 for implicit_gemm_wgmma's TF32 build."""
    C, H, W, K, R, S, P, Q, G = (problem.C, problem.H, problem.W, problem.K, problem.R, problem.S, problem.P,
                                 problem.Q, problem.groups)
    value = np.uint16 if problem.half_type else np.float32
    if direction == "forward":
        return [((K, R, S, C // G), value), ((images, H, W, C), value)]
    if direction == "backward_data":  # the turned filter, group after group: (G, C/G, R, S, K/G)
        return [((C, R, S, K // G), value), ((images, P, Q, K), value)]
    return [((K, R, S, C // G), np.float32), ((images, H, W, C), value), ((images, P, Q, K), value)]


def _piece_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """The workspace one piece takes, aligned as workspace_array places them."""
    return _aligned(math.prod(shape) * np.dtype(dtype).itemsize)


def _bytes(pieces: list[tuple[tuple[int, ...], Any]]) -> int:
    return sum(_piece_bytes(shape, dtype) for shape, dtype in pieces)


@functools.lru_cache(maxsize=1024)  # read on every call: worked out once per problem
def images_per_chunk(problem: ConvProblem, direction: str) -> int:
    """The whole batch, or the most images whose copies keep the workspace within CHUNK_WORKSPACE (at least one):
    the copies grow with the batch, and ResNet's 56 x 56 layers at batch 128 would need 98 MiB for backward-filter."""
    fixed = _bytes(_pieces(problem, direction, 0))
    per_image = _bytes(_pieces(problem, direction, 1)) - fixed
    return max(1, min(problem.N, (CHUNK_WORKSPACE - fixed) // per_image))


registry.cache_clearers.append(images_per_chunk.cache_clear)


def _chunks(problem: ConvProblem, direction: str, whole: bool = False):
    """(first image, the chunk's problem) for each chunk of the batch; ``whole``: the batch in one chunk when
    it needs no copies that grow with it (its source channels-last), only the first chunk's workspace pieces."""
    images = images_per_chunk(problem, direction)
    if images == problem.N or whole:  # the common case: the call's own problem, its launch struct already cached
        yield 0, problem
        return
    for first in range(0, problem.N, images):
        yield first, problem.with_batch(min(images, problem.N - first))


def _chunk_arrays(workspace: Any, problem: ConvProblem, chunk: ConvProblem, direction: str) -> list[Any]:
    """The workspace's arrays for ``chunk`` of ``problem``; a whole batch run without copies (``_chunks``'s
    ``whole``) gets those of a regular chunk, whose fixed pieces (the ones it uses) lie at the same places."""
    images = images_per_chunk(problem, direction)
    return _workspace_arrays(workspace, chunk if chunk.N <= images else problem.with_batch(images), direction)


def _workspace_arrays(workspace: Any, problem: ConvProblem, direction: str) -> list[Any]:
    """The workspace's arrays for a chunk of ``problem.N`` images (the chunk's problem); carved once per
    problem and direction from an eager step's shared workspace (:func:`.workspace.carved`)."""
    def carve() -> list[Any]:
        arrays, offset = [], 0
        for shape, dtype in _pieces(problem, direction, problem.N):
            arrays.append(workspace_array(workspace, shape, dtype, offset))
            offset += _piece_bytes(shape, dtype)
        return arrays
    return carved(workspace, (ImplicitGemmNhwc.name, problem, direction), carve)


class ImplicitGemmNhwc(ConvAlgorithm):
    """Half-precision implicit GEMM on channels-last copies, 16-byte copies into a three-stage pipeline; float16
    and bfloat16 problems only, the reduction's channels per group multiples of 8 (or, one group's C, padded to
    them), backward-data stride 1."""

    name = "implicit_gemm_nhwc"
    deterministic = False
    half_precision = True
    float32_weight_gradient = True
    channels_last = True  # reads channels-last buffers as its copies, writes a channels-last y from its epilogue

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return problem.half_type is not None and (vectors_fit(problem, direction, VECTOR)
                                                  or pads_channels(problem, direction))

    def is_deterministic(self, problem: ConvProblem, direction: str) -> bool:
        return not (direction == "backward_filter" and problem.device == "cuda")

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        if problem.device != "cuda":
            return 0  # the NumPy twin makes its own copies
        return chunk_workspace_bytes(padded_problem(problem) or problem, direction)

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        if not backend.is_cuda_array(x):
            _numpy_forward(_widened_channels_last(x, problem), _numpy_filter(w, problem, turned=False), problem, out)
            return
        _forward_by_chunks(x, w, problem, out, workspace, "forward")

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        if not backend.is_cuda_array(dy):
            _numpy_forward(_widened_channels_last(dy, problem), _numpy_filter(w, problem, turned=True),
                           backward_data_problem(problem), out)
            return
        _forward_by_chunks(dy, w, problem, out, workspace, "backward_data")

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        half = problem.half_type
        if not backend.is_cuda_array(x):
            dw = _numpy_backward_filter(_widened_channels_last(x, problem), _widened_channels_last(dy, problem),
                                        problem)
            store_half_filter_gradient(dw, out, half, accumulate)
            return
        _backward_filter_by_chunks(x, dy, problem, out, accumulate, workspace)


def vectors_fit(problem: ConvProblem, direction: str, vector: int) -> bool:
    """Whether ``direction`` of ``problem`` runs on 16-byte copies of ``vector`` values: each copy inside one tap
    and one group, so the channels that form the reduction (C/G forward, K/G backward-data, both backward-filter)
    are multiples of ``vector``; backward-data at stride 1 only (it runs forward's kernel on the turned filter)."""
    if (problem.C // problem.groups) % vector:
        return False
    if direction == "forward":
        return True
    return (problem.K // problem.groups) % vector == 0 and (direction == "backward_filter" or problem.stride == (1, 1))


def pads_channels(problem: ConvProblem, direction: str) -> bool:
    """Whether ``direction`` of ``problem`` runs on copies whose channels are padded with zeros (:func:`padded_problem`
    has a padded problem for it): forward, or backward-filter of K a multiple of the vector too (the 3 colour channels
    of a network's first layer). Backward-data reduces over K, and its C are the output's channels, so it is not
    padded."""
    return padded_problem(problem) is not None and (
        direction == "forward" or (direction == "backward_filter" and problem.K % _vector_values(problem) == 0))


def chunk_workspace_bytes(problem: ConvProblem, direction: str) -> int:
    """The workspace ``direction`` of ``problem`` (the one its kernels run: padded, paired) takes, a chunk of images
    at a time."""
    return _bytes(_pieces(problem, direction, images_per_chunk(problem, direction)))


def _vector_values(problem: ConvProblem) -> int:
    """The values of the problem's type in one 16-byte copy: 8 half values, 4 float32 ones (TF32)."""
    return 16 // problem.itemsize


@functools.lru_cache(maxsize=1024)  # read on every call: worked out once per problem
def padded_problem(problem: ConvProblem) -> ConvProblem | None:
    """The problem the GPU kernels of forward and backward-filter run where ``problem``'s C do not fill whole 16-byte
    vectors (one group): the same problem on C rounded up to them; None where they do. The copies of x and w then
    carry zero channels after their own (:func:`~minidnn.primitives.layout.to_channels_last_padded`), which add
    nothing to any sum, as cuDNN pads NHWC channels for its tensor-core kernels; backward-filter's sums of the zero
    channels are dropped."""
    vector = _vector_values(problem)
    if problem.groups != 1 or problem.C % vector == 0:
        return None
    return dataclasses.replace(problem, C=-(-problem.C // vector) * vector)


registry.cache_clearers.append(padded_problem.cache_clear)


@functools.lru_cache(maxsize=1024)  # read on every call: worked out once per problem
def paired_problem(problem: ConvProblem) -> ConvProblem | None:
    """The problem backward-filter can run on pixel pairs where ``problem``'s channels fill at most half a 16-byte
    vector (a network's first layer: 3 colour channels), one group, its stride along W even and no dilation there.

    Padded, each vector of x would carry one tap's channels and zeros; paired, vector m carries the channels of two
    columns, 2m − o and 2m − o + 1 (o = pad_w mod 2), each in its half, zeros after them. The window's taps s and
    s + 1 then lie in one vector, since every window starts on a column of parity o: a filter of ⌈S/2⌉ tap pairs,
    stride v/2 and padding ⌊pad_w/2⌋ along W, over as many vectors a row as the layer's Q output columns read (the
    last ones zeros where its windows reach into the right padding). The GEMM's rows (taps × channels) are about half
    the padded problem's; the sums of a last pair's second tap (S odd) are dropped. None where the layer does not
    take it."""
    half_vector = _vector_values(problem) // 2
    (u, v), (pad_h, pad_w), (_, d_w) = problem.stride, problem.padding, problem.dilation
    if problem.half_type is None or problem.groups != 1 or problem.C > half_vector or v % 2 or d_w != 1:
        return None
    pairs, pair_stride, pair_padding = -(-problem.S // 2), v // 2, pad_w // 2
    vectors = (problem.Q - 1) * pair_stride + pairs - 2 * pair_padding  # so that the pairs' own Q is the layer's
    return dataclasses.replace(problem, C=2 * half_vector, W=vectors, S=pairs, stride=(u, pair_stride),
                               padding=(pad_h, pair_padding))


registry.cache_clearers.append(paired_problem.cache_clear)


def pair_pixels(x_last: Any, out: Any, problem: ConvProblem) -> None:
    """out (N, H, W', V) = x_last (N, H, W, C) (any strides) as :func:`paired_problem`'s W' vectors of V values a row:
    vector m's first half the channels of column 2m − o, its second those of column 2m − o + 1, zeros elsewhere (and
    past the columns that are x's). Copied as they are: float16 values into the workspace's 16-bit words."""
    if out.dtype != x_last.dtype:
        out = out.view(x_last.dtype)
    out.fill(0)
    vectors, half_vector = out.shape[2], out.shape[3] // 2
    halves = out.reshape(*out.shape[:3], 2, half_vector)
    odd = problem.padding[1] % 2
    for half in (0, 1):
        column = half - odd  # vector 0's column in this half: −1 (padding) when o is 1
        first = 1 if column < 0 else 0
        columns = x_last[:, :, column + 2 * first::2, :][:, :, :vectors - first]
        halves[:, :, first:first + columns.shape[2], half, :problem.C] = columns


def numpy_paired_backward_filter(x: np.ndarray, dy: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """dw (K, C, R, S) float32 of ``problem`` computed on :func:`paired_problem`'s pixel pairs: the NumPy twin of
    the GPU path that copies x as pairs."""
    pairs = paired_problem(problem)
    x_pairs = np.zeros((pairs.N, pairs.H, pairs.W, pairs.C), np.float32)
    pair_pixels(_widened_channels_last(x, problem), x_pairs, problem)
    sums = _numpy_backward_filter(x_pairs, _widened_channels_last(dy, problem), pairs).transpose(0, 2, 3, 1)
    return unpair_sums(sums, problem).transpose(0, 3, 1, 2)


def unpair_sums(sums: Any, problem: ConvProblem) -> Any:
    """The float32 sums (K, R, ⌈S/2⌉, V) of :func:`paired_problem`'s problem as ``problem``'s (K, R, S, C): tap
    2s + j's channels are pair s's half j."""
    K, R, pairs, vector = sums.shape
    halves = sums.reshape(K, R, pairs, 2, vector // 2)[..., :problem.C]
    return backend.get_array_module(sums).ascontiguousarray(
        halves.reshape(K, R, 2 * pairs, problem.C)[:, :, :problem.S])


def backward_data_problem(problem: ConvProblem, rows: tuple[int, int] | None = None,
                          columns: tuple[int, int] | None = None) -> ConvProblem:
    """The forward problem that backward-data of stride-1 ``problem`` is: dy (N, K, P, Q) in, dx (N, C, H, W)
    out, the turned filter (C, K/G, R, S), padding d·(R − 1) − pad (negative where pad is wider), the same
    groups. ``rows`` and ``columns`` ((first, stop) of dx's): only those dx pixels, the output cropped to them (its
    padding less by first)."""
    (d_h, d_w), (pad_h, pad_w) = problem.dilation, problem.padding
    (first_h, stop_h), (first_w, stop_w) = rows or (0, problem.H), columns or (0, problem.W)
    padding = (d_h * (problem.R - 1) - pad_h - first_h, d_w * (problem.S - 1) - pad_w - first_w)
    return _ForwardOnDy(problem.N, problem.K, problem.P, problem.Q, problem.C, problem.R, problem.S, stop_h - first_h,
                        stop_w - first_w, padding, problem.dilation, problem.half_type, problem.groups)


class _ForwardOnDy:
    """A forward problem's sizes, for backward-data's turned convolution (its padding may be negative, which
    ConvProblem refuses; P and Q are given, since they are the original H and W)."""

    __slots__ = ("N", "C", "H", "W", "K", "R", "S", "P", "Q", "padding", "dilation", "half_type", "groups", "stride")

    def __init__(self, N, C, H, W, K, R, S, P, Q, padding, dilation, half_type, groups) -> None:
        self.N, self.C, self.H, self.W, self.K, self.R, self.S, self.P, self.Q = N, C, H, W, K, R, S, P, Q
        self.padding, self.dilation, self.half_type, self.groups = padding, dilation, half_type, groups
        self.stride = (1, 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ForwardOnDy) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in self.__slots__))


# ----------------------------------------------------------------------------------------------
# NumPy: the twin, on the same channels-last copies, float32 sums, one rounding
# ----------------------------------------------------------------------------------------------
def _widened_channels_last(array: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """(N, C, H, W) half storage -> (N, H, W, C) float32 (exact)."""
    return np.ascontiguousarray(convert.half_to_float(array, problem.half_type).transpose(0, 2, 3, 1))


def _numpy_filter(w: np.ndarray, problem: ConvProblem, turned: bool) -> np.ndarray:
    """w (K, C/G, R, S) half storage (or float32) -> float32 (K, R, S, C/G), or turned: (C, R, S, K/G) with r and s
    reversed, each group's filter turned on its own, group after group (the kernel's copy)."""
    wide = convert.half_to_float(w, problem.half_type) if problem.half_type else np.asarray(w, dtype=np.float32)
    if turned:
        K, group_channels, R, S = wide.shape
        groups, group_filters = problem.groups, K // problem.groups
        per_group = wide[:, :, ::-1, ::-1].reshape(groups, group_filters, group_channels, R, S)
        turned_groups = np.ascontiguousarray(per_group.transpose(0, 2, 3, 4, 1))  # (G, C/G, R, S, K/G)
        return turned_groups.reshape(groups * group_channels, R, S, group_filters)
    return np.ascontiguousarray(wide.transpose(0, 2, 3, 1))


def _tap_views(x_last: np.ndarray, problem: Any):
    """Each tap (r, s) with the (N, P, Q, C) view of channels-last x it reads: row p·u − pad_h + r·d_h of x,
    zero outside (padding may be negative: a crop)."""
    (u, v), (pad_h, pad_w), (d_h, d_w) = problem.stride, problem.padding, problem.dilation
    P, Q, H, W = problem.P, problem.Q, problem.H, problem.W
    # Zeros enough on each side for every row the taps read, then each tap's rows start at r·d_h − pad_h + low.
    low_h, low_w = max(pad_h, 0), max(pad_w, 0)
    high_h = max(0, (P - 1) * u + (problem.R - 1) * d_h - pad_h - (H - 1))
    high_w = max(0, (Q - 1) * v + (problem.S - 1) * d_w - pad_w - (W - 1))
    padded = np.pad(x_last, ((0, 0), (low_h, high_h), (low_w, high_w), (0, 0)))
    for r in range(problem.R):
        for s in range(problem.S):
            top, left = r * d_h - pad_h + low_h, s * d_w - pad_w + low_w
            yield r, s, padded[:, top:top + (P - 1) * u + 1:u, left:left + (Q - 1) * v + 1:v, :]


def _group_slices(problem: Any):
    """Each group's slice of the channels C and of the filters K."""
    group_channels, group_filters = problem.C // problem.groups, problem.K // problem.groups
    for g in range(problem.groups):
        yield (slice(g * group_channels, (g + 1) * group_channels),
               slice(g * group_filters, (g + 1) * group_filters))


def _numpy_forward(x_last: np.ndarray, w_last: np.ndarray, problem: Any, out: np.ndarray) -> None:
    """out (N, K, P, Q), half storage = x_last (N, H, W, C) ⋆ w_last (K, R, S, C/G), group by group: float32 sums,
    one rounding."""
    y = np.zeros((problem.N, problem.P, problem.Q, problem.K), dtype=np.float32)
    for r, s, view in _tap_views(x_last, problem):
        for channels, filters in _group_slices(problem):
            y[..., filters] += view[..., channels] @ w_last[filters, r, s, :].T
    convert.float_to_half(np.ascontiguousarray(y.transpose(0, 3, 1, 2)), problem.half_type, out=out)


def _numpy_backward_filter(x_last: np.ndarray, dy_last: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """dw (K, C/G, R, S) float32 = Σ over pixels of dy_last (N, P, Q, K) and each tap's view of x_last, group by
    group."""
    dy_rows = dy_last.reshape(-1, problem.K)
    dw = np.empty((problem.K, problem.R, problem.S, problem.C // problem.groups), dtype=np.float32)
    for r, s, view in _tap_views(x_last, problem):
        x_rows = np.ascontiguousarray(view).reshape(-1, problem.C)
        for channels, filters in _group_slices(problem):
            dw[filters, r, s, :] = dy_rows[:, filters].T @ x_rows[:, channels]
    return np.ascontiguousarray(dw.transpose(0, 3, 1, 2))


# ----------------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------------
def _kernel(name: str, half: str, block_n: int = 128, y_last: bool = False) -> Any:
    """``name``'s build for the half type and tile width; ``y_last``: forward's store to a channels-last y."""
    return _cuda.function(SOURCE, name, np.float32, _cuda.HALF_BUILDS[half] + (("BLOCK_N", block_n),)
                          + ((("Y_LAST", 1),) if y_last else ()))


def _block_n(columns: int) -> int:
    """The tile's width: 64 for a product 64 columns wide or less (a 128-wide tile would be half empty)."""
    return 64 if columns <= 64 else 128


def _shared_bytes(direction: str, block_n: int) -> int:
    if direction == "forward":  # the pipeline's [row][k] tiles, or the output tile after it (either order)
        return max(STAGES * (BLOCK_M + block_n) * (BLOCK_K + PAD) * 2, block_n * (BLOCK_M + PAD) * 2,
                   BLOCK_M * (block_n + PAD) * 2)
    return STAGES * BLOCK_K * (BLOCK_M + PAD + block_n + PAD) * 2


_raised: set = set()  # kernels whose dynamic shared-memory limit has been raised


def _launch_tile_kernel(kernel: Any, grid: tuple[int, ...], shared_bytes: int, args: tuple,
                        threads: int = THREADS) -> None:
    allow_shared_bytes(kernel, shared_bytes)
    _cuda.launch_blocks(kernel, grid, threads, args, shared_bytes=shared_bytes)


def allow_shared_bytes(kernel: Any, shared_bytes: int) -> None:
    """Raise ``kernel``'s dynamic shared-memory limit to ``shared_bytes`` where that is over the static 48 KiB
    (once a kernel)."""
    if shared_bytes > STATIC_SHARED_LIMIT and kernel not in _raised:
        kernel.max_dynamic_shared_size_bytes = shared_bytes
        _raised.add(kernel)


def forward_grid(shape: np.void, block_n: int) -> tuple[int, int, int]:
    """The forward kernel's grid for ``shape`` (an NhwcShape, C and K per group): one group's tiles of
    BLOCK_M rows of N·P·Q by ``block_n`` of its K filters along x, the groups along z."""
    rows = int(shape["N"]) * int(shape["P"]) * int(shape["Q"])
    return -(-rows // BLOCK_M) * -(-int(shape["K"]) // block_n), 1, int(shape["groups"])


def _launch_forward(x_last: Any, w_last: Any, out: Any, shape: np.void) -> None:
    """out (N, K, P, Q), C-contiguous or channels-last, = x_last (N, H, W, C) ⋆ w_last (K, R, S, C/G), for
    ``shape``."""
    _cuda.check_int32(x_last, w_last, out)
    block_n = _block_n(int(shape["K"]))
    half = convert.half_type_of(out)
    y_last = layout.is_channels_last(out)
    _launch_tile_kernel(_kernel("implicit_gemm_nhwc_forward", half, block_n, y_last), forward_grid(shape, block_n),
                        _shared_bytes("forward", block_n), (x_last, w_last, layout.flat(out), shape))


def filter_gradient_tiles(problem: ConvProblem, block_n: int | None = None) -> int:
    """Backward-filter's output tiles in one group: R·S·C/G rows by K/G columns, in tiles of BLOCK_M by ``block_n``
    (by default the width ``_block_n`` gives K/G)."""
    group_filters = problem.K // problem.groups
    rows = problem.R * problem.S * (problem.C // problem.groups)
    return -(-rows // BLOCK_M) * -(-group_filters // (block_n or _block_n(group_filters)))


def steps_per_split(problem: ConvProblem, sms: int, block_k: int, ctas_per_sm: int, block_n: int | None = None,
                    within_waves: bool = False) -> int:
    """Backward-filter's stages of ``block_k`` pixels per CTA: enough slices of N·P·Q for ``ctas_per_sm`` CTAs on
    each of ``sms`` SMs (each kernel's own BLOCK_K and CTAs to aim at), every group's tiles (``block_n`` wide)
    counted. The slices a tile are the CTAs aimed at over the tiles, rounded up; ``within_waves`` rounds them down, so
    that the grid never holds more CTAs than the waves aimed at: rounded up, the last few tiles' slices can make a
    wave of their own, which runs on a few SMs while the others wait."""
    steps = -(-problem.N * problem.P * problem.Q // block_k)
    tiles = filter_gradient_tiles(problem, block_n) * problem.groups
    slots = ctas_per_sm * sms
    wanted = max(1, slots // tiles) if within_waves else -(-slots // tiles)
    return max(MIN_STEPS_PER_SPLIT, -(-steps // wanted), -(-steps // _cuda.MAX_GRID_Y))


def filter_gradient_grid(problem: ConvProblem, block_k: int, ctas_per_sm: int, block_n: int | None = None,
                         within_waves: bool = False) -> tuple[tuple[int, int, int], int]:
    """Backward-filter's grid and its stages per slice, for a kernel of ``block_k`` pixels a stage aiming at
    ``ctas_per_sm`` (``within_waves``: at most that many, :func:`steps_per_split`): one group's tiles (``block_n``
    wide) along x, the slices of N·P·Q along y, the groups along z."""
    per_split = steps_per_split(problem, _cuda.sm_count(), block_k, ctas_per_sm, block_n, within_waves)
    steps = -(-problem.N * problem.P * problem.Q // block_k)
    return (filter_gradient_tiles(problem, block_n), -(-steps // per_split), problem.groups), per_split


def _launch_backward_filter(x_last: Any, dy_last: Any, sums: Any, problem: ConvProblem) -> None:
    """sums (K, R, S, C/G) float32 += x_last (N, H, W, C) and dy_last (N, P, Q, K), over slices of the N·P·Q pixels,
    the groups along the grid's z."""
    _cuda.check_int32(x_last, dy_last, sums)
    block_n = _block_n(problem.K // problem.groups)
    grid, per_split = filter_gradient_grid(problem, BLOCK_K, SPLIT_K_CTAS_PER_SM)
    _launch_tile_kernel(_kernel("implicit_gemm_nhwc_backward_filter", problem.half_type, block_n), grid,
                        _shared_bytes("backward_filter", block_n),
                        (x_last, dy_last, sums, _shape_struct(problem), _cuda.i32(per_split)))


def _forward_by_chunks(source: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any, direction: str,
                       launch: Callable[[Any, Any, Any, np.void], None] | None = None) -> None:
    """Forward (source x) or stride-1 backward-data (source dy, the filter turned) on the GPU: the filter's copy
    once, then per chunk of images the source's channels-last copy and one ``launch`` (the forward kernel's,
    by default) into out's slice. A channels-last source is read as it is, and so is a channels-last filter
    in forward (no copies); out may be either layout."""
    launch = launch or _launch_forward
    turned = direction == "backward_data"
    padded = None if turned else padded_problem(problem)  # forward's channels padded where they fill no vectors
    work = padded or problem
    filter_last = None if turned or padded is not None or not layout.is_channels_last(w) else layout.buffer(w)
    for first, chunk in _chunks(work, direction, whole=layout.is_channels_last(source) and padded is None):
        w_last, source_last = _chunk_arrays(workspace, work, chunk, direction)
        source_last = _channels_last_buffer(source[first:first + chunk.N], source_last)
        if filter_last is not None:
            w_last = filter_last
        elif first == 0 and padded is not None:
            layout.to_channels_last_padded(w, w_last)
        elif first == 0:
            layout.filter_to_channels_last(w, w_last, turned, problem.groups)
        shape = backward_data_problem(chunk) if turned else chunk
        launch(source_last, w_last, out[first:first + chunk.N], _shape_struct(shape))


def _backward_filter_by_chunks(x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool, workspace: Any,
                               launch: Callable[[Any, Any, Any, ConvProblem], None] | None = None,
                               paired: bool = False) -> None:
    """Backward-filter on the GPU: per chunk of images the channels-last copies of x and dy and one ``launch``
    (this file's kernel, by default) adding into one float32 sum in the workspace, laid (K, R, S, C) as the kernels'
    tile rows run (so that their atomic additions are coalesced); then one launch lays it out as out (K, C/G, R, S),
    float32 or rounded to the half type, added to out when accumulating. ``paired``: x's copy is
    :func:`paired_problem`'s pixel pairs where the problem takes them, instead of its channels padded."""
    launch = launch or _launch_backward_filter
    pairs = paired_problem(problem) if paired else None
    padded = None if pairs else padded_problem(problem)  # x's channels padded where they fill no vectors
    work = pairs or padded or problem
    whole = work is problem and layout.is_channels_last(x) and layout.is_channels_last(dy)
    for first, chunk in _chunks(work, "backward_filter", whole=whole):
        sums, x_last, dy_last = _chunk_arrays(workspace, work, chunk, "backward_filter")
        if first == 0:  # every chunk adds into the one float32 sum
            sums.fill(0)
        x_chunk = x[first:first + chunk.N]
        if pairs is not None:
            pair_pixels(x_chunk.transpose(0, 2, 3, 1), x_last, problem)
        launch(x_last if pairs is not None else _channels_last_buffer(x_chunk, x_last),
               _channels_last_buffer(dy[first:first + chunk.N], dy_last), sums, chunk)
    if pairs is not None:
        sums = unpair_sums(sums, problem)
    elif padded is not None:  # the padded channels' sums (zeros) dropped
        sums = backend.get_array_module(sums).ascontiguousarray(sums[..., :problem.C])
    _finish_filter_gradient(sums, out, problem, accumulate)


def _finish_filter_gradient(sums: Any, out: Any, problem: ConvProblem, accumulate: bool) -> None:
    """out (K, C/G, R, S), float32 or half words, = sums (its float32 values, laid (K, R, S, C/G)), plus out's own
    values when ``accumulate``; a half out is rounded once."""
    name = "filter_gradient_to_float" if out.dtype == np.float32 else "filter_gradient_to_half"
    # A float32 problem (implicit_gemm_wgmma's TF32 build) has no half type: filter_gradient_to_float, float32 in
    # and out, is the same kernel in every build.
    _cuda.launch(_kernel(name, problem.half_type or "bfloat16"), out.size,
                 (sums, out, _cuda.i32(problem.K), _cuda.i32(problem.C // problem.groups),
                  _cuda.i32(problem.R * problem.S),
                  _cuda.i32(int(accumulate))))


def _channels_last_buffer(array: Any, copy: Any) -> Any:
    """The (N, H, W, C) buffer of ``array`` (N, C, H, W): its own for a channels-last array, else ``copy``
    (a workspace array of that shape) filled by the transpose; ``copy`` (N, H, W, C') with padded channels
    (:func:`padded_problem`) is filled with zeros after the array's own."""
    if copy.shape[-1] != array.shape[1]:
        layout.to_channels_last_padded(array, copy)
        return copy
    if layout.is_channels_last(array):
        return layout.buffer(array)
    _to_channels_last(array, copy)
    return copy


def _to_channels_last(array: Any, out: Any) -> None:
    """(N, C, H, W) -> out (N, H, W, C), words of the item size (layout.cu's transpose)."""
    N, C, H, W = array.shape
    layout.transpose_planes(layout.contiguous(array), out, C, H * W)


@functools.lru_cache(maxsize=1024)
def _shape_struct(problem: Any, placement: tuple[int, int, int, int] | None = None) -> np.void:
    """The problem as channels_last.cuh's NhwcShape, C and K one group's (built once per problem); ``placement``
    (out_image, out_row, out_column, out_first): where the Y_PLACED build stores output pixel (n, p, q), by default
    in order."""
    groups = problem.groups
    placement = placement or (problem.P * problem.Q, problem.Q, 1, 0)
    return np.array([(problem.N, problem.C // groups, problem.H, problem.W, problem.K // groups, problem.R, problem.S,
                      problem.P, problem.Q, *problem.stride, *problem.padding, *problem.dilation, groups, *placement)],
                    dtype=_NHWC_SHAPE)[0]


_NHWC_SHAPE = np.dtype([(name, np.int32) for name in (
    "N", "C", "H", "W", "K", "R", "S", "P", "Q", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h",
    "dilation_w", "groups", "out_image", "out_row", "out_column", "out_first")])


register(ImplicitGemmNhwc())
