"""The ``gemm`` algorithm: explicit im2col of the (micro-)batch into the workspace, then GEMMs.

Forward          y[n] (K/G × P·Q) = W_g (K/G × C/G·R·S) · D_m[:, n] (C/G·R·S × P·Q), all n in one batched GEMM
Backward-data    dD_m[:, n] = W_gᵀ · dy[n], then col2im sums the columns back onto dx
Backward-filter  dW_g = dY_m (K/G × N·P·Q) · D_mᵀ, one GEMM over the whole batch (im2col recomputed)

The lowered matrix D_m has C·R·S rows and N·P·Q columns, image after image (layout (C, R, S, N,
P, Q), see im2col.py), so image n's block is a strided sub-matrix: one strided-batched GEMM per
group writes every image's output in place, with no transpose. The workspace is D_m itself
(R·S/(stride_h·stride_w) times the input); backward-filter also needs dy laid out as K × N·P·Q,
a copy when N > 1. Under a workspace limit the dispatcher runs the batch in micro-batches.
"""
from __future__ import annotations

from typing import Any

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
        columns = im2col(x, problem, out=workspace_array(workspace, column_shape(problem), problem.dtype))
        G, Kg, PQ = problem.groups, problem.K // problem.groups, problem.P * problem.Q
        if problem.N == 1:  # one image: dy is already K × P·Q
            rows = dy.reshape(problem.K, PQ)
        else:  # K × N·P·Q: image n's dy[n] becomes columns n·P·Q ... of every row
            rows = workspace_array(workspace, (problem.K, problem.N, PQ), problem.dtype, offset=column_bytes(problem))
            rows[...] = dy.reshape(problem.N, problem.K, PQ).transpose(1, 0, 2)
            rows = rows.reshape(problem.K, -1)
        lowered = columns.reshape(problem.C * problem.R * problem.S, -1)
        crs = lowered.shape[0] // G
        dw = out.reshape(problem.K, -1)
        for g in range(G):
            blas.gemm(rows[g * Kg:(g + 1) * Kg], lowered[g * crs:(g + 1) * crs].T, dw[g * Kg:(g + 1) * Kg],
                      beta=1.0 if accumulate else 0.0)


register(Gemm())
