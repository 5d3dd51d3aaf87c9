"""The ``strided_dgrad`` algorithm: backward-data of a strided convolution as u·v stride-1 ones.

With stride u, input row h receives gradient only from the filter rows r ≡ h + pad (mod u): the other
taps would read dy between its samples, where it is zero. Gathering dy for every tap, as the direct
and implicit-GEMM backward-data do, spends 1 − 1/(u·v) of the multiply-adds on those zeros. Split
dx by phase instead (CUTLASS's strided dgrad): for each (a, b) in [0, u) × [0, v), the rows
h ≡ a − pad_h (mod u) and columns w ≡ b − pad_w (mod v) of dx are the stride-1, unpadded
backward-data of dy with the sub-filter w[:, :, a::u, b::v]:

    dx[n, c, u·h' + a − pad_h, v·w' + b − pad_w] = Σ_k Σ_i Σ_j w[k, c, a + u·i, b + v·j] · dy[n, k, h' − i, w' − j]

that is, dx_ab (N, C, P + R_a − 1, Q + S_b − 1) = backward-data of a stride-1 convolution whose filter
has R_a = ⌈(R − a)/u⌉ × S_b = ⌈(S − b)/v⌉ taps and whose output is dy. Each phase runs as one
``implicit_gemm`` call (no workspace of its own) and is copied onto its strided slice of dx; a phase
without taps (u > R) leaves its pixels zero. Every multiply-add is one the answer needs.

Workspace: the largest phase's dx_ab and its sub-filter, contiguous (the kernels read C-contiguous
arrays), 256-byte aligned. Numerics: the same products as the direct backward-data, summed in
another order. Stride-1 and dilated problems are left to the other algorithms. On the H200 it runs
ResNet's strided backward-data about twice as fast as ``implicit_gemm``, as fast as ``gemm`` in about an
eighth of its workspace on 3x3 layers (docs/convolution.md).
"""
from __future__ import annotations

import functools
from typing import Any

from . import implicit_gemm  # noqa: F401 - registers the algorithm each phase runs
from .problem import ConvProblem
from .registry import ConvAlgorithm, get, register, workspace_array

ALIGNMENT = 256  # bytes between the two arrays carved from the workspace


def _aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


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


class StridedDgrad(ConvAlgorithm):
    name = "strided_dgrad"
    deterministic = True  # implicit GEMM's backward-data writes each output once

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return direction == "backward_data" and problem.stride != (1, 1) and problem.dilation == (1, 1)

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        # Phase (0, 0) has the most taps in both directions, so the largest dx_ab and sub-filter.
        largest = phase_problem(problem, 0, 0)
        data = largest.N * largest.C * largest.H * largest.W * problem.itemsize
        taps = largest.K * (largest.C // largest.groups) * largest.R * largest.S * problem.itemsize
        return _aligned(data) + taps

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        (u, v) = problem.stride
        out.fill(0)  # phases without taps, and rows no dy sample reaches, stay zero
        for a, b, phase, (first_h, stop_h, start_h), (first_w, stop_w, start_w) in phases(problem):
            dx = workspace_array(workspace, phase.x_shape, problem.dtype)
            taps = workspace_array(workspace, phase.w_shape, problem.dtype, offset=_aligned(dx.nbytes))
            taps[...] = w[:, :, a::u, b::v]
            get("implicit_gemm").backward_data(dy, taps, phase, dx, None)
            out[:, :, start_h:start_h + u * (stop_h - first_h):u, start_w:start_w + v * (stop_w - first_w):v] = \
                dx[:, :, first_h:stop_h, first_w:stop_w]


@functools.lru_cache(maxsize=256)  # worked out once per problem: the host's time per call is the copies'
def phases(problem: ConvProblem) -> list[tuple[int, int, ConvProblem, tuple[int, int, int], tuple[int, int, int]]]:
    """(a, b, the phase's problem, its row span, its column span) of every phase that reaches dx."""
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
