"""Convolution as Caffe computed it before cuDNN: one image at a time, im2col + GEMM.

For every image n of the batch (BVLC/caffe ``ConvolutionLayer::Forward_gpu``):

    forward          columns = im2col(x[n]);  y[n, group] = W_group · columns_group
    bias             y[n] += bias · onesᵀ                  (a GEMM with a vector of ones)
    backward-filter  columns = im2col(x[n]);  dW_group += dy[n, group] · columns_groupᵀ  (beta = 1)
    bias gradient    db += dy[n] · ones                    (a GEMV)
    backward-data    columns_group = W_groupᵀ · dy[n, group];  dx[n] = col2im(columns)

The column buffer holds one image and belongs to the layer (Caffe: "The im2col result buffer will
only hold one image at a time to avoid overly large memory usage"); here one buffer serves each
distinct layer shape, allocated on first use and kept. The cost cuDNN removed is visible: N small
GEMMs instead of one large one, im2col recomputed in the backward pass, and a launch pair per image.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from ..primitives.conv.im2col import col2im, column_shape, im2col
from ..primitives.conv.problem import ConvProblem, check_output_grad, forward_problem, make_problem

_column_buffers: dict[tuple, Any] = {}


def _device(*arrays: Any) -> str:
    return "cpu" if backend.get_array_module(*arrays) is np else "cuda"


def _columns(problem: ConvProblem, xp: Any) -> Any:
    """The layer's one-image column buffer, (C·R·S, P·Q), created on first use."""
    key = (problem.with_batch(1), xp.__name__)
    if key not in _column_buffers:
        C, R, S, _, P, Q = column_shape(problem.with_batch(1))
        _column_buffers[key] = xp.empty((C * R * S, P * Q), dtype=problem.dtype)
    return _column_buffers[key]


def gemm(a: Any, b: Any, out: Any, beta: float = 0.0, transpose_a: bool = False, transpose_b: bool = False) -> None:
    """out = op(a) · op(b) + beta · out, in place: cuBLAS's GEMM (Caffe's ``caffe_gpu_gemm``) or BLAS."""
    if backend.is_cuda_array(out):
        from cupy import cublas  # noqa: PLC0415 - GPU only

        cublas.gemm("T" if transpose_a else "N", "T" if transpose_b else "N", a, b, out=out, alpha=1.0, beta=beta)
        return
    product = (a.T if transpose_a else a) @ (b.T if transpose_b else b)
    if beta:
        out += product
    else:
        out[...] = product


def _group_slices(problem: ConvProblem):
    K_per_group, rows_per_group = problem.K // problem.groups, (problem.C // problem.groups) * problem.R * problem.S
    for g in range(problem.groups):
        yield slice(g * K_per_group, (g + 1) * K_per_group), slice(g * rows_per_group, (g + 1) * rows_per_group)


def conv2d_forward(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
                   algo: str | None = None, workspace_limit: int | None = None) -> Any:
    problem = forward_problem(x, w, stride, padding, dilation, groups, _device(x, w))
    xp = backend.get_array_module(x)
    image = problem.with_batch(1)
    columns = _columns(problem, xp)
    weights = w.reshape(problem.K, -1)
    y = xp.empty(problem.y_shape, dtype=problem.dtype)
    for n in range(problem.N):
        im2col(x[n:n + 1], image, out=columns)
        y_n = y[n].reshape(problem.K, -1)
        for ks, rows in _group_slices(problem):
            gemm(weights[ks], columns[rows], y_n[ks])
    return y


def conv2d_backward_data(dy: Any, w: Any, x_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                         groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None) -> Any:
    problem = make_problem(tuple(x_shape), tuple(w.shape), stride, padding, dilation, groups, w.dtype, _device(dy, w))
    check_output_grad(dy, problem)
    xp = backend.get_array_module(dy)
    image = problem.with_batch(1)
    columns = _columns(problem, xp)
    weights = w.reshape(problem.K, -1)
    dx = xp.empty(problem.x_shape, dtype=problem.dtype)
    for n in range(problem.N):
        dy_n = xp.ascontiguousarray(dy[n]).reshape(problem.K, -1)
        for ks, rows in _group_slices(problem):
            gemm(weights[ks], dy_n[ks], columns[rows], transpose_a=True)
        col2im(columns, image, out=dx[n:n + 1])
    return dx


def conv2d_backward_filter(x: Any, dy: Any, w_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                           groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None,
                           out: Any = None, accumulate: bool = False) -> Any:
    problem = make_problem(tuple(x.shape), tuple(w_shape), stride, padding, dilation, groups, x.dtype, _device(x, dy))
    check_output_grad(dy, problem)
    xp = backend.get_array_module(x)
    image = problem.with_batch(1)
    columns = _columns(problem, xp)
    dw = xp.empty(problem.w_shape, dtype=problem.dtype) if out is None else out
    dw_m = dw.reshape(problem.K, -1)
    for n in range(problem.N):
        im2col(x[n:n + 1], image, out=columns)
        dy_n = xp.ascontiguousarray(dy[n]).reshape(problem.K, -1)
        for ks, rows in _group_slices(problem):
            gemm(dy_n[ks], columns[rows], dw_m[ks], beta=1.0 if (n or accumulate) else 0.0, transpose_b=True)
    return dw


def bias_add(y: Any, bias: Any, axis: int = 1, out: Any = None) -> Any:
    """y + bias along ``axis``: per image a GEMM with a ones vector for convolutions (axis 1 of NCHW),
    one GEMM with a ones column for a fully connected layer (the last axis), as Caffe did."""
    xp = backend.get_array_module(y, bias)
    if out is None:
        out = xp.array(y, copy=True)
    elif out is not y:
        out[...] = y
    if axis == 1 and y.ndim == 4:
        ones = xp.ones((1, y.shape[2] * y.shape[3]), dtype=y.dtype)
        for n in range(y.shape[0]):
            gemm(bias.reshape(-1, 1), ones, out[n].reshape(y.shape[1], -1), beta=1.0)
        return out
    rows = out.reshape(-1, y.shape[-1])
    gemm(xp.ones((rows.shape[0], 1), dtype=y.dtype), bias.reshape(1, -1), rows, beta=1.0)
    return out


def bias_backward(dy: Any, axis: int = 1) -> Any:
    """Σ dy over every axis but ``axis``: per image a GEMV with ones (conv) or one GEMV (linear)."""
    xp = backend.get_array_module(dy)
    if axis == 1 and dy.ndim == 4:
        db = xp.zeros((dy.shape[1], 1), dtype=dy.dtype)
        ones = xp.ones((dy.shape[2] * dy.shape[3], 1), dtype=dy.dtype)
        for n in range(dy.shape[0]):
            gemm(xp.ascontiguousarray(dy[n]).reshape(dy.shape[1], -1), ones, db, beta=1.0)
        return db.reshape(-1)
    rows = dy.reshape(-1, dy.shape[-1])
    db = xp.zeros((rows.shape[1], 1), dtype=dy.dtype)
    gemm(rows, xp.ones((rows.shape[0], 1), dtype=dy.dtype), db, transpose_a=True)
    return db.reshape(-1)
