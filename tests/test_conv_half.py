"""Half-precision convolution (float16 and bfloat16 storage, float32 arithmetic): implicit GEMM's half build on
tensor cores and its NumPy twin, in all three directions, held to a float64 reference by an error bound.

The bound. The operands are half values, so each product is exact in float32 (11 × 11 or 8 × 8 significand
bits fit float32's 24); the float32 sum of L products is off by at most L·2⁻²⁴·Σ|a·b| whatever its order; and
the one rounding to the half type adds at most u·|result|, u = 2⁻¹¹ (float16) or 2⁻⁸ (bfloat16), plus, for
float16, half its smallest subnormal. So every element must lie within

    u·|exact| + (1 + u)·L·2⁻²⁴·Σ|a·b| + (2⁻²⁵ for float16)

of the float64 result of the same half inputs: L is the reduction length (C/G·R·S forward, K/G·R·S
backward-data, N·P·Q backward-filter) and Σ|a·b| the same convolution of the magnitudes. A wrong tap,
fragment or rounding misses it by orders of magnitude; outputs start as NaN, so an element never written
fails too.
"""
import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import conv, convert
from tests.helpers import (FLOAT32_UNIT, HALF_UNIT_ROUNDOFF, assert_half_twins_agree, assert_within_half_bound,
                           half_operand, to_numpy)
from tests.test_conv_implicit_gemm import TILE_EDGE_CASES, arguments, output_shape, problem_of
from tests.test_conv_implicit_gemm import run as run_algorithm

# Odd sizes at every tile edge of the half build (128 rows, 64 columns, 32 reduction indices a step): implicit
# GEMM's own edge cases, CaffeNet's conv1 on smaller images (the CPU twin is slow on 67 x 67).
CASES = {name: TILE_EDGE_CASES[name] for name in (
    "no_dimension_a_tile_multiple", "reduction_under_one_step", "one_by_one_stride_2", "grouped", "depthwise_stride_2",
    "dilated_strided_one_sided_padding", "many_tiles_and_splits")}
CASES["caffenet_conv1"] = (2, 3, 35, 35, 96, 11, 11, 4, 0, 1, 1)
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def run(direction, first, second, case, algo=None, **kwargs):
    """The direction with ``algo`` (None: the default choice, which must be one that runs half problems)."""
    return run_algorithm(direction, first, second, case, algo=algo, **kwargs)


def reduction_length(case, direction):
    p = problem_of(case)
    return {"forward": p.C // p.groups * p.R * p.S, "backward_data": p.K // p.groups * p.R * p.S,
            "backward_filter": p.N * p.P * p.Q}[direction]


def operand_shapes(case, direction):
    p = problem_of(case)
    return {"forward": (p.x_shape, p.w_shape), "backward_data": (p.y_shape, p.w_shape),
            "backward_filter": (p.x_shape, p.y_shape)}[direction]


def poisoned_output(xp, shape, name):
    return convert.float_to_half(xp.full(shape, np.nan, dtype=np.float32), name)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case_name", CASES)
