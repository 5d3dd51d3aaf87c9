"""Winograd F(2x2, 3x3), F(4x4, 3x3), F(4x4, 5x5) and backward-filter's F(7x7, 5x5): the transform matrices (and
their exact construction), each transform (NumPy twin and CUDA kernel) against float64 loops, the float32 error on
model shapes, the workspace formula, and the kernels' compilation.

All three directions of every Winograd algorithm are also run against the loop reference by tests/test_primitives_conv.py.
"""
import dataclasses
import re

import numpy as np
import pytest

from minidnn.primitives import _cuda
from minidnn.primitives.conv import registry, winograd
from minidnn.primitives.conv.problem import ConvProblem
from minidnn.primitives.conv.winograd import TRANSFORMS, Tiling, kernel_suffix
from tests.helpers import assert_close, to_numpy
from tests.nvcc_builds import Build
from tests.test_primitives_conv import DIRECTIONS, call, model_problems, relative_error, run_on_a_poisoned_workspace

SIZES = [(2, 3), (4, 3), (4, 5), (7, 5)]  # (m, r): F(m×m, r×r)
# F(7×7, 5×5) is backward-filter's alone: no filter or output transform (no kernels for them).
FORWARD_SIZES = [size for size in SIZES if size not in winograd.WEIGHT_GRADIENT_ONLY]


# ----------------------------------------------------------------------------------------------
# The matrices: F(m, r) computes a 1-D correlation exactly, and so does its transpose F(r, m)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m, r", SIZES)
def test_the_transforms_compute_a_correlation_exactly_in_float64(rng, m, r):
    BT, G, AT = TRANSFORMS[m, r]["input"], TRANSFORMS[m, r]["filter"], TRANSFORMS[m, r]["output"]
    alpha = m + r - 1
    # float64 rounding, magnified by the entries (F(7×7, 5×5)'s reach 3⁶ in Aᵀ and 4301/162 in Bᵀ)
    tol = dict(rtol=1e-12, atol=1e-12) if alpha <= 8 else dict(rtol=1e-10, atol=1e-10)
    assert BT.shape == (alpha, alpha) and G.shape == (alpha, r) and AT.shape == (m, alpha)
    for _ in range(5):
        d, g, e = rng.standard_normal(alpha), rng.standard_normal(r), rng.standard_normal(m)
        # F(m, r): m outputs of the correlation of d with an r-tap filter g.
        assert_close(AT @ ((G @ g) * (BT @ d)), [d[i:i + r] @ g for i in range(m)], **tol)
        # F(r, m), backward-filter's roles: r outputs of the correlation of d with an m-tap filter e.
        assert_close(G.T @ ((AT.T @ e) * (BT @ d)), [d[j:j + m] @ e for j in range(r)], **tol)
    # Nested in 2-D: one α×α patch and an r×r filter give the m×m tile of their correlation.
    d2, g2 = rng.standard_normal((alpha, alpha)), rng.standard_normal((r, r))
    tile = AT @ ((G @ g2 @ G.T) * (BT @ d2 @ BT.T)) @ AT.T
    assert_close(tile, [[np.sum(d2[i:i + r, j:j + r] * g2) for j in range(m)] for i in range(m)], **tol)


POINTS = {(2, 3): "0 1 -1", (4, 3): "0 1 -1 2 -2", (4, 5): "0 1 -1 2 -2 1/2 -1/2"}


@pytest.mark.parametrize("m, r", sorted(POINTS))
def test_cook_toom_rebuilds_the_written_matrices_from_their_points(m, r):
    """The generator that made F(7×7, 5×5)'s matrices gives the hand-written ones too, up to the sign of each
    point's row of Bᵀ, negated with the same row of G or column of Aᵀ (which leaves the product unchanged)."""
    built = winograd.cook_toom(m, r, [winograd.Fraction(p) for p in POINTS[m, r].split()])

    def signs(got, want):  # per row: the sign that turns got's row into want's, read at its largest entry
        largest = np.abs(got).argmax(axis=1)
        rows = np.arange(len(got))
        return np.sign(got[rows, largest] * want[rows, largest])

    filter_signs = signs(built["filter"], TRANSFORMS[m, r]["filter"])
    output_signs = signs(built["output"].T, TRANSFORMS[m, r]["output"].T)
    np.testing.assert_array_equal(built["filter"] * filter_signs[:, None], TRANSFORMS[m, r]["filter"])
    np.testing.assert_array_equal(built["output"] * output_signs[None, :], TRANSFORMS[m, r]["output"])
    np.testing.assert_array_equal(built["input"] * (filter_signs * output_signs)[:, None], TRANSFORMS[m, r]["input"])


