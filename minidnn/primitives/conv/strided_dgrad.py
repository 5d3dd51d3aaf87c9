"""The ``strided_dgrad`` algorithm: backward-data of a strided convolution as u·v stride-1 ones.

With stride u, input row h receives gradient only from the filter rows r ≡ h + pad (mod u): the other
taps would read dy between its samples, where it is zero. Gathering dy for every tap, as the direct
and implicit-GEMM backward-data do, spends 1 − 1/(u·v) of the multiply-adds on those zeros. Split
dx by phase instead (CUTLASS's strided dgrad): for each (a, b) in [0, u) × [0, v), the rows
h ≡ a − pad_h (mod u) and columns w ≡ b − pad_w (mod v) of dx are the stride-1, unpadded
backward-data of dy with the sub-filter w[:, :, a::u, b::v]:

    dx[n, c, u·h' + a − pad_h, v·w' + b − pad_w] = Σ_k Σ_i Σ_j w[k, c, a + u·i, b + v·j] · dy[n, k, h' − i, w' − j]

that is, dx_ab (N, C, P + R_a − 1, Q + S_b − 1) = backward-data of a stride-1 convolution whose filter
has R_a = ⌈(R − a)/u⌉ × S_b = ⌈(S − b)/v⌉ taps and whose output is dy. Every dx pixel lies in exactly
one phase; a phase without taps (u > R) has zero gradient. Every multiply-add is one the answer needs.

Three ways to run the phases:

* **In one launch** (GPU, when every phase has taps, as on every strided 3×3 and 7×7 layer):
  implicit_gemm.cu's phase kernel, blockIdx.z the phase, each phase's rows its own dx pixels and its
  reduction K/G·R_a·S_b; every pixel is written once, in place. No workspace, no copies.
* **On wgmma, the phases in one launch, each writing its pixels in place** (a channels-last problem on Hopper whose
  every phase ``implicit_gemm_wgmma`` runs, TF32 or half, at strides up to 4 × 4): each phase is that kernel's
  backward-data, a forward convolution of dy as it lies with the phase's turned sub-filter, its output cropped to the
  dx rows and columns the phase reaches (``implicit_gemm_nhwc.backward_data_problem``'s padding less by the first of
  them), and each output pixel stored at its own place in dx (channels_last.cuh's Y_PLACED build: image, row and
  column strides H·W, u·W and v). The phases' tiles share one grid (implicit_gemm_wgmma.cu's phase kernel, up to
  four phases a launch), longest reduction first, so the short phases' CTAs fill the long ones' last wave. No dx_ab,
  no layout changes; dx is zeroed first only where the phases leave pixels unwritten. Workspace: every phase's turned
  channels-last sub-filter, all laid out in one pass over w (strided_dgrad.cu, a transpose through shared memory).
* **One after another** (the NumPy twin; and on the GPU a stride wider than the filter, the 1×1
  stride-2 shortcuts, whose phases without taps the one-launch kernel has not been run on): dx is
  zeroed, then each phase with taps runs as one ``implicit_gemm`` backward-data call on a contiguous
  copy of its sub-filter, into dx_ab in the workspace, and is copied onto its strided slice of dx.
  Workspace: the largest phase's dx_ab and sub-filter, 256-byte aligned.

Numerics: the same products as the direct backward-data, summed in another order. Stride-1 and
dilated problems are left to the other algorithms. Half precision (float16, bfloat16) runs as the float
types do, on implicit GEMM's half build (float32 sums, one rounding per dx pixel, each pixel in one
phase), except that a 1x1 phase (the strided 1x1 shortcuts') runs as ``gemm_1x1``'s half GEMM.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ... import backend
from .. import _cuda, layout
from . import implicit_gemm, implicit_gemm_nhwc, implicit_gemm_wgmma
from .problem import ConvProblem
from .registry import ConvAlgorithm, get, register, supports, workspace_array


def phase_taps(size: int, stride: int, phase: int) -> int:
    """How many filter taps r = phase, phase + stride, ... lie below ``size``: ⌈(size − phase)/stride⌉."""
    return max(0, -(-(size - phase) // stride))


def phase_problem(problem: ConvProblem, a: int, b: int) -> ConvProblem:
    """The stride-1, unpadded convolution whose backward-data gives phase (a, b) of dx, dy its output."""
    (u, v) = problem.stride
    taps_h, taps_w = phase_taps(problem.R, u, a), phase_taps(problem.S, v, b)
    return ConvProblem(problem.N, problem.C, problem.P + taps_h - 1, problem.Q + taps_w - 1, problem.K, taps_h, taps_w,
                       (1, 1), (0, 0), (1, 1), problem.groups, problem.dtype, problem.device)


def phase_span(extent: int, padding: int, stride: int, phase: int, length: int) -> tuple[int, int, int]:
    """(first, stop, start): rows first ≤ h' < stop of a phase's dx_ab that land inside dx (0 ≤ h <
    ``extent``), and start, the dx row of h' = first (h = stride·h' + phase − padding)."""
    first = max(0, -((phase - padding) // stride))  # ⌈(padding − phase)/stride⌉: the first h' with h ≥ 0
    stop = min(length, (extent - 1 + padding - phase) // stride + 1)
    return first, stop, stride * first + phase - padding


@functools.lru_cache(maxsize=256)
def largest_phase(problem: ConvProblem) -> int:
    """The most dx pixels of any phase, N·(rows)·(columns), as the kernel counts them (every h' whose
    dx row lies inside dx): the grid's row tiles cover it."""
    (u, v), (pad_h, pad_w) = problem.stride, problem.padding

    def inside(extent: int, padding: int, stride: int, phase: int) -> int:
        first, stop, _ = phase_span(extent, padding, stride, phase, length=extent + padding + 1)
        return max(0, stop - first)

    return problem.N * max(inside(problem.H, pad_h, u, a) for a in range(u)) * \
        max(inside(problem.W, pad_w, v, b) for b in range(v))


