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

Two ways to run the phases:

* **In one launch** (GPU, when every phase has taps, as on every strided 3×3 and 7×7 layer):
  implicit_gemm.cu's phase kernel, blockIdx.z the phase, each phase's rows its own dx pixels and its
  reduction K/G·R_a·S_b; every pixel is written once, in place. No workspace, no copies.
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
from typing import Any

from . import implicit_gemm
from .problem import ConvProblem
from .registry import ConvAlgorithm, get, register, workspace_array


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
        if in_one_launch(problem):
            return 0
        # Phase (0, 0) has the most taps in both directions, so the largest dx_ab and sub-filter.
        largest = phase_problem(problem, 0, 0)
        data = largest.N * largest.C * largest.H * largest.W * problem.itemsize
        taps = largest.K * (largest.C // largest.groups) * largest.R * largest.S * problem.itemsize
        return _aligned(data) + taps

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