def test_cook_toom_refuses_repeated_or_missing_points():
    with pytest.raises(ValueError, match="distinct finite points"):
        winograd.cook_toom(2, 3, [winograd.Fraction(0), winograd.Fraction(0), winograd.Fraction(1)])
    with pytest.raises(ValueError, match="takes 3 distinct"):
        winograd.cook_toom(2, 3, [winograd.Fraction(0), winograd.Fraction(1)])


# ----------------------------------------------------------------------------------------------
# Each transform against float64 loops, on NumPy (the twin) and on the GPU (the kernel, and the twin)
# ----------------------------------------------------------------------------------------------
def patch(x, n, c, top, left, size):
    """x[n, c] from (top, left), size × size, zeros outside x."""
    out = np.zeros((size, size))
    for a in range(size):
        for b in range(size):
            if 0 <= top + a < x.shape[2] and 0 <= left + b < x.shape[3]:
                out[a, b] = x[n, c, top + a, left + b]
    return out


def float32_close(xp, got, want, name):
    assert_close(got, want, rtol=2e-5, atol=2e-5 * float(np.max(np.abs(want))), name=name)


def twin(function, *arrays_and_args):
    """Run a transform on NumPy copies of the arrays (the twin); returns the NumPy output (the second argument)."""
    values = [to_numpy(a).copy() if hasattr(a, "shape") else a for a in arrays_and_args]
    function(*values)
    return values[1]


@pytest.mark.parametrize("m, r", SIZES)
# Tile origins: padding 1; paddings 3 and 0; backward-data's p − 2 > 0 (a padding of 3, rows start inside dy).
@pytest.mark.parametrize("origin", [(-1, -1), (-3, 0), (1, -2)])
def test_input_transform(xp, rng, m, r, origin):
    x = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    tiling = Tiling(2, 8, 6, m, r)
    alpha, BT = tiling.alpha, TRANSFORMS[m, r]["input"]
    out = xp.full((alpha * alpha, 3, tiling.count), np.nan, dtype=np.float32)
    winograd.input_transform(xp.asarray(x), out, tiling, origin)
    want = np.zeros((alpha, alpha, 3, 2, tiling.rows, tiling.columns))
    for n in range(2):
        for c in range(3):
            for row in range(tiling.rows):
                for col in range(tiling.columns):
                    d = patch(x, n, c, origin[0] + m * row, origin[1] + m * col, alpha)
                    want[:, :, c, n, row, col] = BT @ d @ BT.T
    float32_close(xp, out, want.reshape(out.shape), "input transform")
    if xp is not np:
        float32_close(xp, out, twin(winograd.input_transform, x, out, tiling, origin), "kernel against twin")


@pytest.mark.parametrize("m, r", FORWARD_SIZES)
def test_output_transform_crops_the_overhang(xp, rng, m, r):
    tiling = Tiling(2, 7, 9, m, r)  # m divides neither 7 nor 9: the last tiles overhang
    alpha = tiling.alpha
    products = rng.standard_normal((alpha * alpha, 5, tiling.count)).astype(np.float32)
    out = xp.full((2, 5, 7, 9), np.nan, dtype=np.float32)
    winograd.output_transform(xp.asarray(products), out, tiling)
    AT = TRANSFORMS[m, r]["output"]
    blocks = products.reshape(alpha, alpha, 5, 2, tiling.rows, tiling.columns).astype(np.float64)
    want = np.zeros((2, 5, tiling.rows * m, tiling.columns * m))
    for n in range(2):
        for k in range(5):
            for row in range(tiling.rows):
                for col in range(tiling.columns):
                    want[n, k, row * m:(row + 1) * m, col * m:(col + 1) * m] = AT @ blocks[:, :, k, n, row, col] @ AT.T
    float32_close(xp, out, want[:, :, :7, :9], "output transform")
    if xp is not np:
        float32_close(xp, out, twin(winograd.output_transform, products, out, tiling), "kernel against twin")


