"""Winograd's minimal filtering (Lavin & Gray): in a transformed space a tile's r×r correlation is an element-wise
product, Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A, so an m×m output tile costs α² = (m + r − 1)² multiplications instead of
m²·r², and summing over channels turns each of the α² element positions into one matrix product (a batched GEMM).

The algorithms: ``winograd_2x2`` and ``winograd_4x4`` for 3x3 stride-1 convolution (2.25x or 4x fewer multiplies),
``winograd_4x4_5x5`` for 5x5 (6.25x fewer), and for the 5x5 weight gradient alone ``winograd_7x7_5x5`` (10.1x fewer,
a larger float32 error: see WEIGHT_GRADIENT_POINTS), each also ``_chunked`` where m > 2. F(m×m, r×r) cuts the
output into m×m tiles, each computed from an α×α input patch:

    U[ξν] (K × C/G)     = G g Gᵀ          per filter (k, c)              filter transform
    V[ξν] (C/G × tiles) = Bᵀ d B          per (channel, tile)            input transform
    M[ξν] (K × tiles)   = U[ξν] · V[ξν]   α²·G GEMMs, one blas.gemm_batched call
    y tile              = Aᵀ M A          per (k, tile), cropped at the edges     output transform

Tiles cover the whole (micro-)batch: tiles = N·⌈P/m⌉·⌈Q/m⌉. Backward-data is the same algorithm on dy with the
filter rotated 180° and C↔K swapped (U's transposed view), padding r − 1 − p. Backward-filter swaps the roles,
F(r×r, m×m): with the transposed transforms, dW = Gᵀ[Σ_tiles (A e Aᵀ) ⊙ (Bᵀ d B)]G over the output-gradient tiles
e, the sum over tiles being again α²·G GEMMs. All three directions need the same workspace:
α²·(K·C/G + (C + K)·tiles) values (U, V and M), with tiles counted on the grid the output transform writes
(dx's H×W for backward-data, P×Q otherwise). Backward-filter's products are small (K/G × C/G) with long sums,
too few to fill the GPU on some layers: there their reduction is split into S ranges (blas.gemm_batched_split_k,
our own kernel), each writing its own partial product, which the filter-gradient transform adds up; its first
term is then S·α²·K·C/G (weight_gradient_splits picks S).

That workspace grows with the batch (221 MiB for ResNet-18's 56² layers at batch 64, F(4×4)), so under the
default 64 MiB limit the whole-batch algorithms rarely fit. The ``_chunked`` variants take the batch a chunk
of images at a time instead, like cuDNN's FFT_TILING bounds FFT's: U is transformed once, then each chunk is
transformed, multiplied and transformed back (backward-filter adds the chunks' products into M with beta = 1),
with the chunk as many images as keep the whole workspace, α²·(K·C/G + (C + K)·tiles of a chunk) values,
within ``CHUNKED_WORKSPACE`` (60 MiB), whatever the batch.

On the GPU the transforms are the CUDA kernels of winograd.cu; on the CPU the functions below do the same
transforms with NumPy matrix products (the kernels' "twin": same matrices, same layouts, same GEMMs). Two
transforms that an algorithm issues back to back, with nothing between them that reads what the first writes, go
to the GPU as one launch (:func:`launch_together`): the filter's with the first chunk's images, a chunk's output
with the next chunk's images, backward-filter's images with its output gradient. A chunk then costs one launch and
a GEMM, not two launches and a GEMM, which an eager step's host pays for every one.

Numerics: the float32 error grows with the transforms' entries. F(2×2)'s are small, and it is close to direct
im2col + GEMM; F(4×4)'s reach Bᵀ 5, Aᵀ 8 and G 1/24, F(4×4, 5×5)'s Bᵀ 21/4 and G 1/90, F(7×7, 5×5)'s further
(WEIGHT_GRADIENT_POINTS). A weight gradient summed over a whole batch in one GEMM grows with the batch. TF32 GEMMs'
rounding is magnified by the same entries, so F(7×7, 5×5)'s GEMMs stay float32 under TF32. The measured errors,
and the bounds tests/test_conv_winograd.py holds them to: docs/convolution.md, Winograd, Measured.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from ... import backend
from .. import _cuda, blas
from .problem import ConvProblem
from .registry import ConvAlgorithm, register, store_filter_gradient, workspace_array
from .workspace import carved

# Transform matrices of F(m, r), keyed (m, r), in float64: Bᵀ (α×α), G (α×r), Aᵀ (m×α), α = m + r − 1.
# Cook-Toom with the fractions in G, as wincnn (Lavin & Gray) builds them: for the finite points a_j,
# Aᵀ[i, j] = a_j^i, G[j, k] = a_j^k / Π_{l≠j}(a_j − a_l), the point at infinity adding a last column of Aᵀ
# and a last row of G that pick the highest power (a row of G may be negated with the same row of Bᵀ);
# Bᵀ is then the one matrix that makes Aᵀ[(G g) ⊙ (Bᵀ d)] the correlation of d with g
# (tests/test_conv_winograd.py checks all three in float64).
TRANSFORMS = {
    (2, 3): {  # points 0, 1, -1
        "input": np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64),
        "filter": np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]]),
        "output": np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64),
    },
    (4, 3): {  # points 0, 1, -1, 2, -2
        "input": np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                           [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], dtype=np.float64),
        "filter": np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                            [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        "output": np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
                           dtype=np.float64),
    },
    (4, 5): {  # points 0, 1, -1, 2, -2, 1/2, -1/2 (α = 8; the first row of Bᵀ and of G negated, so G starts at 1)
        "input": np.array([[1, 0, -21 / 4, 0, 21 / 4, 0, -1, 0],
                           [0, 1, 1, -17 / 4, -17 / 4, 1, 1, 0],
                           [0, -1, 1, 17 / 4, -17 / 4, -1, 1, 0],
                           [0, 1 / 2, 1 / 4, -5 / 2, -5 / 4, 2, 1, 0],
                           [0, -1 / 2, 1 / 4, 5 / 2, -5 / 4, -2, 1, 0],
                           [0, 2, 4, -5 / 2, -5, 1 / 2, 1, 0],
                           [0, -2, 4, 5 / 2, -5, -1 / 2, 1, 0],
                           [0, -1, 0, 21 / 4, 0, -21 / 4, 0, 1]]),
        "filter": np.array([[1, 0, 0, 0, 0],
                            [-2 / 9, -2 / 9, -2 / 9, -2 / 9, -2 / 9],
                            [-2 / 9, 2 / 9, -2 / 9, 2 / 9, -2 / 9],
                            [1 / 90, 1 / 45, 2 / 45, 4 / 45, 8 / 45],
                            [1 / 90, -1 / 45, 2 / 45, -4 / 45, 8 / 45],
                            [32 / 45, 16 / 45, 8 / 45, 4 / 45, 2 / 45],
                            [32 / 45, -16 / 45, 8 / 45, -4 / 45, 2 / 45],
                            [0, 0, 0, 0, 1]]),
        "output": np.array([[1, 1, 1, 1, 1, 1, 1, 0],
                            [0, 1, -1, 2, -2, 1 / 2, -1 / 2, 0],
                            [0, 1, 1, 4, 4, 1 / 4, 1 / 4, 0],
                            [0, 1, -1, 8, -8, 1 / 8, -1 / 8, 1]]),
    },
}


def cook_toom(m: int, r: int, points: list[Fraction]) -> dict[str, np.ndarray]:
    """F(m, r)'s Bᵀ, G and Aᵀ built exactly (in fractions, then rounded once to float64) from its α − 1 finite
    interpolation points and the point at infinity, the construction the matrices above were written from:
    Aᵀ[i, j] = a_j^i, G[j, k] = a_j^k / Π_{l≠j}(a_j − a_l), the point at infinity adding a last column of Aᵀ and
    a last row of G that pick the highest power, and Bᵀ the one matrix that makes Aᵀ[(G g) ⊙ (Bᵀ d)] the
    correlation of d with g: for each column p of Bᵀ, the m·r equations Σ_j Aᵀ[i, j]·G[j, k]·Bᵀ[j, p] = [p = i + k]
    in α unknowns, solved by Gaussian elimination."""
    alpha = m + r - 1
    if len(points) != alpha - 1 or len(set(points)) != len(points):
        raise ValueError(f"F({m}, {r}) takes {alpha - 1} distinct finite points, got {points}")
    output = [[a ** i for a in points] + [Fraction(i == m - 1)] for i in range(m)]
    filter_ = [[a ** k / math.prod(a - b for b in points if b != a) for k in range(r)] for a in points]
    filter_.append([Fraction(k == r - 1) for k in range(r)])
    equations = [[output[i][j] * filter_[j][k] for j in range(alpha)] for i in range(m) for k in range(r)]
    columns = [_solve(equations, [Fraction(p == i + k) for i in range(m) for k in range(r)]) for p in range(alpha)]
    as_array = lambda rows: np.array([[float(v) for v in row] for row in rows])  # noqa: E731
    return {"input": as_array(zip(*columns)), "filter": as_array(filter_), "output": as_array(output)}


def _solve(equations: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction]:
    """The exact solution x of the consistent (possibly overdetermined) system equations · x = rhs."""
    rows = [row[:] + [value] for row, value in zip(equations, rhs)]
    unknowns, pivots = len(equations[0]), []
    for column in range(unknowns):
        pivot = next((i for i in range(len(pivots), len(rows)) if rows[i][column] != 0), None)
        if pivot is None:
            continue
        top = len(pivots)
        rows[top], rows[pivot] = rows[pivot], rows[top]
        rows[top] = [value / rows[top][column] for value in rows[top]]
        for i, row in enumerate(rows):
            if i != top and row[column] != 0:
                rows[i] = [a - row[column] * b for a, b in zip(row, rows[top])]
        pivots.append(column)
    if len(pivots) != unknowns or any(row[-1] != 0 for row in rows[unknowns:]):
        raise ValueError("the interpolation points give no exact transform")
    return [rows[i][-1] for i in range(unknowns)]


# F(7×7, 5×5) (α = 11), for backward-filter only: 7×7 tiles of dy with 11×11 input patches. Per image and channel
# it transforms and multiplies 121·⌈P/7⌉·⌈Q/7⌉ values where F(4×4, 5×5) takes 64·⌈P/4⌉·⌈Q/4⌉: 1936 against 3136
# on CaffeNet's 27² conv2, so 38% fewer multiplications and a chunk 1.6x as many images in the same workspace.
# The price is float32 error: larger points make larger entries (Bᵀ up to 4301/162, Aᵀ up to 3⁶). These points
# were chosen by conv2's float32 weight-gradient error among the sets a search on the CPU tried
# (benchmarks/probes/winograd_points.py; the errors: docs/convolution.md, Winograd, Measured). Under TF32 its GEMMs
# stay float32 (Winograd.backward_filter). Its forward and backward-data would carry the same error where
# F(4×4, 5×5) is already fast, so it does not offer them.
WEIGHT_GRADIENT_POINTS = [Fraction(p) for p in ("0", "3", "-3", "1/3", "-1/3", "3/2", "-3/2", "2/3", "-2/3", "1")]


class _BuiltOnFirstUse(Mapping):
    """A transform's matrices built when first read: F(7×7, 5×5)'s exact construction takes most of a tenth of a
    second, which every ``import minidnn`` would otherwise pay."""

    def __init__(self, build: Callable[[], dict[str, np.ndarray]]) -> None:
        self._build, self._matrices = build, None

    def _built(self) -> dict[str, np.ndarray]:
        if self._matrices is None:
            self._matrices = self._build()
        return self._matrices

    def __getitem__(self, key: str) -> np.ndarray:
        return self._built()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


TRANSFORMS[7, 5] = _BuiltOnFirstUse(lambda: cook_toom(7, 5, WEIGHT_GRADIENT_POINTS))
WEIGHT_GRADIENT_ONLY = {(7, 5)}
_SOURCE = "conv/winograd.cu"


@dataclasses.dataclass(frozen=True)
class Tiling:
    """m×m tiles covering an N-image batch of height × width outputs, numbered (n, row, column), column fastest,
    for an r×r filter: F(m×m, r×r)."""

    N: int
    height: int
    width: int
    m: int
    r: int = 3

    @property
    def rows(self) -> int:
        return -(-self.height // self.m)

    @property
    def columns(self) -> int:
        return -(-self.width // self.m)

    @property
    def count(self) -> int:
        return self.N * self.rows * self.columns

    @property
    def alpha(self) -> int:
        return self.m + self.r - 1

    @property
    def transforms(self) -> Mapping[str, np.ndarray]:
        return TRANSFORMS[self.m, self.r]


def kernel_suffix(m: int, r: int) -> str:
    """winograd.cu's kernel-name suffix for F(m×m, r×r): ``_4`` for F(4×4, 3×3), ``_4_5x5`` for F(4×4, 5×5)."""
    return f"_{m}" if r == 3 else f"_{m}_{r}x{r}"


