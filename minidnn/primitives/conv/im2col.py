"""im2col and col2im: lower a convolution to a matrix product and back (NumPy here, CUDA in im2col.cu).

Column layout (C, R, S, N, P, Q): row c·R·S + r·S + s of the lowered matrix D_m holds filter tap
(c, r, s) for every output pixel of every image, so with groups the rows split into G contiguous
blocks and the product is one GEMM per group: (K/G × C/G·R·S) · (C/G·R·S × N·P·Q).
col2im is the adjoint: it sums each column entry back onto the input pixel it was copied from.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ... import backend
from .. import _cuda
from .problem import ConvProblem
from .reference import padded, tap_slices, windows


def column_shape(problem: ConvProblem) -> tuple[int, ...]:
    return (problem.C, problem.R, problem.S, problem.N, problem.P, problem.Q)


def column_bytes(problem: ConvProblem) -> int:
    """Bytes of the lowered matrix D_m for the whole (micro-)batch of ``problem``."""
    C, R, S, N, P, Q = column_shape(problem)
    return C * R * S * N * P * Q * problem.itemsize


def im2col(x: Any, problem: ConvProblem, out: Any = None) -> Any:
    """x: (N, C, H, W) -> columns (C, R, S, N, P, Q), contiguous, zeros where the window hits padding.

    ``out``: a contiguous buffer of that shape and x's dtype to fill (a layer's own column buffer).
    """
    xp = backend.get_array_module(x)
    columns = xp.empty(column_shape(problem), dtype=x.dtype) if out is None else out
    if xp is not np:
        _launch("im2col", xp.ascontiguousarray(x), columns, problem, columns.size)
    else:
        columns.reshape(column_shape(problem))[...] = windows(padded(x, problem), problem).transpose(1, 4, 5, 0, 2, 3)
    return columns


def col2im(columns: Any, problem: ConvProblem, out: Any = None) -> Any:
    """columns: (C, R, S, N, P, Q) -> dx: (N, C, H, W), summing the entries of overlapping windows.

    ``out``: a contiguous (N, C, H, W) array to write dx into.
    """
    xp = backend.get_array_module(columns)
    if xp is not np:
        dx = xp.empty(problem.x_shape, dtype=columns.dtype) if out is None else out
        _launch("col2im", xp.ascontiguousarray(columns), dx, problem, dx.size)
        return dx
    columns = columns.reshape(column_shape(problem))
    (ph, pw) = problem.padding
    dx = xp.zeros((problem.N, problem.C, problem.H + 2 * ph, problem.W + 2 * pw), dtype=columns.dtype)
    for r in range(problem.R):
        for s in range(problem.S):
            rows, cols = tap_slices(problem, r, s)
            dx[:, :, rows, cols] += columns[:, r, s].transpose(1, 0, 2, 3)
    dx = dx[:, :, ph:ph + problem.H, pw:pw + problem.W]
    if out is None:
        return dx
    out[...] = dx
    return out


def _launch(name: str, source: Any, target: Any, problem: ConvProblem, count: int) -> None:
    """Run kernel ``name`` of im2col.cu; the problem's shape travels as one struct argument."""
    _cuda.check_int32(source, target)
    _cuda.launch(_cuda.function("conv/im2col.cu", name, source.dtype), count, (source, target, _shape_struct(problem)))


@functools.lru_cache(maxsize=1024)
def _shape_struct(problem: ConvProblem) -> np.void:
    """The problem as the C struct ConvShape (built once per problem: it is passed on every launch)."""
    return np.array([(problem.N, problem.C, problem.H, problem.W, problem.R, problem.S, problem.P, problem.Q,
                      *problem.stride, *problem.padding, *problem.dilation)], dtype=_CONV_SHAPE)[0]


# The C struct ConvShape of im2col.cu: fourteen ints, in this order.
_CONV_SHAPE = np.dtype([(name, np.int32) for name in ("N", "C", "H", "W", "R", "S", "P", "Q", "stride_h",
                                                        "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w")])
