"""The ``gemm`` algorithm: explicit im2col over the (micro-)batch, then one GEMM per group.

Forward     Y_m (K/G × N·P·Q) = W_m (K/G × C/G·R·S) · D_m (C/G·R·S × N·P·Q)
Backward-data   dD_m = W_mᵀ · dY_m, then col2im
Backward-filter dW_m = dY_m · D_mᵀ (im2col of x recomputed, not kept from the forward pass)

The workspace is the lowered matrix D_m (or dD_m): C·R·S·N·P·Q elements, R·S/(stride_h·stride_w)
times the input. Under a workspace limit the dispatcher runs the batch in micro-batches.
"""
from __future__ import annotations

from typing import Any

from ... import backend
from .im2col import col2im, column_bytes, im2col
from .problem import ConvProblem
from .registry import ConvAlgorithm, register, store_filter_gradient


def grouped_matmul(a: Any, b: Any) -> Any:
    """(G, M, K) @ (G, K, N) -> (G, M, N); a plain 2-D GEMM when G = 1 (its compute type honours TF32)."""
    if a.shape[0] == 1:
        return (a[0] @ b[0])[None]
    return backend.get_array_module(a).matmul(a, b)


def _output_rows(dy: Any, problem: ConvProblem) -> Any:
    """dy: (N, K, P, Q) -> (G, K/G, N·P·Q), the GEMM layout of the output."""
    G = problem.groups
    rows = dy.transpose(1, 0, 2, 3).reshape(G, problem.K // G, -1)
    return backend.get_array_module(dy).ascontiguousarray(rows)


class Gemm(ConvAlgorithm):
    name = "gemm"
    priority = 10

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return True

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        return column_bytes(problem)

    def forward(self, x: Any, w: Any, problem: ConvProblem) -> Any:
        xp = backend.get_array_module(x)
        G = problem.groups
        columns = im2col(x, problem).reshape(G, -1, problem.N * problem.P * problem.Q)
        y = grouped_matmul(w.reshape(G, problem.K // G, -1), columns)  # G, K/G, N·P·Q
        y = y.reshape(problem.K, problem.N, problem.P, problem.Q).transpose(1, 0, 2, 3)
        return xp.ascontiguousarray(y)

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem) -> Any:
        G = problem.groups
        w_m = w.reshape(G, problem.K // G, -1).transpose(0, 2, 1)  # G, C/G·R·S, K/G
        columns = grouped_matmul(w_m, _output_rows(dy, problem))
        return col2im(columns.reshape(problem.C, problem.R, problem.S, problem.N, problem.P, problem.Q), problem)

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool) -> Any:
        G = problem.groups
        columns = im2col(x, problem).reshape(G, -1, problem.N * problem.P * problem.Q)
        dw = grouped_matmul(_output_rows(dy, problem), columns.transpose(0, 2, 1))  # G, K/G, C/G·R·S
        return store_filter_gradient(dw.reshape(problem.w_shape), out, accumulate)


register(Gemm())