@pytest.mark.parametrize("m, r", SIZES)
def test_gradient_transform_treats_beyond_the_edge_as_zero(xp, rng, m, r):
    dy = rng.standard_normal((2, 4, 7, 5)).astype(np.float32)
    tiling = Tiling(2, 7, 5, m, r)
    alpha = tiling.alpha
    out = xp.full((alpha * alpha, 4, tiling.count), np.nan, dtype=np.float32)
    winograd.gradient_transform(xp.asarray(dy), out, tiling)
    A = TRANSFORMS[m, r]["output"].T
    want = np.zeros((alpha, alpha, 4, 2, tiling.rows, tiling.columns))
    for n in range(2):
        for k in range(4):
            for row in range(tiling.rows):
                for col in range(tiling.columns):
                    want[:, :, k, n, row, col] = A @ patch(dy, n, k, m * row, m * col, m) @ A.T
    float32_close(xp, out, want.reshape(out.shape), "gradient transform")
    if xp is not np:
        float32_close(xp, out, twin(winograd.gradient_transform, dy, out, tiling), "kernel against twin")


@pytest.mark.parametrize("m, r", FORWARD_SIZES)
@pytest.mark.parametrize("rotate", [False, True])
def test_filter_transform(xp, rng, m, r, rotate):
    w = rng.standard_normal((5, 3, r, r)).astype(np.float32)
    alpha, G = m + r - 1, TRANSFORMS[m, r]["filter"]
    out = xp.full((alpha * alpha, 5, 3), np.nan, dtype=np.float32)
    winograd.filter_transform(xp.asarray(w), out, m, rotate)
    want = np.zeros((alpha, alpha, 5, 3))
    for k in range(5):
        for c in range(3):
            g = np.rot90(w[k, c], 2) if rotate else w[k, c]
            want[:, :, k, c] = G @ g @ G.T
    float32_close(xp, out, want.reshape(out.shape), "filter transform")
    if xp is not np:
        float32_close(xp, out, twin(winograd.filter_transform, w, out, m, rotate), "kernel against twin")