def sandwich(matrix: np.ndarray, blocks: Any) -> Any:
    """matrix · block · matrixᵀ for every block of the last two axes, as (matrix · block) · matrixᵀ, the kernels'
    order."""
    xp = backend.get_array_module(blocks)
    matrix = xp.asarray(matrix.astype(blocks.dtype))
    return (matrix @ blocks) @ matrix.T


def grouped(array: Any, groups: int) -> Any:
    """(α², G·rows, columns) -> (α²·G, rows, columns): one matrix per (transform position, group), no copy."""
    positions, rows, columns = array.shape
    return array.reshape(positions * groups, rows // groups, columns)


# ----------------------------------------------------------------------------------------------
# The five transforms: a CUDA kernel each on the GPU, NumPy products on the CPU
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TransformLaunch:
    """A transform's launch on the GPU, worked out and not yet made (a transform called with ``defer``): kernel
    ``winograd_{transform}_transform{suffix}`` over ``count`` threads' iterations, with ``args``; ``arrays`` are
    the device arrays among them."""

    transform: str
    suffix: str
    count: int
    args: tuple
    arrays: tuple


# The pairs of transforms with a kernel of their own in winograd.cu, (first, second): the first's blocks come first.
PAIRED = {("filter", "input"), ("output", "input"), ("input", "gradient")}


def launch_together(first: TransformLaunch | None, second: TransformLaunch | None = None) -> None:
    """Make two deferred transforms' launches, in this order, as one launch where winograd.cu pairs them (each
    transform's own blocks; the two must not depend on each other), else one after the other. None stands for a
    transform that needs no launch: one done at its call, as on the CPU."""
    if first is None or second is None or first.count <= 0 or second.count <= 0 or first.suffix != second.suffix \
            or (first.transform, second.transform) not in PAIRED:
        for launch in (first, second):
            if launch is not None:
                _cuda.check_int32(*launch.arrays)
                _cuda.launch(_cuda.function(_SOURCE, f"winograd_{launch.transform}_transform{launch.suffix}",
                                            launch.arrays[0].dtype), launch.count, launch.args)
        return
    _cuda.check_int32(*first.arrays, *second.arrays)
    kernel = _cuda.function(_SOURCE, f"winograd_{first.transform}_and_{second.transform}_transform{first.suffix}",
                            first.arrays[0].dtype)
    first_blocks = _cuda.grid_stride_blocks(first.count)
    _cuda.launch_blocks(kernel, first_blocks + _cuda.grid_stride_blocks(second.count), _cuda.THREADS,
                        (*first.args, *second.args, _i32(first_blocks)))


def _made(launch: TransformLaunch, defer: bool) -> TransformLaunch | None:
    """``launch`` itself when deferred, else None once it is made."""
    if defer:
        return launch
    launch_together(launch)
    return None


def filter_transform(w: Any, out: Any, m: int, rotate: bool, defer: bool = False) -> TransformLaunch | None:
    """w (K, C/G, r, r) -> out (α², K, C/G): U = G g Gᵀ per filter; g rotated 180° when ``rotate``.

    With ``defer``, on the GPU the launch is returned for :func:`launch_together` instead of made (on the CPU the
    transform is done either way, and None returned); so for the other transforms."""
    K, Cg, r = w.shape[:3]
    if backend.get_array_module(w) is not np:
        return _made(TransformLaunch("filter", kernel_suffix(m, r), K * Cg, (w, out, _i32(K * Cg), _i32(int(rotate))),
                                     (w, out)), defer)
    g = w[:, :, ::-1, ::-1] if rotate else w
    alpha = m + r - 1
    out.reshape(alpha, alpha, K, Cg)[...] = sandwich(TRANSFORMS[m, r]["filter"], g).transpose(2, 3, 0, 1)
    return None


def input_transform(x: Any, out: Any, tiling: Tiling, origin: tuple[int, int],
                    defer: bool = False) -> TransformLaunch | None:
    """x (N, channels, H, W) -> out (α², channels, tiles): V = Bᵀ d B per α×α patch d.

    Tile (row, column) reads x from (origin + m·(row, column)), zeros outside x (the padding):
    ``origin`` is minus the padding, and may be positive (backward-data with padding above 2).
    """
    N, channels, height, width = x.shape
    if backend.get_array_module(x) is not np:
        shape = _tile_shape(N, channels, height, width, origin, tiling)
        return _made(TransformLaunch("input", kernel_suffix(tiling.m, tiling.r), channels * tiling.count,
                                     (x, out, shape), (x, out)), defer)
    m, alpha, overlap = tiling.m, tiling.alpha, tiling.r - 1
    region = np.zeros((N, channels, tiling.rows * m + overlap, tiling.columns * m + overlap), dtype=x.dtype)
    rows = slice(max(origin[0], 0), min(origin[0] + region.shape[2], height))
    cols = slice(max(origin[1], 0), min(origin[1] + region.shape[3], width))
    region[:, :, rows.start - origin[0]:rows.stop - origin[0], cols.start - origin[1]:cols.stop - origin[1]] = \
        x[:, :, rows, cols]
    patches = np.lib.stride_tricks.sliding_window_view(region, (alpha, alpha), axis=(2, 3))[:, :, ::m, ::m]
    transformed = sandwich(tiling.transforms["input"], patches)  # N, channels, rows, columns, α, α
    out.reshape(alpha, alpha, channels, N, tiling.rows, tiling.columns)[...] = transformed.transpose(4, 5, 1, 0, 2, 3)
    return None


def output_transform(products: Any, out: Any, tiling: Tiling, defer: bool = False) -> TransformLaunch | None:
    """products (α², channels, tiles) -> out (N, channels, height, width): y tile = Aᵀ M A, overhang cropped."""
    N, channels, height, width = out.shape
    if backend.get_array_module(out) is not np:
        shape = _tile_shape(N, channels, height, width, (0, 0), tiling)
        return _made(TransformLaunch("output", kernel_suffix(tiling.m, tiling.r), channels * tiling.count,
                                     (products, out, shape), (products, out)), defer)
    m, alpha = tiling.m, tiling.alpha
    blocks = products.reshape(alpha, alpha, channels, N, tiling.rows, tiling.columns).transpose(3, 2, 4, 5, 0, 1)
    tiles = sandwich(tiling.transforms["output"], blocks)  # N, channels, rows, columns, m, m
    whole = tiles.transpose(0, 1, 2, 4, 3, 5).reshape(N, channels, tiling.rows * m, tiling.columns * m)
    out[...] = whole[:, :, :height, :width]
    return None


def gradient_transform(dy: Any, out: Any, tiling: Tiling, defer: bool = False) -> TransformLaunch | None:
    """dy (N, K, P, Q) -> out (α², K, tiles): A e Aᵀ per m×m tile e of dy, zeros beyond dy's edges."""
    N, channels, height, width = dy.shape
    if backend.get_array_module(dy) is not np:
        shape = _tile_shape(N, channels, height, width, (0, 0), tiling)
        return _made(TransformLaunch("gradient", kernel_suffix(tiling.m, tiling.r), channels * tiling.count,
                                     (dy, out, shape), (dy, out)), defer)
    m, alpha = tiling.m, tiling.alpha
    region = np.zeros((N, channels, tiling.rows * m, tiling.columns * m), dtype=dy.dtype)
    region[:, :, :height, :width] = dy
    tiles = region.reshape(N, channels, tiling.rows, m, tiling.columns, m).transpose(0, 1, 2, 4, 3, 5)
    transformed = sandwich(tiling.transforms["output"].T, tiles)  # N, channels, rows, columns, α, α
    out.reshape(alpha, alpha, channels, N, tiling.rows, tiling.columns)[...] = transformed.transpose(4, 5, 1, 0, 2, 3)
    return None


def filter_gradient_transform(products: Any, out: Any, m: int, accumulate: bool, splits: int = 1) -> None:
    """products (splits·α², K, C/G) -> out (K, C/G, r, r): dW = Gᵀ M G with M the sum of the first ``splits``
    partial products (split-K's, in order), added to out when ``accumulate``."""
    K, Cg, r = out.shape[:3]
    if backend.get_array_module(out) is not np:
        launch_together(TransformLaunch("filter_gradient", kernel_suffix(m, r), K * Cg,
                                        (products, out, _i32(K * Cg), _i32(int(accumulate)), _i32(splits)),
                                        (products, out)))
        return
    alpha = m + r - 1
    partials = products.reshape(-1, alpha, alpha, K, Cg)[:splits]
    total = partials[0].copy()
    for partial in partials[1:]:  # one after another, the kernel's order
        total += partial
    store_filter_gradient(sandwich(TRANSFORMS[m, r]["filter"].T, total.transpose(2, 3, 0, 1)), out, accumulate)


def _i32(value: int) -> np.int32:
    return _cuda.i32(value)


# The C struct TileShape of winograd.cu: eight ints, in this order.
_TILE_SHAPE = np.dtype([(name, np.int32) for name in ("N", "channels", "height", "width", "origin_h", "origin_w",
                                                       "tiles_h", "tiles_w")])


@functools.lru_cache(maxsize=1024)
def _tile_shape(N: int, channels: int, height: int, width: int, origin: tuple[int, int], tiling: Tiling) -> np.void:
    return np.array([(N, channels, height, width, *origin, tiling.rows, tiling.columns)], dtype=_TILE_SHAPE)[0]


# ----------------------------------------------------------------------------------------------
# The algorithm
# ----------------------------------------------------------------------------------------------
class Winograd(ConvAlgorithm):
    """F(m×m, r×r) for one tile size m and filter size r (F(2×2, 3×3), F(4×4, 3×3), F(4×4, 5×5), and F(7×7, 5×5)
    for backward-filter only); see the module docstring. With ``chunked``, the batch is taken a chunk of images
    at a time, as many as keep U, V and M within ``CHUNKED_WORKSPACE`` bytes (at least one), so the workspace no
    longer grows with the batch; U is transformed once."""

    replayable = True  # transforms through _cuda.launch, products through blas: a repeat replays the recorded call

    def __init__(self, m: int, r: int = 3, chunked: bool = False) -> None:
        if (m, r) not in TRANSFORMS:
            raise ValueError(f"Winograd F({m}x{m}, {r}x{r}) has no transforms; known: {sorted(TRANSFORMS)}")
        self.m, self.r = m, r
        self.chunked = chunked
        self.name = f"winograd_{m}x{m}" + ("" if r == 3 else f"_{r}x{r}") + ("_chunked" if chunked else "")

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        if (self.m, self.r) in WEIGHT_GRADIENT_ONLY and direction != "backward_filter":
            return False
        return (problem.R, problem.S, problem.stride, problem.dilation) == (self.r, self.r, (1, 1), (1, 1))

    def tiling(self, problem: ConvProblem, direction: str, N: int | None = None) -> Tiling:
        """The tiles of the grid the last transform writes: dx's for backward-data, y's (= dy's) otherwise;
        for ``N`` images (default: the whole batch)."""
        N = problem.N if N is None else N
        if direction == "backward_data":
            return Tiling(N, problem.H, problem.W, self.m, self.r)
        return Tiling(N, problem.P, problem.Q, self.m, self.r)

    def weight_gradient_splits(self, problem: ConvProblem) -> int:
        """How many partial products backward-filter's GEMMs write (blas.gemm_batched_split_k), 1 meaning one
        cuBLAS call over the whole reduction.

        Its α²·G products make ``ctas`` CTAs of split_k_gemm.cu per split. 1 when they fill every SM twice
        over (cuBLAS is faster there). Otherwise at least two CTAs per SM, as many splits (up to MAX_SPLITS)
        as make the fewest waves per split: the kernel is issue-bound, so an SM given one CTA more than
        the others sets the time (72 CTAs in 4 splits, 288 on the profile's 132 SMs, take 3 waves of a quarter
        each; in 7, 4 waves of a seventh). The chunked variant keeps its partial products within
        SPLIT_K_CHUNKED_BYTES, so that they do not take the chunks' room (1 if two would not fit).
        """
        positions, Kg, Cg = (self.m + self.r - 1) ** 2, problem.K // problem.groups, problem.C // problem.groups
        ctas = positions * problem.groups * blas.split_k_tiles(Kg, Cg, problem.dtype)
        if ctas >= 2 * SPLIT_K_SMS:
            return 1
        fewest = min(MAX_SPLITS, -(-2 * SPLIT_K_SMS // ctas))
        splits = min(range(fewest, MAX_SPLITS + 1), key=lambda s: (-(-ctas * s // SPLIT_K_SMS) / s, s))
        if self.chunked:
            splits = min(splits, SPLIT_K_CHUNKED_BYTES // (positions * problem.K * Cg * problem.itemsize))
        return max(1, splits)

    def _values(self, problem: ConvProblem, direction: str, images: int) -> tuple[int, int]:
        """(U's values, or backward-filter's partial products M; V's and M's (E's) values for ``images``
        images)."""
        positions = (self.m + self.r - 1) ** 2
        tiles = self.tiling(problem, direction, images).count
        filters = positions * problem.K * (problem.C // problem.groups)
        if direction == "backward_filter":
            filters *= self.weight_gradient_splits(problem)
        return filters, positions * (problem.C + problem.K) * tiles

    def images_per_chunk(self, problem: ConvProblem, direction: str) -> int:
        """The whole batch, or (chunked) the most images whose workspace stays within CHUNKED_WORKSPACE."""
        if not self.chunked:
            return problem.N
        filters, per_image = self._values(problem, direction, 1)
        room = CHUNKED_WORKSPACE // problem.itemsize - filters
        return max(1, min(problem.N, room // per_image))

    def chunks(self, problem: ConvProblem, direction: str) -> list[tuple[int, int]]:
        """The (first, stop) image ranges taken one after another."""
        size = self.images_per_chunk(problem, direction)
        return [(first, min(first + size, problem.N)) for first in range(0, problem.N, size)]

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        filters, data = self._values(problem, direction, self.images_per_chunk(problem, direction))
        return (filters + data) * problem.itemsize

    def _chunk_buffers(self, workspace: Any, problem: ConvProblem, direction: str, rows: tuple[int, int, int],
                       copies: int = 1) -> list[tuple]:
        """For each chunk: (first, stop, its tiling, the (α², rows, columns) arrays, the same as per-group
        matrices (α²·G, rows/G, columns)). The arrays lie one after another in the workspace: (rows[0], C/G),
        ``copies`` times over (backward-filter's split-K partial products), then (rows[1], tiles) and
        (rows[2], tiles); each chunk size's are carved once, so the first array (U, or backward-filter's M)
        is the same memory in every chunk. Kept with a shared workspace (:func:`.workspace.carved`)."""
        return carved(workspace, (self.name, problem, direction, rows, copies),
                      lambda: self._carve(workspace, problem, direction, rows, copies))

    def _carve(self, workspace: Any, problem: ConvProblem, direction: str, rows: tuple[int, int, int],
               copies: int) -> list[tuple]:
        positions, G, carved_by_size, chunks = (self.m + self.r - 1) ** 2, problem.groups, {}, []
        for first, stop in self.chunks(problem, direction):
            if stop - first not in carved_by_size:
                tiling = self.tiling(problem, direction, stop - first)
                offset, arrays = 0, []
                for count, height, width in zip((copies * positions, positions, positions), rows,
                                                (problem.C // G, tiling.count, tiling.count)):
                    arrays.append(workspace_array(workspace, (count, height, width), problem.dtype, offset))
                    offset += arrays[-1].nbytes
                carved_by_size[stop - first] = tiling, arrays, [grouped(array, G) for array in arrays]
            chunks.append((first, stop, *carved_by_size[stop - first]))
        return chunks

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        rows = (problem.K, problem.C, problem.K)
        before = None  # what is launched with a chunk's images: the filter's transform, or the last chunk's output
        for first, stop, tiling, (U, V, M), (Ug, Vg, Mg) in self._chunk_buffers(workspace, problem, "forward", rows):
            if first == 0:
                before = filter_transform(w, U, self.m, rotate=False, defer=True)
            launch_together(before, input_transform(images(x, first, stop), V, tiling,
                                                    (-problem.padding[0], -problem.padding[1]), defer=True))
            blas.gemm_batched(Ug, Vg, Mg)
            before = output_transform(M, images(out, first, stop), tiling, defer=True)
        launch_together(before)

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        rows = (problem.K, problem.K, problem.C)
        before = None  # as in forward
        for first, stop, tiling, (U, V, M), (Ug, Vg, Mg) in self._chunk_buffers(workspace, problem, "backward_data",
                                                                                 rows):
            if first == 0:
                before = filter_transform(w, U, self.m, rotate=True, defer=True)
            # dx = dy convolved with the rotated filter at padding r − 1 − p: dx's tiles start at (p − r + 1) in dy.
            overlap = self.r - 1
            launch_together(before, input_transform(images(dy, first, stop), V, tiling,
                                                    (problem.padding[0] - overlap, problem.padding[1] - overlap),
                                                    defer=True))
            blas.gemm_batched(Ug.transpose(0, 2, 1), Vg, Mg)
            before = output_transform(M, images(out, first, stop), tiling, defer=True)
        launch_together(before)

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        rows = (problem.K, problem.C, problem.K)
        splits = self.weight_gradient_splits(problem)
        # F(7×7, 5×5)'s transforms magnify TF32's rounding far beyond F(4×4, 5×5)'s (docs/convolution.md, Winograd,
        # Measured): its products stay in float32 whatever the math mode.
        float32_only = (self.m, self.r) in WEIGHT_GRADIENT_ONLY
        tf32 = _cuda.allow_tf32() and problem.dtype == np.float32 and not float32_only
        # cuBLAS where the products alone fill the GPU (one split), and for TF32 (its tensor cores; over the
        # whole reduction, into the first partial product).
        split_k = splits > 1 and not tf32
        partials = None  # M as (splits, α²·G, K/G, C/G): the same memory in every chunk, viewed once
        for first, stop, tiling, (M, V, E), (Mg, Vg, Eg) in self._chunk_buffers(workspace, problem,
                                                                                 "backward_filter", rows, splits):
            launch_together(input_transform(images(x, first, stop), V, tiling,
                                            (-problem.padding[0], -problem.padding[1]), defer=True),
                            gradient_transform(images(dy, first, stop), E, tiling, defer=True))
            if partials is None:
                partials = Mg.reshape(splits, -1, *Mg.shape[1:])
            # The chunks' products add up in M (beta = 1 after the first), transformed back once.
            beta = 0.0 if first == 0 else 1.0
            if split_k:
                blas.gemm_batched_split_k(Eg, Vg.transpose(0, 2, 1), partials, beta=beta)
            else:
                blas.gemm_batched(Eg, Vg.transpose(0, 2, 1), partials[0], beta=beta,
                                  tf32=False if float32_only else None)
        filter_gradient_transform(M, out, self.m, accumulate, splits if split_k else 1)


def images(array: Any, first: int, stop: int) -> Any:
    """Images first..stop-1 of an (N, ...) array; the array itself when that is all of it (no view to make)."""
    return array if first == 0 and stop == array.shape[0] else array[first:stop]


# The chunked variant's whole workspace: just under the default 64 MiB limit, so that it fits there on
# every 3x3 layer of the reference models (U is largest on ResNet's 512-channel layers, 36·512·512·4
# bytes = 36 MiB, leaving 24 MiB of chunks), with chunks as large as that allows: each chunk costs a
# few kernel launches and a cuBLAS call of host time.
CHUNKED_WORKSPACE = 60 << 20

# Backward-filter's split-K (weight_gradient_splits) counts the SMs of the reference profile, the GPU the policy
# was measured on, not the device's own (so that workspace sizes are the same on every machine and the CPU twin
# runs the splits the GPU would); at most MAX_SPLITS partial products, and at most SPLIT_K_CHUNKED_BYTES of them
# in the chunked variants (measured: docs/convolution.md, Winograd, Measured).
SPLIT_K_SMS = _cuda.REFERENCE_PROFILE.sm_count
MAX_SPLITS = 8
SPLIT_K_CHUNKED_BYTES = CHUNKED_WORKSPACE // 16

register(Winograd(2))
register(Winograd(4))
register(Winograd(4, chunked=True))
register(Winograd(4, 5))
register(Winograd(4, 5, chunked=True))
register(Winograd(7, 5))
register(Winograd(7, 5, chunked=True))
