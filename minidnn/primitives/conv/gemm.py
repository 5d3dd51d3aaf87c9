"""The ``gemm`` algorithm: explicit im2col of the (micro-)batch into the workspace, then GEMMs.

Forward          y[n] (K/G × P·Q) = W_g (K/G × C/G·R·S) · D_m[:, n] (C/G·R·S × P·Q), all n in one batched GEMM
Backward-data    dD_m[:, n] = W_gᵀ · dy[n], then col2im sums the columns back onto dx
Backward-filter  dW_g = dY_m (K/G × N·P·Q) · D_mᵀ, one GEMM over the whole batch (im2col recomputed)

The lowered matrix D_m has C·R·S rows and N·P·Q columns, image after image (layout (C, R, S, N,
P, Q), see im2col.py), so image n's block is a strided sub-matrix: one strided-batched GEMM per
group writes every image's output in place, with no transpose. The workspace is D_m itself
(R·S/(stride_h·stride_w) times the input); backward-filter also needs dy laid out as K × N·P·Q,
a copy when N > 1. Under a workspace limit the dispatcher runs the batch in micro-batches.

NumPy builds the same D_m tap by tap and shapes the products for a CPU BLAS: forward as one GEMM
over all N·P·Q columns into a y-sized temporary, then transposed into y; backward-filter as dW_gᵀ,
so that the GEMM's rows are the long C/G·R·S side rather than K/G.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import backend
from .. import blas
from .im2col import col2im, column_bytes, column_shape, im2col
from .problem import ConvProblem
from .registry import ConvAlgorithm, register, workspace_array


def per_image(matrix: Any, problem: ConvProblem, rows: int, g: int) -> Any:
    """Group g's rows of an image-major array (N, G·rows, L) as a (N, rows, L) stack of matrices."""
    N = matrix.shape[0]
    return matrix.reshape(N, problem.groups * rows, -1)[:, g * rows:(g + 1) * rows]


def column_blocks(columns: Any, problem: ConvProblem, g: int) -> Any:
    """Group g's block of the lowered matrix (C·R·S, N·P·Q) as N matrices (C/G·R·S × P·Q), one per image."""
    rows = problem.C // problem.groups * problem.R * problem.S
    block = columns.reshape(problem.C * problem.R * problem.S, problem.N, problem.P * problem.Q)[g * rows:(g + 1) * rows]
    return block.transpose(1, 0, 2)


def weight_matrix(w: Any, problem: ConvProblem, g: int) -> Any:
    """W_g: (K/G, C/G·R·S), group g's filters as rows."""
    Kg = problem.K // problem.groups
    return w.reshape(problem.K, -1)[g * Kg:(g + 1) * Kg]


def repeated(matrix: Any, count: int) -> Any:
    """The same matrix ``count`` times as a (count, rows, cols) view (batch stride 0, no copy)."""
    return backend.get_array_module(matrix).broadcast_to(matrix, (count,) + matrix.shape)


class Gemm(ConvAlgorithm):
    name = "gemm"

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return True

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        transposed_dy = problem.N * problem.K * problem.P * problem.Q * problem.itemsize if problem.N > 1 else 0
        return column_bytes(problem) + (transposed_dy if direction == "backward_filter" else 0)

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        if isinstance(x, np.ndarray):
            _numpy_forward(x, w, problem, out, workspace)
            return
        columns = im2col(x, problem, out=workspace_array(workspace, column_shape(problem), problem.dtype))
        Kg = problem.K // problem.groups
        for g in range(problem.groups):
            blas.gemm_batched(repeated(weight_matrix(w, problem, g), problem.N), column_blocks(columns, problem, g),
                              per_image(out, problem, Kg, g))

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        columns = workspace_array(workspace, column_shape(problem), problem.dtype)
        Kg = problem.K // problem.groups
        for g in range(problem.groups):
            blas.gemm_batched(repeated(weight_matrix(w, problem, g).T, problem.N), per_image(dy, problem, Kg, g),
                              column_blocks(columns, problem, g))
        col2im(columns, problem, out=out)

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        if isinstance(x, np.ndarray):
            _numpy_backward_filter(x, dy, problem, out, accumulate, workspace)
            return
        columns = im2col(x, problem, out=workspace_array(workspace, column_shape(problem), problem.dtype))
        G, Kg = problem.groups, problem.K // problem.groups
        rows = _gradient_rows(dy, problem, workspace)
        lowered = columns.reshape(problem.C * problem.R * problem.S, -1)
        crs = lowered.shape[0] // G
        dw = out.reshape(problem.K, -1)
        for g in range(G):
            blas.gemm(rows[g * Kg:(g + 1) * Kg], lowered[g * crs:(g + 1) * crs].T, dw[g * Kg:(g + 1) * Kg],
                      beta=1.0 if accumulate else 0.0)


def _gradient_rows(dy: Any, problem: ConvProblem, workspace: Any) -> Any:
    """dy as the K × N·P·Q matrix dY_m: image n's dy[n] becomes columns n·P·Q ... of every row (a copy into the
    workspace after the columns; with one image, dy itself)."""
    PQ = problem.P * problem.Q
    if problem.N == 1:
        return dy.reshape(problem.K, PQ)
    rows = workspace_array(workspace, (problem.K, problem.N, PQ), problem.dtype, offset=column_bytes(problem))
    rows[...] = dy.reshape(problem.N, problem.K, PQ).transpose(1, 0, 2)
    return rows.reshape(problem.K, -1)


