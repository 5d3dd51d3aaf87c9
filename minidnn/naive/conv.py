"""Convolution as Caffe ran it before cuDNN (src/caffe/layers/base_conv_layer.cpp, conv_layer.cu).

One image at a time (ConvolutionLayer::Forward_gpu and Backward_gpu), im2col + one GEMM per group:

    forward          columns = im2col(x[n]);  y[n]_g = W_g · columns_g              (forward_gpu_gemm)
    backward-data    columns_g = W_gᵀ · dy[n]_g;  dx[n] = col2im(columns)           (backward_gpu_gemm)
    backward-filter  columns = im2col(x[n]), again;  dW_g += dy[n]_g · columns_gᵀ   (weight_gpu_gemm)

The bias is :func:`minidnn.naive.linear.bias_add` and ``bias_backward`` (forward_gpu_bias,
backward_gpu_bias: per image, a GEMM and a GEMV with a vector of ones).

A 1x1, stride-1, unpadded convolution skips im2col and col2im (Caffe's ``is_1x1_``): x[n] already
is its (C × H·W) column matrix, and the backward-data GEMM writes dx[n] directly.

The column buffer holds one image, (C·R·S × P·Q) ("to avoid overly large memory usage", Caffe).
Caffe kept one per layer; here one serves every layer of the same shape, made on first use and kept
for the process: the naive engine holds at most Caffe's column memory, a conservative baseline.
Every product goes through :func:`minidnn.primitives.blas.gemm` (cuBLAS, as Caffe's
``caffe_gpu_gemm``), im2col and col2im are the primitives' kernels (Caffe's im2col.cu design).
The weight gradient's first image writes dW (beta = 0) where Caffe added into a diff its solver had
zeroed: the same sum without the memset. ``algo`` and ``workspace_limit`` are checked as the
primitives check them and otherwise unused: Caffe had one algorithm, whatever the workspace.

What cuDNN removed shows here: N·groups small GEMMs instead of one large one per group, im2col
recomputed in the backward pass, and launches per image for the lowering and the products.
"""
from __future__ import annotations

from typing import Any

from .. import backend
from ..primitives import blas
from ..primitives._checks import check_rank
from ..primitives.conv import api, registry
from ..primitives.conv import im2col as lowering
from ..primitives.conv.problem import ConvProblem, check_conv_dtype, check_output_grad, forward_problem, make_problem

_column_buffers: dict[tuple, Any] = {}


def _column_buffer(image: ConvProblem, like: Any) -> Any:
    """The one-image column buffer (C·R·S, P·Q) for this layer shape on like's device, kept."""
    where = backend.device_of(like)
    key = (image, where)
    if key not in _column_buffers:
        with backend.on_device(where):
            _column_buffers[key] = backend.get_array_module(like).empty(
                (image.C * image.R * image.S, image.P * image.Q), dtype=image.dtype)
    return _column_buffers[key]


def _check_settings(algo: Any, workspace_limit: Any) -> None:
    if workspace_limit is not None:
        registry.check_limit(workspace_limit)
    if algo is not None and algo != "auto":
        registry.get(algo)


def _lowered(x: Any, n: int, image: ConvProblem) -> Any:
    """Image n of x as its column matrix (C·R·S × P·Q): x[n] itself for 1x1, else im2col into the buffer."""
    if image.is_1x1:
        return x[n].reshape(image.C, -1)
    columns = _column_buffer(image, x)
    lowering.im2col(x[n:n + 1], image, out=columns)
    return columns


def _groups(problem: ConvProblem) -> list[tuple[slice, slice]]:
    """Per group, its rows of W (output channels) and of the column matrix (its C/groups·R·S taps)."""
    filters, taps = problem.K // problem.groups, problem.C // problem.groups * problem.R * problem.S
    return [(slice(g * filters, (g + 1) * filters), slice(g * taps, (g + 1) * taps)) for g in range(problem.groups)]


def _full_precision(problem: ConvProblem) -> ConvProblem:
    """The problem, unless it is half precision: Caffe's engine convolves float32 and float64 only (the same
    dtype checks as the primitives first, so both engines word every other error alike)."""
    if problem.half_type is not None:
        raise TypeError(f"the naive engine convolves float32 and float64 arrays only, got {problem.half_type}")
    return problem