def in_one_launch(problem: ConvProblem) -> bool:
    """Whether ``problem`` runs as the GPU's one-launch phase kernel (else phase by phase)."""
    return problem.device == "cuda" and implicit_gemm.every_phase_has_taps(problem)


def on_wgmma(problem: ConvProblem) -> bool:
    """Whether ``problem``'s phases run on ``implicit_gemm_wgmma``, each writing its pixels of a channels-last dx in
    place: a channels-last problem on the GPU whose every phase that kernel's backward-data takes (Hopper; a float32
    problem with TF32 allowed)."""
    return problem.channels_last and problem.device == "cuda" and _phases_on_wgmma(problem, _cuda.allow_tf32())


@functools.lru_cache(maxsize=256)  # asked on every call: worked out once per problem and TF32 switch
def _phases_on_wgmma(problem: ConvProblem, tf32: bool) -> bool:
    wgmma = get(implicit_gemm_wgmma.ImplicitGemmWgmma.name)
    found, (u, v) = phases(problem), problem.stride
    return bool(found) and u * v <= MAX_TURNED_PHASES and all(
        supports(wgmma, phase.laid_out(True), "backward_data") for _, _, phase, _, _ in found)


ALIGNMENT = 256  # bytes between the two arrays carved from the workspace, phase by phase


def _aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


class StridedDgrad(ConvAlgorithm):
    name = "strided_dgrad"
    deterministic = True  # each dx pixel is written once (by one CTA, or by one phase's copy)
    half_precision = True  # implicit GEMM's half build, in one launch or phase by phase

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return direction == "backward_data" and problem.stride != (1, 1) and problem.dilation == (1, 1)

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        if on_wgmma(problem):  # every phase's turned sub-filter
            return _placed_launches(problem)[1] * problem.itemsize
        if in_one_launch(problem):
            return 0
        # Phase (0, 0) has the most taps in both directions, so the largest dx_ab and sub-filter.
        largest = phase_problem(problem, 0, 0)
        return _aligned(largest.N * largest.C * largest.H * largest.W * problem.itemsize) + _taps_bytes(problem)

    def run_in_layout(self, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
                      accumulate: bool, workspace: Any) -> None:
        """A problem whose phases run on wgmma: dy read channels-last (laid out first where it is not), dx written
        channels-last (through a channels-last temporary where ``out`` is not); any other on C-contiguous
        operands."""
        if not on_wgmma(problem):
            super().run_in_layout(direction, first, second, problem, out, accumulate, workspace)
            return
        dy = layout.to_channels_last(first)
        layout.write_channels_last(out, lambda dx: _phases_in_place(dy, second, problem, dx, workspace))

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        if in_one_launch(problem):
            implicit_gemm.backward_data_by_phase(dy, w, problem, out, largest_phase(problem))
            return
        (u, v) = problem.stride
        out.fill(0)  # phases without taps, and rows no dy sample reaches, stay zero
        for a, b, phase, (first_h, stop_h, start_h), (first_w, stop_w, start_w) in phases(problem):
            dx = workspace_array(workspace, phase.x_shape, problem.dtype)
            taps = workspace_array(workspace, phase.w_shape, problem.dtype, offset=_aligned(dx.nbytes))
            taps[...] = w[:, :, a::u, b::v]
            get(phase_algorithm(phase)).backward_data(dy, taps, phase, dx, None)
            out[:, :, start_h:start_h + u * (stop_h - first_h):u, start_w:start_w + v * (stop_w - first_w):v] = \
                dx[:, :, first_h:stop_h, first_w:stop_w]


