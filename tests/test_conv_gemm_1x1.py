"""``gemm_1x1`` on channels-last problems: each direction one GEMM per group over the (N·H·W × C) pixel rows of the
channels-last buffers, no workspace, held to the float64 ``reference`` on C-contiguous copies of the same values
(float64 and float32 tightly, the half types by the half bound of tests/test_conv_half.py), with groups, an image
of one pixel (whose two layouts coincide), operands of mixed layouts and a given ``out`` of either layout; and the
strided 1x1 channels-last problems' forward and backward-data, a GEMM on rows gathered from x's sampled pixels or
scattered onto dx's, a chunk of images at a time (a NaN-poisoned ``out`` shows that backward-data writes every pixel
of dx, zeros where no dy reaches).
Its C-contiguous path is held by test_primitives_conv.py's shared cases."""
import numpy as np
import pytest

from minidnn.primitives import conv, layout
from minidnn.primitives.conv import gemm_1x1
from tests.helpers import assert_within_half_bound, half_operand, to_numpy
from tests.test_conv_half import operand_shapes, reduction_length
from tests.test_conv_implicit_gemm import output_shape, problem_of, run

ALGO = "gemm_1x1"
DIRECTIONS = ("forward", "backward_data", "backward_filter")
# (N, C, H, W, K, R, S, stride, padding, dilation, groups)
CASES = {
    "odd_sizes": (3, 5, 4, 7, 9, 1, 1, 1, 0, 1, 1),
    "two_groups": (2, 12, 5, 3, 20, 1, 1, 1, 0, 1, 2),     # C/G 6, K/G 10: column blocks of the pixel rows
    "three_groups_one_pixel": (4, 9, 1, 1, 6, 1, 1, 1, 0, 1, 3),  # H = W = 1: the layouts coincide
}
# Strided 1x1 problems: forward and backward-data only (backward-filter sums over the batch)
STRIDED_CASES = {
    "stride_2_odd_width": (3, 6, 8, 11, 5, 1, 1, 2, 0, 1, 1),             # H = 2·P; W = 11, Q = 6
    "stride_3_by_2_two_groups": (2, 8, 9, 7, 10, 1, 1, (3, 2), 0, 1, 2),  # Q = 4 columns of 7
    "odd_height": (2, 7, 7, 6, 4, 1, 1, 2, 0, 1, 1),                         # H = 7: a last row no sample lands on
}
SAMPLED_DIRECTIONS = ("forward", "backward_data")
ALL_CASES = {**CASES, **STRIDED_CASES}
CASE_DIRECTIONS = [(name, direction) for name in CASES for direction in DIRECTIONS] + \
    [(name, direction) for name in STRIDED_CASES for direction in SAMPLED_DIRECTIONS]


def operands(xp, rng, case, direction, dtype, last_first=True, last_second=True):
    """The direction's two operands of ``dtype`` on xp, each channels-last when asked, and float64 copies."""
    values = [rng.standard_normal(shape) for shape in operand_shapes(case, direction)]
    arrays = [xp.asarray(v.astype(dtype)) for v in values]
    arrays = [layout.to_channels_last(a) if last else a for a, last in zip(arrays, (last_first, last_second))]
    return arrays, [v.astype(dtype).astype(np.float64) for v in values]


def reference(direction, exact, case):
    return run(direction, *exact, case, algo="reference")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case_name,direction", CASE_DIRECTIONS)
def test_channels_last_operands_match_float64(xp, rng, case_name, direction, dtype):
    case = ALL_CASES[case_name]
    (first, second), exact = operands(xp, rng, case, direction, dtype)
    got = run(direction, first, second, case, algo=ALGO)
    assert got.dtype == dtype
    if direction != "backward_filter" and not layout.coincide(got.shape):
        assert layout.is_channels_last(got)
    tolerance = 1e-12 if dtype == np.float64 else 2e-5
    want = reference(direction, exact, case)
    np.testing.assert_allclose(to_numpy(layout.contiguous(got)), want, rtol=tolerance,
                               atol=tolerance * np.abs(want).max())


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
# half pixels of 16 bytes (C = 8) and of 14 (C = 7): the GPU's gather and scatter in 16- and 2-byte words
@pytest.mark.parametrize("case_name,direction", [("two_groups", d) for d in DIRECTIONS] +
                         [(name, d) for name in ("stride_3_by_2_two_groups", "odd_height") for d in SAMPLED_DIRECTIONS])