def test_half_convolution_within_its_error_bound(xp, rng, case_name, direction, name):
    case = CASES[case_name]
    first_shape, second_shape = operand_shapes(case, direction)
    first, first_exact = half_operand(xp, rng, first_shape, name)
    second, second_exact = half_operand(xp, rng, second_shape, name, scale=0.5)
    out = poisoned_output(xp, output_shape(case, direction), name)
    assert run(direction, first, second, case, out=out) is out
    exact = run(direction, first_exact, second_exact, case, algo="reference")
    magnitude = run(direction, np.abs(first_exact), np.abs(second_exact), case, algo="reference")
    assert_within_half_bound(out, exact, magnitude, name, reduction_length(case, direction),
                        f"{case_name} {direction} {name} on {xp.__name__}")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_forward_fuses_bias_and_relu_before_its_one_rounding(xp, rng, name):
    case = CASES["no_dimension_a_tile_multiple"]
    problem = conv.problem.forward_problem(*(convert.float_to_half(xp.zeros(s, np.float32), name)
                                             for s in operand_shapes(case, "forward")),
                                           *arguments(case)[2], "cpu" if xp is np else "cuda")
    x, x_exact = half_operand(xp, rng, problem.x_shape, name)
    w, w_exact = half_operand(xp, rng, problem.w_shape, name, scale=0.5)
    bias, bias_exact = half_operand(xp, rng, (problem.K,), name)
    out = poisoned_output(xp, problem.y_shape, name)
    conv.implicit_gemm.forward_bias_activation(x, w, problem, out, bias=bias, relu=True)
    plain = run("forward", x_exact, w_exact, case, algo="reference")
    exact = np.maximum(plain + bias_exact.reshape(1, -1, 1, 1), 0)
    magnitude = run("forward", np.abs(x_exact), np.abs(w_exact), case, algo="reference") + np.abs(bias_exact).reshape(
        1, -1, 1, 1)
    length = reduction_length(case, "forward") + 1
    assert_within_half_bound(out, exact, magnitude, name, length, f"bias + ReLU {name} on {xp.__name__}")
    assert np.count_nonzero(exact == 0) > exact.size // 4  # the ReLU had work to do


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_backward_filter_accumulates_into_out(xp, rng, name):
    check_backward_filter_accumulates(xp, rng, CASES["many_tiles_and_splits"], name, None)