def _taps_bytes(problem: ConvProblem) -> int:
    """The bytes of phase (0, 0)'s sub-filter, the largest (it has the most taps in both directions)."""
    return math.prod(turned_shape(problem, phase_problem(problem, 0, 0))) * problem.itemsize


def turned_shape(problem: ConvProblem, phase: ConvProblem) -> tuple[int, int, int, int]:
    """A phase's turned channels-last sub-filter, (C, R_a, S_b, K/G): each group's filters last."""
    return problem.C, phase.R, phase.S, problem.K // problem.groups


def _phases_in_place(dy: Any, w: Any, problem: ConvProblem, dx: Any, workspace: Any) -> None:
    """dx (channels-last) = backward-data of ``problem`` from dy (channels-last): every phase's turned sub-filter
    copied into the workspace, then the phases in one launch of implicit_gemm_wgmma's phase kernel (up to its
    MAX_PHASES a launch) on dy's buffer, each storing its pixels at their places in dx (the module docstring's third
    way)."""
    launches, filter_values, leaves_pixels = _placed_launches(problem)
    filters = workspace_array(workspace, (filter_values,), problem.dtype)
    if leaves_pixels:  # pixels no phase writes (phases without taps, rows no dy reaches) get no gradient
        layout.flat(dx).fill(0)  # C-contiguous: a memset on the GPU
    turn_phase_filters(w, filters, problem)
    for _, phases_argument, grid in launches:
        implicit_gemm_wgmma._launch_phases(layout.flat(dy), filters, dx, phases_argument, grid)


@functools.lru_cache(maxsize=256)  # every call of a step asks: worked out once per problem
def _placed_launches(problem: ConvProblem) -> tuple[tuple[Any, ...], int, bool]:
    """(launches, the values of all turned sub-filters, whether the phases leave pixels of dx unwritten). Each launch
    is ((a, b, the phase's problem, its sub-filter's offset in values), ...), its Phases argument and its grid: up
    to MAX_PHASES phases that reach dx, the longest reductions first. A phase's shape is its backward-data cropped to
    the dx rows and columns it reaches, each output pixel (n, i, j) placed at dx's (n, start_h + u·i, start_w + v·j);
    each sub-filter starts on a 256-byte boundary, which keeps the kernel's 16-byte copies aligned."""
    (u, v), H, W = problem.stride, problem.H, problem.W
    itemsize = problem.itemsize
    placed, written, offset = [], 0, 0
    for a, b, phase, (first_h, stop_h, start_h), (first_w, stop_w, start_w) in sorted(
            phases(problem), key=lambda found: -found[2].R * found[2].S):
        cropped = implicit_gemm_nhwc.backward_data_problem(phase, (first_h, stop_h), (first_w, stop_w))
        placement = (H * W, u * W, v, start_h * W + start_w)
        placed.append(((a, b, phase, offset), implicit_gemm_nhwc._shape_struct(cropped, placement)))
        written += (stop_h - first_h) * (stop_w - first_w)
        offset += _aligned(math.prod(turned_shape(problem, phase)) * itemsize) // itemsize
    launches = []
    for first in range(0, len(placed), implicit_gemm_wgmma.MAX_PHASES):
        chunk = placed[first:first + implicit_gemm_wgmma.MAX_PHASES]
        argument, grid = implicit_gemm_wgmma.phases_struct([shape for _, shape in chunk],
                                                           [turn[3] for turn, _ in chunk])
        launches.append((tuple(turn for turn, _ in chunk), argument, grid))
    return tuple(launches), offset, written != H * W


