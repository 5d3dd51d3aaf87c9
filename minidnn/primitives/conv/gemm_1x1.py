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

A strided 1x1 channels-last problem (ResNet's shortcuts) reads x only at the pixels (s_h·p, s_w·q), and its
backward-data writes dx only there. Those pixels are gathered into (N·P·Q × C) rows in the workspace, or scattered
from them onto dx (gemm_1x1.cu, every other pixel of dx written zero in the same pass), around one GEMM per group:

    y (N·P·Q × K)     =  gathered x (N·P·Q × C)  ·  Wᵀ
    rows (N·P·Q × C)  =  dy (N·P·Q × K)          ·  W        then scattered onto dx

a chunk of images at a time, as many as the default workspace limit holds, so that each GEMM is one long product.
Backward-data's alternatives gather dy at every dx pixel (implicit GEMM), copy each phase (strided_dgrad) or sum
columns back (gemm's col2im). Backward-filter is left to them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _cuda, blas, convert, layout
from .gemm import per_image, repeated, weight_matrix
from .problem import ConvProblem
from .registry import DEFAULT_WORKSPACE_LIMIT, ConvAlgorithm, register, workspace_array


class Gemm1x1(ConvAlgorithm):
    name = "gemm_1x1"
    half_precision = True
    replayable = True  # GEMMs through blas and the ones through _cuda.launch: a repeat replays the recorded call

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        # a 1x1 filter's dilation changes nothing
        return problem.is_1x1 or (direction != "backward_filter" and samples_pixels(problem))

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        if not problem.is_1x1:  # a strided problem's sampled rows, a chunk of images at a time
            return sampled_chunk(problem) * _sampled_image_bytes(problem)
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
            _pixel_rows_products(direction, first, second, problem, out, accumulate, workspace)
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


def samples_pixels(problem: ConvProblem) -> bool:
    """Whether ``problem`` is a strided 1x1, unpadded, channels-last convolution: forward and backward-data on
    gathered or scattered rows of its sampled pixels (the module docstring)."""
    return (problem.channels_last and (problem.R, problem.S, problem.padding) == (1, 1, (0, 0))
            and problem.stride != (1, 1))


def sampled_chunk(problem: ConvProblem, limit: int | None = None) -> int:
    """How many images' sampled rows one GEMM takes: as many as fit the default workspace limit, or ``limit`` bytes
    where less (the workspace a call is handed), at least one, so that a large layer runs in a few large GEMMs and its
    workspace stays under the limit find keeps to."""
    limit = DEFAULT_WORKSPACE_LIMIT if limit is None else min(limit, DEFAULT_WORKSPACE_LIMIT)
    return max(1, min(problem.N, limit // _sampled_image_bytes(problem)))


def _sampled_image_bytes(problem: ConvProblem) -> int:
    """One image's sampled rows: (P·Q, C) values."""
    return problem.P * problem.Q * problem.C * problem.itemsize


def _move_sampled(direction: str, source: Any, target: Any, images: int, problem: ConvProblem) -> None:
    """Gather (forward: ``source`` x's pixel rows, ``target`` the (images·P·Q, C) rows) or scatter (backward-data:
    the other way, onto dx's whole pixel rows, zeros where no sample lands) ``images`` images' sampled pixels."""
    (u, v), P, Q = problem.stride, problem.P, problem.Q
    H, W = problem.H, problem.W
    if isinstance(target, np.ndarray):
        pixels = (images, H, W, problem.C)
        if direction == "forward":
            target.reshape(images, P, Q, -1)[...] = source.reshape(pixels)[:, ::u, ::v]
        else:
            target.fill(0)
            target.reshape(pixels)[:, ::u, ::v] = source.reshape(images, P, Q, -1)
        return
    pixel_bytes = problem.C * problem.itemsize
    word = next(size for size in (16, 8, 4, 2)
                if pixel_bytes % size == 0 and source.data.ptr % size == 0 and target.data.ptr % size == 0)
    name = ("gather_sampled_" if direction == "forward" else "scatter_sampled_") + str(word)
    words = pixel_bytes // word
    _cuda.launch(_cuda.function("conv/gemm_1x1.cu", name, np.float32), target.nbytes // word,
                 (source, target, _cuda.i32(target.nbytes // word), _cuda.i32(words), _cuda.i32(H), _cuda.i32(W),
                  _cuda.i32(P), _cuda.i32(Q), _cuda.i32(u), _cuda.i32(v)))


def _sampled_products(direction: str, first: Any, second: Any, problem: ConvProblem, result: Any,
                      workspace: Any) -> None:
    """Forward or backward-data of a strided 1x1 channels-last problem into the channels-last ``result``, a chunk
    of images at a time: x's sampled pixels gathered into the workspace's rows, then one GEMM per group into y; or
    one GEMM per group from dy into the rows, then scattered onto dx."""
    Cg, Kg, N, PQ, HW = problem.C // problem.groups, problem.K // problem.groups, problem.N, problem.P * problem.Q, \
        problem.H * problem.W
    # as many images as the workspace it is handed holds (its plan's, which a cached plan may have sized otherwise)
    chunk = sampled_chunk(problem, workspace.nbytes)
    source = _pixel_rows(layout.to_channels_last(first))  # x's (N·H·W, C) rows, or dy's (N·P·Q, K)
    target = _pixel_rows(result)                           # y's (N·P·Q, K) rows, or dx's (N·H·W, C)
    for start in range(0, N, chunk):
        images = min(chunk, N - start)
        rows = workspace_array(workspace, (images * PQ, problem.C), problem.dtype)
        if direction == "forward":
            _move_sampled(direction, source[start * HW:(start + images) * HW], rows, images, problem)
            outputs = target[start * PQ:(start + images) * PQ]
            for g in range(problem.groups):
                blas.gemm(_group_columns(rows, g, Cg), weight_matrix(second, problem, g).T,
                          _group_columns(outputs, g, Kg))
        else:
            gradients = source[start * PQ:(start + images) * PQ]
            for g in range(problem.groups):
                blas.gemm(_group_columns(gradients, g, Kg), weight_matrix(second, problem, g),
                          _group_columns(rows, g, Cg))
            _move_sampled(direction, rows, target[start * HW:(start + images) * HW], images, problem)


def _pixel_rows(array: Any) -> Any:
    """(N·H·W, C): a channels-last array's buffer as one row per pixel (a view; an array whose two layouts coincide
    is that buffer already)."""
    N, C, H, W = array.shape
    return layout.flat(array).reshape(N * H * W, C)


def _group_columns(rows: Any, g: int, width: int) -> Any:
    """Group g's block of ``width`` columns of a pixel-rows matrix (its leading dimension all the groups')."""
    return rows[:, g * width:(g + 1) * width]


def _pixel_rows_products(direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
                         accumulate: bool, workspace: Any) -> None:
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
    if samples_pixels(problem):
        layout.write_channels_last(out, lambda result: _sampled_products(direction, first, second, problem, result,
                                                                         workspace))
    else:
        layout.write_channels_last(out, lambda result: _rows_products(direction, first, second, problem, result))


def _rows_products(direction: str, first: Any, second: Any, problem: ConvProblem, result: Any) -> None:
    """Forward or backward-data of a 1x1 stride-1 problem into the channels-last ``result``: one GEMM per group from x's
    or dy's pixel rows into y's or dx's."""
    Cg, Kg = problem.C // problem.groups, problem.K // problem.groups
    source_rows, result_rows = _pixel_rows(layout.to_channels_last(first)), _pixel_rows(result)
    source_width, result_width = (Cg, Kg) if direction == "forward" else (Kg, Cg)
    for g in range(problem.groups):
        weights = weight_matrix(second, problem, g)  # (K/G, C/G)
        blas.gemm(_group_columns(source_rows, g, source_width), weights.T if direction == "forward" else weights,
                  _group_columns(result_rows, g, result_width))


def _ones(row: Any) -> Any:
    """``row`` (1, N) filled with ones: on the GPU by gemm_1x1.cu's launch, which a recording keeps."""
    if isinstance(row, np.ndarray):
        row.fill(1)
    else:
        _cuda.launch(_cuda.function("conv/gemm_1x1.cu", "ones", row.dtype), row.size, (row, _cuda.i32(row.size)))
    return row


register(Gemm1x1())