def check_backward_filter_accumulates(xp, rng, case, name, algo):
    """Backward-filter with ``accumulate`` adds its half gradient into out's before one rounding, within the bound."""
    x, x_exact = half_operand(xp, rng, operand_shapes(case, "backward_filter")[0], name)
    dy, dy_exact = half_operand(xp, rng, operand_shapes(case, "backward_filter")[1], name, scale=0.5)
    out, before = half_operand(xp, rng, output_shape(case, "backward_filter"), name, scale=10.0)
    run("backward_filter", x, dy, case, algo=algo, out=out, accumulate=True)
    exact = before + run("backward_filter", x_exact, dy_exact, case, algo="reference")
    magnitude = np.abs(before) + run("backward_filter", np.abs(x_exact), np.abs(dy_exact), case, algo="reference")
    assert_within_half_bound(out, exact, magnitude, name, reduction_length(case, "backward_filter") + 1,
                        f"accumulate {name} on {xp.__name__}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_the_gpu_and_its_numpy_twin_agree_to_a_rounding(rng, direction, name):
    """The same float32 sums in another order, rounded once each: apart by at most one unit in the last place
    of the larger plus what the two float32 sums may differ by (2·L·2⁻²⁴·Σ|a·b|), and equal nearly everywhere."""
    cupy = backend.cupy()
    case = CASES["many_tiles_and_splits"]
    first_shape, second_shape = operand_shapes(case, direction)
    first, first_exact = half_operand(np, rng, first_shape, name)
    second, second_exact = half_operand(np, rng, second_shape, name, scale=0.5)
    on_cpu = run(direction, first, second, case)
    on_gpu = run(direction, *(cupy.asarray(a.view(np.uint16) if name == "bfloat16" else a) for a in (first, second)),
                 case)
    magnitude = run(direction, np.abs(first_exact), np.abs(second_exact), case, algo="reference")
    assert_half_twins_agree(on_gpu, on_cpu, name, 2 * reduction_length(case, direction) * FLOAT32_UNIT * magnitude)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_only_algorithms_written_for_half_storage_run_it(xp, name):
    case = CASES["grouped"]
    x, w = (convert.float_to_half(xp.ones(s, np.float32), name) for s in operand_shapes(case, "forward"))
    with pytest.raises(ValueError, match="does not support forward"):
        run("forward", x, w, case, algo="gemm")
    problem = conv.problem.forward_problem(x, w, *arguments(case)[2], "cpu" if xp is np else "cuda")
    assert problem.half_type == name and name in problem.describe()
    assert conv.selection.get(problem, "forward", 1 << 30).name == "implicit_gemm"


def test_half_arguments_are_checked():
    x = np.zeros((2, 3, 5, 5), np.float16)
    with pytest.raises(TypeError, match="weight must be a float32, float64, float16 or bfloat16 array"):
        conv.conv2d_forward(x, np.zeros((4, 3, 3, 3), np.uint16))  # uint16 is bfloat16 only on the GPU
    with pytest.raises(TypeError, match="input and weight"):
        conv.conv2d_forward(x, np.zeros((4, 3, 3, 3), np.float32))
    with pytest.raises(TypeError, match="grad_output must be float16"):
        conv.conv2d_backward_data(np.zeros((2, 4, 3, 3), np.float32), np.zeros((4, 3, 3, 3), np.float16), x.shape)


ONE_BY_ONE_CASES = {"one_by_one": TILE_EDGE_CASES["one_by_one"], "one_image": (1, 24, 7, 9, 40, 1, 1, 1, 0, 1, 1),
                    "grouped_1x1": (3, 12, 5, 6, 9, 1, 1, 1, 0, 1, 3)}


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case_name", ONE_BY_ONE_CASES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_1x1_runs_half_problems_within_the_bound(xp, rng, case_name, direction, name, accumulate):
    """The 1x1 algorithm on the half GEMMs: one rounding per result, backward-filter's per-image products and
    their sum kept in float32 (a rounding per image would break the bound by orders of magnitude)."""
    if accumulate and direction != "backward_filter":
        pytest.skip("accumulate is backward-filter's")
    case = ONE_BY_ONE_CASES[case_name]
    first_shape, second_shape = operand_shapes(case, direction)
    first, first_exact = half_operand(xp, rng, first_shape, name)
    second, second_exact = half_operand(xp, rng, second_shape, name, scale=0.5)
    before, before_exact = half_operand(xp, rng, output_shape(case, direction), name)
    out = before.copy() if accumulate else poisoned_output(xp, output_shape(case, direction), name)
    options = {"accumulate": True} if accumulate else {}
    assert run(direction, first, second, case, algo="gemm_1x1", out=out, **options) is out
    exact = run(direction, first_exact, second_exact, case, algo="reference")
    magnitude = run(direction, np.abs(first_exact), np.abs(second_exact), case, algo="reference")
    if accumulate:
        exact, magnitude = exact + before_exact, magnitude + np.abs(before_exact)
    assert_within_half_bound(out, exact, magnitude, name, reduction_length(case, direction),
                             f"gemm_1x1 {case_name} {direction} {name} on {xp.__name__}")


# ----------------------------------------------------------------------------------------------
# Backward-filter's float32 weight gradient (dtype=np.float32): the float32 sum, never rounded to the half type
# ----------------------------------------------------------------------------------------------
# (algorithm, case): those that sum into a float32 dw hand it over as it is; gemm_1x1 has no such path, so the
# dispatcher widens its rounded result.
FLOAT32_GRADIENT_CASES = {
    "implicit_gemm": CASES["many_tiles_and_splits"],
    "implicit_gemm_nhwc": (3, 24, 17, 19, 40, 3, 3, 1, 1, 1, 1),
    "implicit_gemm_wgmma": (3, 24, 17, 19, 40, 3, 3, 1, 1, 1, 1),
    "gemm_1x1": ONE_BY_ONE_CASES["one_by_one"],
}
GPU_ONLY = {"implicit_gemm_wgmma"}


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("algo", FLOAT32_GRADIENT_CASES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_backward_filter_gives_the_float32_gradient_unrounded(xp, rng, algo, name, accumulate):
    if algo in GPU_ONLY and xp is np:
        pytest.skip("Hopper's kernel")
    case = FLOAT32_GRADIENT_CASES[algo]
    x, x_exact = half_operand(xp, rng, operand_shapes(case, "backward_filter")[0], name)
    dy, dy_exact = half_operand(xp, rng, operand_shapes(case, "backward_filter")[1], name, scale=0.5)
    before = (rng.standard_normal(output_shape(case, "backward_filter")) * 10).astype(np.float32)
    out = xp.array(before) if accumulate else xp.full(output_shape(case, "backward_filter"), np.nan, np.float32)
    got = run("backward_filter", x, dy, case, algo=algo, out=out, accumulate=accumulate, dtype=np.float32)
    assert got is out and got.dtype == np.float32
    exact = run("backward_filter", x_exact, dy_exact, case, algo="reference")
    magnitude = run("backward_filter", np.abs(x_exact), np.abs(dy_exact), case, algo="reference")
    values = to_numpy(got).astype(np.float64)
    if accumulate:
        exact, magnitude = exact + before, magnitude + np.abs(before)
    if algo == "gemm_1x1":  # no float32 path: the dispatcher's widening of the rounded result, added in float32
        rounded = run("backward_filter", x, dy, case, algo=algo)
        widened = to_numpy(convert.half_to_float(rounded, name)).astype(np.float64)
        np.testing.assert_array_equal(values, (widened + before if accumulate else widened).astype(np.float32))
        return
    # float32 sums only: no half rounding in the bound (the half type's would be 2^13-2^16 times wider).
    length = reduction_length(case, "backward_filter") + accumulate
    bound = (1 + FLOAT32_UNIT) * length * FLOAT32_UNIT * magnitude + 2.0 ** -126
    assert np.all(np.abs(values - exact) <= bound), f"{algo} {name}: {np.max(np.abs(values - exact) - bound):.3g} over"
    # Not rounded on the way: a rounding to the half type would leave errors near u/2 of the largest gradients.
    gradient = run("backward_filter", x_exact, dy_exact, case, algo="reference")
    assert np.max(np.abs(values - exact)) < HALF_UNIT_ROUNDOFF[name] / 16 * np.max(np.abs(gradient))


def test_backward_filter_dtype_is_checked(xp):
    x16, dy16 = (convert.float_to_half(xp.zeros(s, np.float32), "bfloat16") for s in ((2, 8, 5, 5), (2, 4, 3, 3)))
    with pytest.raises(ValueError, match="dtype must be the input's dtype or float32"):
        conv.conv2d_backward_filter(x16, dy16, (4, 8, 3, 3), dtype=np.float64)
    with pytest.raises(ValueError, match="dtype must be the input's dtype \\(float32\\)"):
        conv.conv2d_backward_filter(xp.zeros((2, 8, 5, 5), np.float32), xp.zeros((2, 4, 3, 3), np.float32),
                                    (4, 8, 3, 3), dtype=np.float16)
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array"):
        conv.conv2d_backward_filter(x16, dy16, (4, 8, 3, 3), dtype=np.float32, out=xp.zeros((4, 8, 3, 3), np.float16))


@pytest.mark.parametrize("algo", ["implicit_gemm", "gemm_1x1"])
def test_a_float32_weight_gradient_sums_micro_batches(xp, rng, algo):
    """A plan of three micro-batches (3, 3 and 2 images) writes the first and adds the others into the float32
    gradient, natively (implicit_gemm) or each rounded and widened (gemm_1x1): the whole batch's gradient,
    within the float32 bound of the unsplit call's (or, for gemm_1x1, within one rounding per micro-batch)."""
    name, case = "bfloat16", (8, 16, 5, 6, 24, 1, 1, 1, 0, 1, 1)
    x, x_exact = half_operand(xp, rng, operand_shapes(case, "backward_filter")[0], name)
    dy, dy_exact = half_operand(xp, rng, operand_shapes(case, "backward_filter")[1], name, scale=0.5)
    problem = conv.problem.forward_problem(x, convert.float_to_half(xp.zeros(problem_of(case).w_shape, np.float32),
                                                                    name),
                                           *arguments(case)[2], "cpu" if xp is np else "cuda")
    algorithm = conv.registry.get(algo)
    plan = conv.plans.Plan(((3, algorithm), (3, algorithm), (2, algorithm)),
                           max(algorithm.workspace_bytes(problem.with_batch(n), "backward_filter") for n in (2, 3)))
    out = xp.full(problem.w_shape, np.nan, np.float32)
    conv.api._run(plan, "backward_filter", x, dy, problem, out)
    exact = run("backward_filter", x_exact, dy_exact, case, algo="reference")
    magnitude = run("backward_filter", np.abs(x_exact), np.abs(dy_exact), case, algo="reference")
    slack = 3 * HALF_UNIT_ROUNDOFF[name] * magnitude if algo == "gemm_1x1" else 0
    bound = (1 + FLOAT32_UNIT) * (reduction_length(case, "backward_filter") + 3) * FLOAT32_UNIT * magnitude + slack
    assert np.all(np.abs(to_numpy(out).astype(np.float64) - exact) <= bound + 2.0 ** -126)