# strided_dgrad.cu's PhaseOffsets: the phases whose sub-filters its one pass lays out, strides up to 4 × 4 (wider
# ones run the generic paths).
MAX_TURNED_PHASES = 16
_PHASE_OFFSETS = np.dtype([("at", np.int32, (MAX_TURNED_PHASES,))])


def turn_phase_filters(w: Any, filters: Any, problem: ConvProblem) -> None:
    """filters (a flat array: the wgmma path's workspace) = every run phase's turned channels-last sub-filter, phase
    (a, b)'s w[:, :, a::u, b::v] laid (C, R_a, S_b, K/G) with its taps reversed (each group's on its own), at the
    offset ``_placed_launches`` gives it; w (K, C/G, R, S) read at its strides. On the GPU one pass of
    strided_dgrad.cu's phase_filters (a transpose through shared memory); on NumPy phase by phase, its twin."""
    (u, v), groups = problem.stride, problem.groups
    launches, _, _ = _placed_launches(problem)
    if backend.get_array_module(w) is np:
        for turns, _, _ in launches:
            for a, b, phase, offset in turns:
                shape = turned_shape(problem, phase)
                sub_filter = w[:, :, a::u, b::v].reshape(groups, problem.K // groups, problem.C // groups, phase.R,
                                                         phase.S)
                filters[offset:offset + math.prod(shape)] = \
                    sub_filter[:, :, :, ::-1, ::-1].transpose(0, 2, 3, 4, 1).reshape(-1)
        return
    _cuda.check_int32(w, filters)
    K, group_channels, R, S = w.shape
    kernel = _cuda.function("conv/strided_dgrad.cu", f"phase_filters_{w.itemsize}", np.float32)
    _cuda.launch_blocks(kernel, (-(-group_channels * R * S // 32), -(-K // 32)), 256, (
        w, filters, _cuda.i32(K), _cuda.i32(group_channels), _cuda.i32(R), _cuda.i32(S), _cuda.i32(u), _cuda.i32(v),
        _cuda.i32(groups), *(np.int64(stride // w.itemsize) for stride in w.strides), _phase_offsets(problem)))


@functools.lru_cache(maxsize=256)  # every call of a step asks: worked out once per problem
def _phase_offsets(problem: ConvProblem) -> np.void:
    """strided_dgrad.cu's PhaseOffsets for ``problem``: each run phase's offset, −1 for the others."""
    offsets = np.full((), -1, dtype=_PHASE_OFFSETS)
    for turns, _, _ in _placed_launches(problem)[0]:
        for a, b, _, offset in turns:
            offsets["at"][a * problem.stride[1] + b] = offset
    return offsets[()]


def phase_algorithm(phase: ConvProblem) -> str:
    """What runs one phase's backward-data: implicit GEMM; for a half 1x1 phase (a 1x1 shortcut's only one)
    gemm_1x1, whose half GEMM multiplies every row it reads where implicit GEMM's gather would run the
    phase's whole reduction tile by tile. (Float phases keep implicit GEMM, as they were measured.)"""
    return "gemm_1x1" if phase.half_type is not None and phase.is_1x1 else "implicit_gemm"


@functools.lru_cache(maxsize=256)  # worked out once per problem
def phases(problem: ConvProblem) -> list[tuple[int, int, ConvProblem, tuple[int, int, int], tuple[int, int, int]]]:
    """(a, b, the phase's problem, its row span, its column span) of every phase with taps that reaches dx."""
    (u, v), (pad_h, pad_w) = problem.stride, problem.padding
    found = []
    for a in range(u):
        for b in range(v):
            phase = phase_problem(problem, a, b)
            if phase.R == 0 or phase.S == 0:
                continue
            rows = phase_span(problem.H, pad_h, u, a, phase.H)
            cols = phase_span(problem.W, pad_w, v, b, phase.W)
            if rows[0] < rows[1] and cols[0] < cols[1]:
                found.append((a, b, phase, rows, cols))
    return found


register(StridedDgrad())