# ----------------------------------------------------------------------------------------------
# NumPy: the same lowered matrix, built tap by tap, and products shaped for a CPU BLAS
# ----------------------------------------------------------------------------------------------
def lower_batch(x: np.ndarray, problem: ConvProblem, columns: np.ndarray) -> np.ndarray:
    """im2col of the whole batch into ``columns`` (C, R, S, N, P, Q), one filter tap at a time.

    Each tap's rows of D_m are one strided view of x (no padded copy of x): the output pixels whose
    tap falls inside the image copy it, and the border bands where it falls in the padding are
    zeroed. A copy per tap moves whole (P, Q) planes, where im2col's single six-axis copy of the
    sliding-window view walks them in runs of one output row.
    """
    (sh, sw), (ph, pw), (dh, dw) = problem.stride, problem.padding, problem.dilation
    P, Q = problem.P, problem.Q
    image = x.transpose(1, 0, 2, 3)  # (C, N, H, W), the column layout's axis order
    for r in range(problem.R):
        rows = _inside(problem.H, P, sh, r * dh - ph)
        for s in range(problem.S):
            cols = _inside(problem.W, Q, sw, s * dw - pw)
            tap = columns[:, r, s]  # (C, N, P, Q)
            if rows is None or cols is None:
                tap[...] = 0
                continue
            (p0, p1, h0), (q0, q1, w0) = rows, cols
            tap[:, :, :p0] = 0
            tap[:, :, p1:] = 0
            tap[:, :, p0:p1, :q0] = 0
            tap[:, :, p0:p1, q1:] = 0
            tap[:, :, p0:p1, q0:q1] = image[:, :, h0:h0 + sh * (p1 - p0 - 1) + 1:sh, w0:w0 + sw * (q1 - q0 - 1) + 1:sw]
    return columns


def _inside(size: int, outputs: int, stride: int, offset: int) -> tuple[int, int, int] | None:
    """Along one axis, the outputs o in [first, stop) whose input coordinate o·stride + offset lies in
    [0, size), with the first one's input coordinate; None when no output's does."""
    first = max(0, -(-(-offset) // stride))  # the smallest o with o·stride + offset >= 0
    stop = min(outputs, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    if stop <= first:
        return None
    return first, stop, first * stride + offset


def _numpy_forward(x: np.ndarray, w: np.ndarray, problem: ConvProblem, out: np.ndarray, workspace: Any) -> None:
    """y = W_g · D_m as one GEMM per group over the whole batch, (K/G × C/G·R·S) · (C/G·R·S × N·P·Q), then
    transposed into out (N, K, P, Q): a CPU BLAS runs one product with N·P·Q columns faster than N
    products of P·Q columns each (the strided-batched form the GPU runs)."""
    columns = lower_batch(x, problem, workspace_array(workspace, column_shape(problem), problem.dtype))
    G, Kg, N, PQ = problem.groups, problem.K // problem.groups, problem.N, problem.P * problem.Q
    lowered = columns.reshape(problem.C * problem.R * problem.S, N * PQ)
    crs = lowered.shape[0] // G
    weights = w.reshape(problem.K, -1)
    product = np.empty((problem.K, N * PQ), dtype=problem.dtype) if N > 1 else out.reshape(problem.K, PQ)
    for g in range(G):
        blas.gemm(weights[g * Kg:(g + 1) * Kg], lowered[g * crs:(g + 1) * crs], product[g * Kg:(g + 1) * Kg])
    if N > 1:
        out.reshape(N, problem.K, PQ)[...] = product.reshape(problem.K, N, PQ).transpose(1, 0, 2)


def _numpy_backward_filter(x: np.ndarray, dy: np.ndarray, problem: ConvProblem, out: np.ndarray, accumulate: bool,
                           workspace: Any) -> None:
    """dW_gᵀ = D_m · dY_mᵀ, (C/G·R·S × N·P·Q) · (N·P·Q × K/G), then transposed into dw: the same sums as
    dW_g = dY_m · D_mᵀ, but with the long side of the output as the GEMM's rows, which a CPU BLAS
    partitions far better than K/G rows (often 16 or 32) of a long reduction."""
    columns = lower_batch(x, problem, workspace_array(workspace, column_shape(problem), problem.dtype))
    G, Kg = problem.groups, problem.K // problem.groups
    rows = _gradient_rows(dy, problem, workspace)
    lowered = columns.reshape(problem.C * problem.R * problem.S, -1)
    crs = lowered.shape[0] // G
    dw = out.reshape(problem.K, -1)
    dw_transposed = np.empty((crs, Kg), dtype=problem.dtype)
    for g in range(G):
        blas.gemm(lowered[g * crs:(g + 1) * crs], rows[g * Kg:(g + 1) * Kg].T, dw_transposed)
        if accumulate:
            dw[g * Kg:(g + 1) * Kg] += dw_transposed.T
        else:
            dw[g * Kg:(g + 1) * Kg] = dw_transposed.T


register(Gemm())
