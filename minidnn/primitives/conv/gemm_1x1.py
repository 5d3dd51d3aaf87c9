"""The ``gemm_1x1`` algorithm: a 1x1, stride-1, unpadded convolution is a matrix product as the input lies.

Image n's input x[n] is already a (C × H·W) matrix and its output y[n] a (K × H·W) one, so
y[n] = W (K × C) · x[n] with no im2col: one strided-batched GEMM per group covers the batch
(Caffe's ``is_1x1_`` shortcut in base_conv_layer.cpp, done batch-wide). Backward-data is
dx[n] = Wᵀ · dy[n], the same shape of call. Backward-filter reduces over the images: a batched
GEMM writes each image's dW_n = dy[n] · x[n]ᵀ into the workspace (N·K·C/G values), and one more
GEMM sums them (a row of ones times the N partial products), adding into dW when accumulating.
All its GPU work is GEMMs and launches of our own (the row of ones is written by gemm_1x1.cu), so a repeated
call replays its first call's recording (``replayable``) instead of running this module's Python again.

Half precision (float16, bfloat16) is the half GEMMs' (blas.py): float32 sums, one rounding. Forward and
backward-data round each image's product once; backward-filter keeps the N partial products and their sum
in float32 (the workspace grows to 4 bytes a value) and rounds dW once, adding a float32 ``out`` first
when accumulating.

Channels-last (a problem laid out so, ``ConvProblem.channels_last``): the buffer (N, H, W, C) is one
(N·H·W × C) matrix with a row per pixel, so each direction is a single GEMM per group over every pixel of the
batch, with no workspace:

    y (N·H·W × K)   =  x (N·H·W × C)  ·  Wᵀ (C × K)
    dx (N·H·W × C)  =  dy (N·H·W × K) ·  W (K × C)
    dW (K × C)      =  dyᵀ (K × N·H·W) ·  x (N·H·W × C)        the reduction over every pixel in one product

A group's channels are a block of the rows' columns (leading dimension C, or K, of all the groups). An operand
of such a problem that is not channels-last is laid out first, and an output that is not is written through a
channels-last temporary.

A strided 1x1 channels-last problem (ResNet's shortcuts) samples x at pixels (s_h·p, s_w·q): image row p of those
is Q pixel rows s_w·C apart, and row p + 1 starts s_h·W·C further on, across images too where H = s_h·P. So the
sampled pixels are a strided batch of N·P matrices (Q × C) over x's own buffer, and forward and backward-data are
one strided-batched GEMM each, again with no copy:

    y (N·P: Q × K)           =  x sampled (N·P: Q × C)  ·  Wᵀ
    dx sampled (N·P: Q × C)  =  dy (N·P: Q × K)         ·  W        the rest of dx zeroed first (no dy reaches it)

where backward-data's alternatives gather dy at every dx pixel or copy each phase (strided_dgrad). Backward-filter
would sum over the batch, which a batched GEMM does not; it is left to the others.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import backend
from .. import _cuda, blas, convert, layout
from .gemm import per_image, repeated, weight_matrix
from .problem import ConvProblem
from .registry import ConvAlgorithm, register, workspace_array


class Gemm1x1(ConvAlgorithm):
    name = "gemm_1x1"
    half_precision = True
    replayable = True  # GEMMs through blas and the ones through _cuda.launch: a repeat replays the recorded call

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        # a 1x1 filter's dilation changes nothing
        return problem.is_1x1 or (direction != "backward_filter" and samples_in_batches(problem))

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        if direction != "backward_filter" or problem.channels_last:
            return 0
        partials = problem.N * problem.K * (problem.C // problem.groups)
        if problem.half_type is not None:  # float32 partials, ones and the sum of one group
            return (partials + problem.N + problem.K // problem.groups * (problem.C // problem.groups)) * 4
        if problem.N == 1:
            return 0
        return (partials + problem.N) * problem.itemsize  # the partial products and a row of N ones

    def run_in_layout(self, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
                      accumulate: bool, workspace: Any) -> None:
        """A channels-last problem: one GEMM per group on the pixel rows (:func:`_pixel_rows_products`); any other
        on C-contiguous operands, as every algorithm without channels-last kernels runs."""
        if problem.channels_last:
            _pixel_rows_products(direction, first, second, problem, out, accumulate)
        else:
            super().run_in_layout(direction, first, second, problem, out, accumulate, workspace)

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        Cg, Kg = problem.C // problem.groups, problem.K // problem.groups
        for g in range(problem.groups):
            blas.gemm_batched(repeated(weight_matrix(w, problem, g), problem.N), per_image(x, problem, Cg, g),
                              per_image(out, problem, Kg, g))

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        Cg, Kg = problem.C // problem.groups, problem.K // problem.groups
        for g in range(problem.groups):
            blas.gemm_batched(repeated(weight_matrix(w, problem, g).T, problem.N), per_image(dy, problem, Kg, g),
                              per_image(out, problem, Cg, g))

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        N, Cg, Kg = problem.N, problem.C // problem.groups, problem.K // problem.groups
        beta = 1.0 if accumulate else 0.0
        dw = out.reshape(problem.K, Cg)
        if problem.half_type is not None:
            self._backward_filter_half(x, dy, problem, dw, accumulate, workspace)
            return
        if N == 1:
            for g in range(problem.groups):
                blas.gemm(dy.reshape(problem.K, -1)[g * Kg:(g + 1) * Kg], x.reshape(problem.C, -1)[g * Cg:(g + 1) * Cg].T,
                          dw[g * Kg:(g + 1) * Kg], beta=beta)
            return
        partials = workspace_array(workspace, (N, Kg, Cg), problem.dtype)
        ones = _ones(workspace_array(workspace, (1, N), problem.dtype, offset=partials.nbytes))
        for g in range(problem.groups):
            images_x = per_image(x, problem, Cg, g)
            blas.gemm_batched(per_image(dy, problem, Kg, g), images_x.transpose(0, 2, 1), partials)
            total = dw[g * Kg:(g + 1) * Kg].reshape(1, Kg * Cg)  # a row-major view: dW_g rows are contiguous
            blas.gemm(ones, partials.reshape(N, Kg * Cg), total, beta=beta)

    def _backward_filter_half(self, x: Any, dy: Any, problem: ConvProblem, dw: Any, accumulate: bool,
                              workspace: Any) -> None:
        """dW (K, C/G) of half x and dy: each image's product and their sum in float32, one rounding."""
        N, Cg, Kg, half = problem.N, problem.C // problem.groups, problem.K // problem.groups, problem.half_type
        partials = workspace_array(workspace, (N, Kg, Cg), np.float32)
        ones = _ones(workspace_array(workspace, (1, N), np.float32, offset=partials.nbytes))
        total = workspace_array(workspace, (1, Kg * Cg), np.float32, offset=partials.nbytes + ones.nbytes)
        for g in range(problem.groups):
            blas.gemm_batched(per_image(dy, problem, Kg, g), per_image(x, problem, Cg, g).transpose(0, 2, 1), partials)
            group = dw[g * Kg:(g + 1) * Kg].reshape(1, Kg * Cg)  # a row-major view: dW_g rows are contiguous
            if accumulate:
                convert.half_to_float(group, half, out=total)
            blas.gemm(ones, partials.reshape(N, Kg * Cg), total, beta=1.0 if accumulate else 0.0)
            convert.float_to_half(total, half, out=group)