@pytest.mark.parametrize("m, r", SIZES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_filter_gradient_transform_writes_or_adds(xp, rng, m, r, accumulate):
    alpha, G = m + r - 1, TRANSFORMS[m, r]["filter"]
    products = rng.standard_normal((alpha * alpha, 5, 3)).astype(np.float32)
    before = rng.standard_normal((5, 3, r, r)).astype(np.float32)
    out = xp.asarray(before.copy())
    winograd.filter_gradient_transform(xp.asarray(products), out, m, accumulate)
    blocks = products.reshape(alpha, alpha, 5, 3).astype(np.float64)
    want = np.stack([np.stack([G.T @ blocks[:, :, k, c] @ G for c in range(3)]) for k in range(5)])
    float32_close(xp, out, want + (before if accumulate else 0), "filter-gradient transform")
    if xp is not np:
        expected = before.copy()
        winograd.filter_gradient_transform(products, expected, m, accumulate)
        float32_close(xp, out, expected, "kernel against twin")


@pytest.mark.parametrize("m, r", SIZES)
def test_filter_gradient_transform_sums_the_first_splits_partial_products(xp, rng, m, r):
    alpha, G = m + r - 1, TRANSFORMS[m, r]["filter"]
    partials = rng.standard_normal((4, alpha * alpha, 5, 3)).astype(np.float32)
    partials[3] = np.nan  # a fourth partial product the transform is not asked to read
    out = xp.asarray(np.zeros((5, 3, r, r), np.float32))
    winograd.filter_gradient_transform(xp.asarray(partials.reshape(-1, 5, 3)), out, m, False, splits=3)
    blocks = partials[:3].astype(np.float64).sum(axis=0).reshape(alpha, alpha, 5, 3)
    want = np.stack([np.stack([G.T @ blocks[:, :, k, c] @ G for c in range(3)]) for k in range(5)])
    float32_close(xp, out, want, "sum of three partial products")


def problem_of(N, C, H, K, r, groups, dtype=np.float32):
    return ConvProblem(N, C, H, H, K, r, r, (1, 1), (r // 2, r // 2), (1, 1), groups, np.dtype(dtype), "cuda")


@pytest.mark.parametrize("shape, whole_batch, chunked", [
    # CaffeNet conv2: 128 products of one 128 × 48 tile: 3 splits (the fewest with two CTAs per SM; 3-8 all
    # cost one wave per split); chunked, one split's 3.1 MiB of partial products already exceeds its 3.75 MiB
    # share of the workspace with a second, so one split
    ((128, 96, 27, 256, 5, 2), 3, 1),
    # ResNet's 64-channel 3x3 layer: 72 CTAs a split; 7 splits make 4 waves of a seventh each, the fewest
    # per split; chunked, 0.56 MiB a split, 6 fit
    ((64, 64, 56, 64, 3, 1), 7, 6),
    ((64, 128, 28, 128, 3, 1), 6, 1),   # 108 CTAs a split: 6 splits, 5 waves of a sixth
    ((64, 256, 14, 256, 3, 1), 1, 1),   # 432 CTAs fill 132 SMs three times over: one cuBLAS call
    ((64, 512, 7, 512, 3, 1), 1, 1),
])
def test_weight_gradient_split_count(shape, whole_batch, chunked):
    """Winograd's backward-filter splits its GEMMs' reduction where the products alone leave SMs idle
    (benchmarks/results/2026-12-01-h200-winograd-weight-gradient-split-k/split-k-gemm.md measured each count)."""
    N, C, H, K, r, groups = shape
    problem = problem_of(N, C, H, K, r, groups)
    assert winograd.Winograd(4, r).weight_gradient_splits(problem) == whole_batch
    assert winograd.Winograd(4, r, chunked=True).weight_gradient_splits(problem) == chunked
    # the partial products are part of backward-filter's workspace, not of the other directions'
    whole = winograd.Winograd(4, r)
    filters = (4 + r - 1) ** 2 * K * (C // groups) * 4
    assert (whole.workspace_bytes(problem, "backward_filter") - whole.workspace_bytes(problem, "forward")
            == (whole_batch - 1) * filters)


def test_seven_by_seven_tiles_are_for_the_weight_gradient_alone_and_take_larger_chunks():
    """F(7×7, 5×5) offers backward-filter only; on CaffeNet's conv2 it transforms 121·4² values per image and
    channel where F(4×4, 5×5) transforms 64·7², so a chunk holds 20 images instead of 13 in the same 60 MiB."""
    conv2 = problem_of(128, 96, 27, 256, 5, 2)
    large, small = winograd.Winograd(7, 5, chunked=True), winograd.Winograd(4, 5, chunked=True)
    assert [large.supports(conv2, d) for d in DIRECTIONS] == [d == "backward_filter" for d in DIRECTIONS]
    assert large.tiling(conv2, "backward_filter", 1).count * 11 ** 2 == 1936
    assert large.images_per_chunk(conv2, "backward_filter") == 20
    assert small.images_per_chunk(conv2, "backward_filter") == 13
    assert large.workspace_bytes(conv2, "backward_filter") <= winograd.CHUNKED_WORKSPACE
    # 242 products of one 128 × 48 tile: split in 6 over the whole batch; in chunks one split (cuBLAS)
    assert winograd.Winograd(7, 5).weight_gradient_splits(conv2) == 6
    assert large.weight_gradient_splits(conv2) == 1


@pytest.mark.parametrize("m, r, expected", [(7, 5, False), (4, 5, None)])
def test_seven_by_seven_products_stay_float32_under_tf32(monkeypatch, rng, m, r, expected):
    """TF32's rounding through F(7×7, 5×5)'s transforms is a 13% error on conv2 (F(4×4, 5×5): 5.7e-3), so its
    GEMMs ask cuBLAS for full float32 whatever the math mode; F(4×4)'s follow the switch."""
    seen = []
    real = winograd.blas.gemm_batched
    monkeypatch.setattr(winograd.blas, "gemm_batched", lambda *args, **kwargs: (seen.append(kwargs.get("tf32")),
                                                                                 real(*args, **kwargs))[1])
    problem = ConvProblem(2, 4, 9, 9, 6, r, r, (1, 1), (2, 2), (1, 1), 2, np.dtype(np.float32), "cpu")
    algorithm = winograd.Winograd(m, r, chunked=True)
    monkeypatch.setattr(algorithm, "weight_gradient_splits", lambda problem: 1)  # cuBLAS's path
    out = np.zeros(problem.w_shape, np.float32)
    workspace = np.zeros(algorithm.workspace_bytes(problem, "backward_filter"), np.uint8)
    algorithm.backward_filter(rng.standard_normal(problem.x_shape).astype(np.float32),
                              rng.standard_normal(problem.y_shape).astype(np.float32), problem, out, False, workspace)
    assert seen and set(seen) == {expected}


@pytest.mark.gpu
def test_seven_by_seven_weight_gradient_error_is_the_same_with_tf32_on(rng):
    from minidnn import backend  # noqa: PLC0415
    x = rng.standard_normal((4, 96, 27, 27)).astype(np.float32)
    dy = rng.standard_normal((4, 256, 27, 27)).astype(np.float32)
    args = (1, 2, 1, 2)
    want = call("backward_filter", x.astype(np.float64), dy.astype(np.float64), (256, 48, 5, 5), args,
                algo="reference")
    cupy = backend.cupy()
    for algo in ("winograd_7x7_5x5", "winograd_7x7_5x5_chunked"):
        with _cuda.tf32(True):
            got = call("backward_filter", cupy.asarray(x), cupy.asarray(dy), (256, 48, 5, 5), args, algo=algo,
                       workspace_limit=1 << 40)
        assert relative_error(got, want) < BOUNDS["winograd_7x7_5x5"], algo


# ----------------------------------------------------------------------------------------------
# float32 error against float64 on model shapes (the bounds the module docstring documents)
# ----------------------------------------------------------------------------------------------
MODEL_SHAPES = {  # (N, C, H, W, K, groups) per filter size
    # ResNet-18's 56² layer, CaffeNet's conv3 (the largest errors), ResNet's 7² layer
    3: [(1, 64, 56, 56, 64, 1), (1, 256, 13, 13, 384, 1), (1, 512, 7, 7, 512, 1)],
    5: [(1, 96, 27, 27, 256, 2)],  # CaffeNet's conv2
}
# About 4x the largest measured: 6.1e-7, 3.7e-6 and 4.1e-6 (F(4x4, 5x5): CaffeNet conv2's backward-data);
# backward-filter's F(7x7, 5x5): 4.5e-5 to 4.6e-5 on conv2 (three seeds), held to 1.5e-4, ten times F(4x4, 5x5)'s.
BOUNDS = {"winograd_2x2": 3e-6, "winograd_4x4": 1.5e-5, "winograd_4x4_5x5": 1.5e-5, "winograd_7x7_5x5": 1.5e-4}


@pytest.mark.parametrize("algo", sorted(BOUNDS))
def test_float32_error_on_model_shapes(xp, rng, algo):
    errors, r = [], registry.get(algo).r
    for N, C, H, W, K, groups in MODEL_SHAPES[r]:
        x = rng.standard_normal((N, C, H, W)).astype(np.float32)
        w = (rng.standard_normal((K, C // groups, r, r)) / np.sqrt(r * r * C / groups)).astype(np.float32)
        dy = rng.standard_normal((N, K, H, W)).astype(np.float32)
        inputs = {"forward": (x, w, None), "backward_data": (dy, w, x.shape), "backward_filter": (x, dy, w.shape)}
        args = (1, r // 2, 1, groups)  # stride 1, the padding that keeps the size
        for direction, (first, second, shape) in inputs.items():
            if not registry.get(algo).supports(problem_of(N, C, H, K, r, groups), direction):
                continue
            want = call(direction, first.astype(np.float64), second.astype(np.float64), shape, args, algo="reference")
            got = call(direction, xp.asarray(first), xp.asarray(second), shape, args, algo=algo,
                       workspace_limit=1 << 40)
            errors.append((relative_error(got, want), direction, (N, C, H, W, K, groups)))
    assert errors and max(errors)[0] < BOUNDS[algo], max(errors)


def tolerance_of(algorithm, dtype, want):
    """Element-wise tolerance against float64 on the small problems below: F(7×7, 5×5)'s float32 error, about
    15x F(4×4, 5×5)'s, is held relative to the largest value."""
    if dtype != np.float32:
        return dict(rtol=1e-10, atol=1e-10)
    if (algorithm.m, algorithm.r) in winograd.WEIGHT_GRADIENT_ONLY:
        return dict(rtol=1e-3, atol=1e-3 * float(np.max(np.abs(to_numpy(want)))))
    return dict(rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# The workspace formula: exactly the bytes the algorithm carves, and enough (poisoned, it still works)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["winograd_2x2", "winograd_4x4", "winograd_4x4_chunked", "winograd_4x4_5x5",
                                  "winograd_4x4_5x5_chunked", "winograd_7x7_5x5", "winograd_7x7_5x5_chunked"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_workspace_formula_is_exactly_what_is_carved(xp, rng, monkeypatch, algo, direction, dtype):
    device = "cpu" if xp is np else "cuda"
    algorithm = registry.get(algo)
    r = algorithm.r
    problem = ConvProblem(3, 4, 11, 9, 6, r, r, (1, 1), (2, r // 2 - 1), (1, 1), 2, np.dtype(dtype), device)
    if not algorithm.supports(problem, direction):
        pytest.skip(f"{algo} has no {direction}")
    ends, size, out, want = run_on_a_poisoned_workspace(xp, rng, monkeypatch, winograd, algorithm, problem,
                                                        direction)
    assert max(ends) == size
    tolerance = tolerance_of(algorithm, dtype, want)
    assert_close(out, want, **tolerance)


# ----------------------------------------------------------------------------------------------
# The chunked variant: several chunks give the whole batch's answer; the workspace stays bounded
# ----------------------------------------------------------------------------------------------
def two_images_a_chunk(monkeypatch, problem, direction, r=3, m=4):
    """The chunked F(m×m, r×r), its workspace cap set so that a chunk holds two images of ``problem``."""
    whole_batch = winograd.Winograd(m, r)
    alpha2, tiles = (m + r - 1) ** 2, whole_batch.tiling(problem, direction, 1).count
    filters = alpha2 * problem.K * (problem.C // problem.groups)
    if direction == "backward_filter":  # one partial product per split of the reduction
        filters *= whole_batch.weight_gradient_splits(problem)
    monkeypatch.setattr(winograd, "CHUNKED_WORKSPACE",
                        (filters + 2 * alpha2 * (problem.C + problem.K) * tiles) * problem.itemsize)
    return registry.get(winograd.Winograd(m, r, chunked=True).name)


@pytest.mark.parametrize("m, r", [(4, 3), (4, 5), (7, 5)])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunks_of_the_batch_give_the_whole_batch_answer(xp, rng, monkeypatch, direction, dtype, m, r):
    problem = ConvProblem(5, 4, 10, 7, 6, r, r, (1, 1), (1, 2), (1, 1), 2, np.dtype(dtype),
                          "cpu" if xp is np else "cuda")
    if not winograd.Winograd(m, r).supports(problem, direction):
        pytest.skip(f"F({m}x{m}, {r}x{r}) has no {direction}")
    algorithm = two_images_a_chunk(monkeypatch, problem, direction, r, m)
    assert algorithm.chunks(problem, direction) == [(0, 2), (2, 4), (4, 5)]
    ends, size, out, want = run_on_a_poisoned_workspace(xp, rng, monkeypatch, winograd, algorithm, problem,
                                                        direction)
    whole_batch = registry.get(winograd.Winograd(m, r).name)
    assert max(ends) == size < whole_batch.workspace_bytes(problem, direction)
    tolerance = tolerance_of(algorithm, dtype, want)
    assert_close(out, want, **tolerance)


def test_chunked_backward_filter_adds_to_the_gradient_given(xp, rng, monkeypatch):
    problem = ConvProblem(5, 3, 9, 9, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, np.dtype(np.float64),
                          "cpu" if xp is np else "cuda")
    algorithm = two_images_a_chunk(monkeypatch, problem, "backward_filter")
    assert len(algorithm.chunks(problem, "backward_filter")) == 3
    x, dy = rng.standard_normal(problem.x_shape), rng.standard_normal(problem.y_shape)
    before = rng.standard_normal(problem.w_shape)
    out = xp.asarray(before.copy())
    workspace = xp.zeros(algorithm.workspace_bytes(problem, "backward_filter"), dtype=np.uint8)
    algorithm.run("backward_filter", xp.asarray(x), xp.asarray(dy), problem, out, True, workspace)
    want = call("backward_filter", x, dy, problem.w_shape, (1, 1, 1, 1), algo="reference")
    assert_close(out, before + want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# Paired transforms: two transforms issued back to back go to the GPU as one launch
# ----------------------------------------------------------------------------------------------
class StandInOperand:
    """What launch_together reads of a device array: its dtype and size (not tests.helpers.StandInArray, which
    stands in for a packed launch's array)."""

    dtype, size = np.dtype(np.float32), 10


def test_launch_together_makes_a_pair_one_launch_and_anything_else_one_launch_each(monkeypatch):
    launches = []
    monkeypatch.setattr(_cuda, "function", lambda source, name, dtype: name)
    monkeypatch.setattr(_cuda, "grid_stride_blocks", lambda count: -(-count // 100))
    monkeypatch.setattr(_cuda, "launch", lambda kernel, count, args: launches.append((kernel, count, args)))
    monkeypatch.setattr(_cuda, "launch_blocks",
                        lambda kernel, blocks, threads, args: launches.append((kernel, blocks, args)))
    x, V, dy, E = StandInOperand(), StandInOperand(), StandInOperand(), StandInOperand()
    images = winograd.TransformLaunch("input", "_4", 250, (x, V, "shape of x"), (x, V))
    gradient = winograd.TransformLaunch("gradient", "_4", 1000, (dy, E, "shape of dy"), (dy, E))
    winograd.launch_together(images, gradient)
    # One kernel: the images' 3 blocks first, then the gradient's 10, told where the second transform's start.
    assert launches == [("winograd_input_and_gradient_transform_4", 13,
                         (x, V, "shape of x", dy, E, "shape of dy", np.int32(3)))]
    launches.clear()
    winograd.launch_together(gradient, images)  # no kernel for this order: two launches, in the order given
    assert launches == [("winograd_gradient_transform_4", 1000, gradient.args),
                        ("winograd_input_transform_4", 250, images.args)]
    launches.clear()
    winograd.launch_together(None, images)  # a transform done already (the CPU's), then one alone
    winograd.launch_together(images, dataclasses.replace(gradient, suffix="_2"))  # two tile sizes: apart
    assert [kernel for kernel, _, _ in launches] == ["winograd_input_transform_4", "winograd_input_transform_4",
                                                     "winograd_gradient_transform_2"]


@pytest.mark.gpu
@pytest.mark.parametrize("m, r", [(4, 3), (4, 5), (7, 5)])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gpu_paired_transforms_give_the_singles_bits_in_fewer_launches(rng, monkeypatch, direction, m, r):
    """Three chunks: forward and backward-data launch the filter's transform with the first chunk's images and each
    chunk's output with the next chunk's images; backward-filter each chunk's images with its output gradient."""
    cupy = pytest.importorskip("cupy")
    problem = ConvProblem(5, 4, 10, 7, 6, r, r, (1, 1), (1, 2), (1, 1), 2, np.dtype(np.float32), "cuda")
    if not winograd.Winograd(m, r).supports(problem, direction):
        pytest.skip(f"F({m}x{m}, {r}x{r}) has no {direction}")
    algorithm = two_images_a_chunk(monkeypatch, problem, direction, r, m)
    chunks = len(algorithm.chunks(problem, direction))
    shapes = {"forward": (problem.x_shape, problem.w_shape, problem.y_shape),
              "backward_data": (problem.y_shape, problem.w_shape, problem.x_shape),
              "backward_filter": (problem.x_shape, problem.y_shape, problem.w_shape)}[direction]
    first, second = (cupy.asarray(rng.standard_normal(shape).astype(np.float32)) for shape in shapes[:2])
    workspace = cupy.zeros(algorithm.workspace_bytes(problem, direction), dtype=np.uint8)

    def run():
        out = cupy.full(shapes[2], np.nan, dtype=np.float32)
        with _cuda.recording() as steps:
            algorithm.run(direction, first, second, problem, out, False, workspace)
        return out, len(steps)

    paired, paired_steps = run()
    monkeypatch.setattr(winograd, "PAIRED", set())
    single, single_steps = run()
    np.testing.assert_array_equal(to_numpy(paired), to_numpy(single))
    # Alone, each chunk takes two transforms and a GEMM (split-K's kernel, or cuBLAS's), and one transform more
    # comes first (the filter's) or last (the filter gradient's). Paired, a chunk takes one launch and a GEMM.
    assert (paired_steps, single_steps) == (2 * chunks + 1, 3 * chunks + 1)


@pytest.mark.parametrize("algo", ["winograd_4x4_chunked", "winograd_4x4_5x5_chunked", "winograd_7x7_5x5_chunked"])
def test_chunked_workspace_does_not_grow_with_the_batch_and_fits_64_mib_on_the_models(algo):
    chunked, supported = registry.get(algo), 0
    for model, image in [("alexnet_caffe", 227), ("resnet18", 224), ("resnet50", 224)]:
        for problem in model_problems(model, image, 64, "cuda"):
            if not chunked.supports(problem, "backward_filter"):
                continue
            supported += 1
            for direction in (d for d in DIRECTIONS if chunked.supports(problem, d)):
                sizes = {chunked.workspace_bytes(dataclasses.replace(problem, N=batch, dtype=np.dtype(np.float32)),
                                                 direction) for batch in (64, 128, 256)}
                assert len(sizes) == 1 and max(sizes) <= 64 << 20, (model, problem.describe(), direction, sizes)
    assert supported > 0  # CaffeNet's conv2 is the 5x5 one


# ----------------------------------------------------------------------------------------------
# The kernels: every transform compiles for sm_90 with its matrices folded into constants
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nvcc_build", [Build("conv/winograd.cu", "float")], indirect=True, ids=str)
def test_kernels_compile_without_spills_or_local_arrays(nvcc_build):
    result = nvcc_build  # the session's one float build of winograd.cu, shared with test_cuda_sources
    assert result.returncode == 0, result.stderr
    kernels = re.findall(r"Compiling entry function '(\w+)'", result.stderr)
    # Each transform alone, and the pairs launched together (launch_together): forward and backward-data's only
    # where the tile size offers them.
    singles = ("filter", "input", "output", "gradient", "filter_gradient")
    pairs = tuple(f"{first}_and_{second}" for first, second in sorted(winograd.PAIRED))
    assert sorted(kernels) == sorted(f"winograd_{name}_transform{kernel_suffix(m, r)}" for m, r in SIZES
                                     for name in singles + pairs
                                     if (m, r) in FORWARD_SIZES or not {"filter", "output"} & set(name.split("_and_")))
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", result.stderr)
    assert len(frames) == len(kernels)
    # A stack frame would mean a transform matrix (or a tile) left in local memory instead of registers.
    assert all(frame == ("0", "0", "0") for frame in frames), result.stderr


def test_the_kernels_matrices_are_the_twins_matrices():
    """winograd.cu spells every matrix as a constant; on the CPU nothing else would notice a typo there."""
    source = open(_cuda.source_path("conv/winograd.cu"), encoding="utf-8").read()
    names = {(2, 3): "2", (4, 3): "4", (4, 5): "4x5", (7, 5): "7x5"}
    for (m, r), suffix in names.items():
        for kind, prefix in (("input", "InputMatrix"), ("filter", "FilterMatrix"), ("output", "OutputMatrix")):
            match = re.search(rf"MATRIX\({prefix}{suffix}, (\d+), (\d+), (\{{.*?\}})\)\n", source, re.S)
            assert match, f"{prefix}{suffix} not found in winograd.cu"
            rows = re.findall(r"\{([^{}]*)\}", match.group(3))
            values = np.array([[eval(v, {}) for v in row.split(",")] for row in rows], dtype=np.float64)  # noqa: S307
            assert values.shape == (int(match.group(1)), int(match.group(2)))
            np.testing.assert_array_equal(values, TRANSFORMS[m, r][kind], err_msg=f"{prefix}{suffix}")