def test_half_channels_last_within_the_half_bound(xp, rng, case_name, direction, name):
    case = ALL_CASES[case_name]
    shapes = operand_shapes(case, direction)
    (first, first_exact), (second, second_exact) = (half_operand(xp, rng, shape, name) for shape in shapes)
    first = layout.to_channels_last(first)
    if direction == "backward_filter":
        second = layout.to_channels_last(second)
    got = run(direction, first, second, case, algo=ALGO)
    exact = reference(direction, (first_exact, second_exact), case)
    magnitude = reference(direction, (np.abs(first_exact), np.abs(second_exact)), case)
    assert_within_half_bound(layout.contiguous(got), exact, magnitude, name, reduction_length(case, direction),
                             f"{direction} {name}")


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_channels_last_problem_runs_on_the_pixel_rows_without_workspace(monkeypatch, xp, rng, direction):
    """No workspace, and never the C-contiguous path (its per-image GEMMs, or copies of the operands)."""
    case = CASES["two_groups"]
    problem = problem_of(case, np.float64, "cpu" if xp is np else "cuda").laid_out(True)
    assert gemm_1x1.Gemm1x1().workspace_bytes(problem, direction) == 0
    assert gemm_1x1.Gemm1x1().workspace_bytes(problem.laid_out(False), "backward_filter") > 0

    def refuse(*args, **kwargs):
        raise AssertionError("the C-contiguous path ran")

    monkeypatch.setattr(gemm_1x1.Gemm1x1, "run", refuse)
    (first, second), exact = operands(xp, rng, case, direction, np.float64)
    got = run(direction, first, second, case, algo=ALGO)
    np.testing.assert_allclose(to_numpy(layout.contiguous(got)), reference(direction, exact, case), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("direction", SAMPLED_DIRECTIONS)
def test_a_strided_problem_runs_in_chunks_of_images(monkeypatch, xp, rng, direction):
    """Its workspace holds the sampled rows of as many images as the default limit does (with the limit lowered,
    two of three); a call runs as many images a chunk as the workspace it is handed holds (here two, then one), and
    the result is the float64 reference's on every image."""
    case = STRIDED_CASES["stride_2_odd_width"]
    problem = problem_of(case, np.float64, "cpu" if xp is np else "cuda").laid_out(True)
    image_bytes = problem.P * problem.Q * problem.C * 8
    assert gemm_1x1.sampled_chunk(problem) == problem.N
    with monkeypatch.context() as patched:
        patched.setattr(gemm_1x1, "DEFAULT_WORKSPACE_LIMIT", 2 * image_bytes + 8)
        assert gemm_1x1.sampled_chunk(problem) == 2
        assert gemm_1x1.Gemm1x1().workspace_bytes(problem, direction) == 2 * image_bytes
    (first, second), exact = operands(xp, rng, case, direction, np.float64)
    out = layout.empty(output_shape(case, direction), np.float64, xp, True)
    out[...] = np.nan
    gemm_1x1.Gemm1x1().run_in_layout(direction, first, second, problem, out, False,
                                     xp.zeros(2 * image_bytes + 8, dtype=np.uint8))
    np.testing.assert_allclose(to_numpy(layout.contiguous(out)), reference(direction, exact, case), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("case_name,direction", [("two_groups", d) for d in DIRECTIONS] +
                         [(name, d) for name in STRIDED_CASES for d in SAMPLED_DIRECTIONS])
def test_mixed_layouts_and_a_given_out(xp, rng, case_name, direction):
    """One operand channels-last, the other C-contiguous (laid out first); a given out of either layout, poisoned
    with NaN and written in place (every pixel of a strided backward-data's dx, most of them zeros); a weight
    gradient added into out."""
    case = ALL_CASES[case_name]
    (first, second), exact = operands(xp, rng, case, direction, np.float64, last_second=False)
    want = reference(direction, exact, case)
    for last in (False, True):
        out = layout.empty(output_shape(case, direction), np.float64, xp, last and direction != "backward_filter")
        out[...] = np.nan
        assert run(direction, first, second, case, algo=ALGO, out=out) is out
        np.testing.assert_allclose(to_numpy(layout.contiguous(out)), want, rtol=1e-12, atol=1e-12)
    if direction == "backward_filter":
        out = xp.ones(output_shape(case, direction))
        run(direction, first, second, case, algo=ALGO, out=out, accumulate=True)
        np.testing.assert_allclose(to_numpy(out), want + 1, rtol=1e-12, atol=1e-12)


def test_find_offers_it_on_channels_last_problems(xp, rng):
    """The rules' first choice for a 1x1 layer, in either layout, and a channels-last call gives a channels-last y."""
    case = CASES["odd_sizes"]
    problem = problem_of(case, np.float32, "cpu" if xp is np else "cuda").laid_out(True)
    assert conv.selection.preference(problem, "forward")[0] == ALGO
    (first, second), exact = operands(xp, rng, case, "forward", np.float32)
    y = conv.conv2d_forward(first, second)
    assert layout.is_channels_last(y)
    np.testing.assert_allclose(to_numpy(layout.contiguous(y)), reference("forward", exact, case), rtol=2e-5,
                               atol=2e-5 * 10)


def test_strided_problems_it_takes(xp):
    """Forward and backward-data of any channels-last strided 1x1 unpadded problem, backward-data first in the
    rules' order; not backward-filter, not a C-contiguous or a padded problem."""
    device = "cpu" if xp is np else "cuda"
    for name in STRIDED_CASES:
        problem = problem_of(STRIDED_CASES[name], np.float32, device).laid_out(True)
        assert [gemm_1x1.Gemm1x1().supports(problem, d) for d in DIRECTIONS] == [True, True, False]
        assert conv.selection.preference(problem, "backward_data")[0] == ALGO
        assert not gemm_1x1.Gemm1x1().supports(problem.laid_out(False), "backward_data")
    padded = problem_of((2, 6, 8, 8, 5, 1, 1, 2, 1, 1, 1), np.float32, device).laid_out(True)
    assert not gemm_1x1.Gemm1x1().supports(padded, "backward_data")
    assert conv.selection.preference(padded, "backward_data")[0] != ALGO