def samples_in_batches(problem: ConvProblem) -> bool:
    """Whether ``problem`` is a strided 1x1, unpadded, channels-last convolution whose sampled pixels lie one
    stride apart from image row to image row, across images too (H = stride_h·P, or one image): the strided batch
    of the module docstring."""
    return (problem.channels_last and (problem.R, problem.S, problem.padding) == (1, 1, (0, 0))
            and problem.stride != (1, 1) and (problem.N == 1 or problem.H == problem.stride[0] * problem.P))


def _sampled_rows(array: Any, problem: ConvProblem) -> Any:
    """(N·P, Q, C): the pixels (stride_h·p, stride_w·q) of a channels-last (N, C, H, W) array as N·P row-major
    matrices over its buffer (a view, which the output's writes reach)."""
    N, C, H, W = array.shape
    (u, v), item = problem.stride, array.itemsize
    return backend.get_array_module(array).lib.stride_tricks.as_strided(
        _pixel_rows(array), (N * problem.P, problem.Q, C), (u * W * C * item, v * C * item, item))


def _sampled_products(direction: str, first: Any, second: Any, problem: ConvProblem, result: Any) -> None:
    """Forward or backward-data of a strided 1x1 channels-last problem into the channels-last ``result``: one
    strided-batched GEMM per group between the sampled pixel rows and the (N·P, Q, K) rows of y or dy."""
    Cg, Kg = problem.C // problem.groups, problem.K // problem.groups
    if direction == "forward":
        source, widths = _sampled_rows(layout.to_channels_last(first), problem), (Cg, Kg)
        target = _pixel_rows(result).reshape(problem.N * problem.P, problem.Q, problem.K)
    else:
        source = _pixel_rows(layout.to_channels_last(first)).reshape(problem.N * problem.P, problem.Q, problem.K)
        target, widths = _sampled_rows(result, problem), (Kg, Cg)
        # dx outside the sampled pixels gets no gradient: zeroed first, one memset of the buffer on the GPU (the
        # channels-last calls are not recorded for replay, so nothing replays the GEMM without it)
        zeros = _pixel_rows(result)
        if isinstance(zeros, np.ndarray):
            zeros.fill(0)
        else:
            zeros.data.memset_async(0, zeros.nbytes)
    for g in range(problem.groups):
        weights = weight_matrix(second, problem, g)  # (K/G, C/G)
        blas.gemm_batched(source[..., g * widths[0]:(g + 1) * widths[0]],
                          repeated(weights.T if direction == "forward" else weights, source.shape[0]),
                          target[..., g * widths[1]:(g + 1) * widths[1]])