def conv2d_forward(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
                   algo: str | None = None, workspace_limit: int | None = None, out: Any = None) -> Any:
    """y = x ⋆ w, image by image (Forward_gpu, forward_gpu_gemm). x: (N, C, H, W); w: (K, C/groups, R, S);
    returns y: (N, K, P, Q) (into ``out`` when given)."""
    problem = _full_precision(forward_problem(x, w, stride, padding, dilation, groups, api._device(x, w)))
    xp = backend.get_array_module(x)
    result = api._output(out, problem.y_shape, problem, xp, channels_last=False)
    _check_settings(algo, workspace_limit)
    x, weights = xp.ascontiguousarray(x), xp.ascontiguousarray(w).reshape(problem.K, -1)
    image = problem.with_batch(1)
    y = _contiguous_target(result, xp)
    for n in range(problem.N):
        columns, y_n = _lowered(x, n, image), y[n].reshape(problem.K, -1)
        for filters, taps in _groups(problem):
            blas.gemm(weights[filters], columns[taps], y_n[filters])
    return _written_back(y, result)


def conv2d_backward_data(dy: Any, w: Any, x_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                         groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None,
                         out: Any = None) -> Any:
    """dx, image by image (Backward_gpu, backward_gpu_gemm). dy: (N, K, P, Q); w: (K, C/groups, R, S);
    returns dx: x_shape (into ``out`` when given)."""
    check_conv_dtype(w, "weight")
    check_rank(w, 4, "weight", "(K, C/groups, R, S)")
    problem = _full_precision(make_problem(tuple(x_shape), tuple(w.shape), stride, padding, dilation, groups, w.dtype,
                                           api._device(dy, w)))
    check_output_grad(dy, problem)
    xp = backend.get_array_module(dy)
    result = api._output(out, problem.x_shape, problem, xp, channels_last=False)
    _check_settings(algo, workspace_limit)
    dy, weights = xp.ascontiguousarray(dy), xp.ascontiguousarray(w).reshape(problem.K, -1)
    image = problem.with_batch(1)
    dx = _contiguous_target(result, xp)
    for n in range(problem.N):
        columns = dx[n].reshape(problem.C, -1) if image.is_1x1 else _column_buffer(image, dy)
        dy_n = dy[n].reshape(problem.K, -1)
        for filters, taps in _groups(problem):
            blas.gemm(weights[filters].T, dy_n[filters], columns[taps])
        if not image.is_1x1:
            lowering.col2im(columns, image, out=dx[n:n + 1])
    return _written_back(dx, result)


def _contiguous_target(result: Any, xp: Any) -> Any:
    """Where the image-by-image GEMMs write: ``result`` itself, or a C-contiguous array for a channels-last
    ``out`` (Caffe knows one layout; the primitives' rule for out is kept, the copy is this engine's)."""
    return result if result.flags.c_contiguous else xp.empty(result.shape, dtype=result.dtype)


def _written_back(target: Any, result: Any) -> Any:
    if target is not result:
        result[...] = target
    return result


def conv2d_backward_filter(x: Any, dy: Any, w_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                           groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None,
                           out: Any = None, accumulate: bool = False, dtype: Any = None) -> Any:
    """dw, summed image by image (Backward_gpu, weight_gpu_gemm). x: (N, C, H, W); dy: (N, K, P, Q);
    returns dw: w_shape, written into ``out`` or, with ``accumulate``, added to it; ``dtype`` x's (no half
    precision here)."""
    check_conv_dtype(x, "input")
    check_rank(x, 4, "input", "(N, C, H, W)")
    problem = _full_precision(make_problem(x.shape, tuple(w_shape), stride, padding, dilation, groups, x.dtype,
                                           api._device(x, dy)))
    check_output_grad(dy, problem)
    api._check_accumulate(accumulate, out)
    xp = backend.get_array_module(x)
    dw = api._output(out, problem.w_shape, problem, xp, api.gradient_dtype(dtype, problem))
    _check_settings(algo, workspace_limit)
    x, dy = xp.ascontiguousarray(x), xp.ascontiguousarray(dy)
    dw_rows = dw.reshape(problem.K, -1)
    image = problem.with_batch(1)
    for n in range(problem.N):
        columns, dy_n = _lowered(x, n, image), dy[n].reshape(problem.K, -1)
        for filters, taps in _groups(problem):
            blas.gemm(dy_n[filters], columns[taps].T, dw_rows[filters], beta=1.0 if n or accumulate else 0.0)
    return dw
