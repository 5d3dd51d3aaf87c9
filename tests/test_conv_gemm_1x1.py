"""``gemm_1x1`` on channels-last problems: each direction one GEMM per group over the (N·H·W × C) pixel rows of the
channels-last buffers, no workspace, held to the float64 ``reference`` on C-contiguous copies of the same values
(float64 and float32 tightly, the half types by the half bound of tests/test_conv_half.py), with groups, an image
of one pixel (whose two layouts coincide), operands of mixed layouts and a given ``out`` of either layout.
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


def operands(xp, rng, case, direction, dtype, last_first=True, last_second=True):
    """The direction's two operands of ``dtype`` on xp, each channels-last when asked, and float64 copies."""
    values = [rng.standard_normal(shape) for shape in operand_shapes(case, direction)]
    arrays = [xp.asarray(v.astype(dtype)) for v in values]
    arrays = [layout.to_channels_last(a) if last else a for a, last in zip(arrays, (last_first, last_second))]
    return arrays, [v.astype(dtype).astype(np.float64) for v in values]


def reference(direction, exact, case):
    return run(direction, *exact, case, algo="reference")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case_name", CASES)
def test_channels_last_operands_match_float64(xp, rng, case_name, direction, dtype):
    case = CASES[case_name]
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
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_half_channels_last_within_the_half_bound(xp, rng, direction, name):
    case = CASES["two_groups"]
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


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_mixed_layouts_and_a_given_out(xp, rng, direction):
    """One operand channels-last, the other C-contiguous (laid out first); a given out of either layout, written
    in place; a weight gradient added into out."""
    case = CASES["two_groups"]
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