def _pixel_rows(array: Any) -> Any:
    """(N·H·W, C): a channels-last array's buffer as one row per pixel (a view; an array whose two layouts coincide
    is that buffer already)."""
    N, C, H, W = array.shape
    return layout.flat(array).reshape(N * H * W, C)


def _group_columns(rows: Any, g: int, width: int) -> Any:
    """Group g's block of ``width`` columns of a pixel-rows matrix (its leading dimension all the groups')."""
    return rows[:, g * width:(g + 1) * width]


def _pixel_rows_products(direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
                         accumulate: bool) -> None:
    """``direction`` of a channels-last problem as one GEMM per group over the pixel rows (the module docstring's
    products): x and dy laid out channels-last where they are not, y or dx written into ``out`` (through a
    channels-last temporary when out is not), dW added into ``out`` when ``accumulate``."""
    Cg, Kg = problem.C // problem.groups, problem.K // problem.groups
    if direction == "backward_filter":
        x_rows, dy_rows = (_pixel_rows(layout.to_channels_last(a)) for a in (first, second))
        dw = out.reshape(problem.K, Cg)
        for g in range(problem.groups):
            blas.gemm(_group_columns(dy_rows, g, Kg).T, _group_columns(x_rows, g, Cg), dw[g * Kg:(g + 1) * Kg],
                      beta=1.0 if accumulate else 0.0)
        return
    direct = layout.is_channels_last(out) or layout.coincide(out.shape)
    result = out if direct else layout.empty(out.shape, out.dtype, backend.get_array_module(out), True)
    if samples_in_batches(problem):
        _sampled_products(direction, first, second, problem, result)
    else:
        source_rows, result_rows = _pixel_rows(layout.to_channels_last(first)), _pixel_rows(result)
        source_width, result_width = (Cg, Kg) if direction == "forward" else (Kg, Cg)
        for g in range(problem.groups):
            weights = weight_matrix(second, problem, g)  # (K/G, C/G)
            blas.gemm(_group_columns(source_rows, g, source_width), weights.T if direction == "forward" else weights,
                      _group_columns(result_rows, g, result_width))
    if not direct:
        out[...] = layout.contiguous(result)


def _ones(row: Any) -> Any:
    """``row`` (1, N) filled with ones: on the GPU by gemm_1x1.cu's launch, which a recording keeps."""
    if isinstance(row, np.ndarray):
        row.fill(1)
    else:
        _cuda.launch(_cuda.function("conv/gemm_1x1.cu", "ones", row.dtype), row.size, (row, _cuda.i32(row.size)))
    return row


register(Gemm1x1())
