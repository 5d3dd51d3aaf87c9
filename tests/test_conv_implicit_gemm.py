"""The implicit_gemm algorithm beyond the shared convolution tests: its GPU kernels on shapes that
stress the tile edges, the TF32 tensor-core variant, beta = 1, the fused bias + ReLU epilogue, zero
workspace, and the kernels' register budget (nvcc, no GPU needed).

Every GPU result is compared with the float64 ``reference`` algorithm on the CPU (itself held to an
explicit loop reference in test_primitives_conv.py), on fresh random inputs, with the output
poisoned with NaN first so that an element the kernel never writes fails the comparison.
"""
import re

import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda, conv
from minidnn.primitives.conv import implicit_gemm
from tests.helpers import assert_close, cuda_constants, to_numpy
from tests.nvcc_builds import Build

# (N, C, H, W, K, R, S, stride, padding, dilation, groups)
TILE_EDGE_CASES = {
    "no_dimension_a_tile_multiple": (3, 5, 17, 19, 70, 3, 3, 1, 1, 1, 1),  # M 969, N 70, C·R·S 45
    "reduction_under_one_step": (2, 1, 9, 11, 3, 3, 3, 1, 1, 1, 1),        # forward C·R·S = 9
    "backward_reduction_under_one_step": (2, 3, 8, 7, 1, 2, 2, 1, 0, 1, 1),  # backward-data K·R·S = 4
    "caffenet_conv1": (2, 3, 67, 67, 96, 11, 11, 4, 0, 1, 1),                 # C = 3, 11x11, stride 4
    "one_by_one": (4, 64, 14, 14, 128, 1, 1, 1, 0, 1, 1),
    "one_by_one_stride_2": (2, 32, 15, 15, 64, 1, 1, 2, 0, 1, 1),
    "grouped": (2, 8, 13, 12, 12, 3, 3, 1, 1, 1, 4),
    "depthwise_stride_2": (2, 16, 10, 10, 16, 3, 3, 2, 1, 1, 16),
    "dilated": (2, 6, 15, 14, 10, 3, 3, 1, 2, 2, 1),
    "dilated_strided_one_sided_padding": (2, 5, 16, 13, 9, 3, 2, 2, (2, 0), (2, 3), 1),
    "stride_4_dilation_3": (1, 4, 23, 21, 7, 3, 3, 4, 1, 3, 1),
    "many_tiles_and_splits": (8, 32, 28, 28, 96, 3, 3, 1, 1, 1, 1),
}
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def arguments(case):
    N, C, H, W, K, R, S, stride, padding, dilation, groups = case
    return (N, C, H, W), (K, C // groups, R, S), (stride, padding, dilation, groups)


def problem_of(case, dtype=np.float64, device="cpu"):
    x_shape, w_shape, args = arguments(case)
    return conv.problem.make_problem(x_shape, w_shape, *args, np.dtype(dtype), device)


def random_inputs(rng, case):
    """float64 x, w (scaled so y is of order 1) and dy for ``case``."""
    problem = problem_of(case)
    x = rng.standard_normal(problem.x_shape)
    w = rng.standard_normal(problem.w_shape) / np.sqrt(np.prod(problem.w_shape[1:]))
    return x, w, rng.standard_normal(problem.y_shape)


def run(direction, first, second, case, algo="implicit_gemm", **kwargs):
    x_shape, w_shape, args = arguments(case)
    if direction == "forward":
        return conv.conv2d_forward(first, second, *args, algo=algo, **kwargs)
    if direction == "backward_data":
        return conv.conv2d_backward_data(first, second, x_shape, *args, algo=algo, **kwargs)
    return conv.conv2d_backward_filter(first, second, w_shape, *args, algo=algo, **kwargs)


def output_shape(case, direction):
    problem = problem_of(case)
    return {"forward": problem.y_shape, "backward_data": problem.x_shape, "backward_filter": problem.w_shape}[direction]


def operands(direction, x, w, dy):
    return {"forward": (x, w), "backward_data": (dy, w), "backward_filter": (x, dy)}[direction]


def relative_error(got, want):
    got, want = to_numpy(got).astype(np.float64), to_numpy(want)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def on_gpu(direction, x, w, dy, case, dtype):
    """The direction on the GPU in ``dtype``, written into an output poisoned with NaN."""
    cupy = backend.cupy()
    first, second = (cupy.asarray(a.astype(dtype)) for a in operands(direction, x, w, dy))
    out = cupy.full(output_shape(case, direction), np.nan, dtype=dtype)
    result = run(direction, first, second, case, out=out)
    assert result is out
    return out


# ----------------------------------------------------------------------------------------------
# GPU kernels against float64
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name", TILE_EDGE_CASES)
def test_gpu_kernels_match_float64_at_tile_edges(rng, name, direction):
    case = TILE_EDGE_CASES[name]
    x, w, dy = random_inputs(rng, case)
    want = run(direction, *operands(direction, x, w, dy), case, algo="reference")
    got64 = on_gpu(direction, x, w, dy, case, np.float64)
    assert_close(got64, want, rtol=1e-10, atol=1e-10, name=f"{name} {direction} float64")
    with _cuda.tf32(False):
        got32 = on_gpu(direction, x, w, dy, case, np.float32)
    assert got32.dtype == np.float32
    # float32 sums of up to ~6000 products: relative error ~1e-7·sqrt(terms), well under 2e-5.
    assert relative_error(got32, want) < 2e-5, f"{name} {direction} float32 (SIMT)"


@pytest.mark.gpu
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_more_groups_than_a_grid_dimension_holds(rng, direction):
    groups = 70000  # > 65535 blocks along grid y: the kernel loops over the remaining groups
    case = (1, groups, 2, 3, groups, 1, 2, 1, (1, 0), 1, groups)
    x, w, dy = random_inputs(rng, case)
    want = run(direction, *operands(direction, x, w, dy), case, algo="reference")
    assert_close(on_gpu(direction, x, w, dy, case, np.float64), want, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_tf32_tensor_cores_within_the_tf32_error_bound(rng, direction):
    case = (4, 64, 20, 20, 96, 3, 3, 1, 1, 1, 1)  # reductions of 576 (forward), 864 and 1600 products
    x, w, dy = random_inputs(rng, case)
    want = run(direction, *operands(direction, x, w, dy), case, algo="reference")
    with _cuda.tf32(False):
        fp32 = relative_error(on_gpu(direction, x, w, dy, case, np.float32), want)
    with _cuda.tf32(True):
        tf32 = relative_error(on_gpu(direction, x, w, dy, case, np.float32), want)
    # TF32 keeps 10 mantissa bits: each rounded operand is off by up to 2^-11 relative, ~3e-4 in all.
    assert tf32 < 2e-3, f"TF32 {direction}: relative error {tf32:.2e}"
    assert tf32 > 20 * fp32, f"TF32 {direction} ({tf32:.2e}) is not coarser than fp32 ({fp32:.2e}): no tensor cores?"
    with _cuda.tf32(True):  # float64 never takes the TF32 path
        assert_close(on_gpu(direction, x, w, dy, case, np.float64), want, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_filter_accumulates_into_out(rng, dtype, tf32):
    case = TILE_EDGE_CASES["many_tiles_and_splits"]
    cupy = backend.cupy()
    x, w, dy = random_inputs(rng, case)
    dw = run("backward_filter", x, dy, case, algo="reference")
    before = rng.standard_normal(dw.shape)
    out = cupy.asarray(before.astype(dtype))
    with _cuda.tf32(tf32):
        result = run("backward_filter", cupy.asarray(x.astype(dtype)), cupy.asarray(dy.astype(dtype)), case,
                     out=out, accumulate=True)
    assert result is out
    if dtype == np.float64:
        assert_close(out, before + dw, rtol=1e-10, atol=1e-10)
    else:
        assert relative_error(to_numpy(out) - before.astype(np.float32), dw) < (2e-3 if tf32 else 2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_bias_and_relu_epilogue_on_the_gpu(rng, dtype, tf32):
    case = TILE_EDGE_CASES["no_dimension_a_tile_multiple"]
    cupy = backend.cupy()
    x, w, _ = random_inputs(rng, case)
    problem = problem_of(case, dtype, "cuda")
    bias = rng.standard_normal(problem.K)
    y = run("forward", x, w, case, algo="reference")
    tolerance = dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=0, atol=1e-2 if tf32 else 1e-4)
    for with_bias, relu in [(True, True), (True, False), (False, True)]:
        want = y + bias.reshape(1, -1, 1, 1) if with_bias else y
        want = np.maximum(want, 0) if relu else want
        out = cupy.full(y.shape, np.nan, dtype=dtype)
        with _cuda.tf32(tf32):
            implicit_gemm.forward_bias_activation(cupy.asarray(x.astype(dtype)), cupy.asarray(w.astype(dtype)),
                                                  problem, out, bias=cupy.asarray(bias.astype(dtype)) if with_bias
                                                  else None, relu=relu)
        assert_close(out, want, **tolerance, name=f"bias {with_bias}, relu {relu}")


@pytest.mark.gpu
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_no_memory_is_allocated_beyond_the_output(rng, direction):
    case = TILE_EDGE_CASES["many_tiles_and_splits"]
    cupy = backend.cupy()
    x, w, dy = random_inputs(rng, case)
    first, second = (cupy.asarray(a) for a in operands(direction, x, w, dy))
    out = cupy.empty(output_shape(case, direction))
    run(direction, first, second, case, out=out, workspace_limit=0)  # compile and cache the plan
    backend.synchronize()
    _cuda.reset_peak_memory_stats()
    before = _cuda.memory_allocated()
    run(direction, first, second, case, out=out, workspace_limit=0)
    assert _cuda.max_memory_allocated() == before


# ----------------------------------------------------------------------------------------------
# The fused epilogue on either device; its argument checks
# ----------------------------------------------------------------------------------------------
def test_forward_bias_activation_matches_float64(xp, rng):
    case = (2, 4, 7, 6, 6, 3, 3, 1, 1, 1, 2)
    x, w, _ = random_inputs(rng, case)
    problem = problem_of(case, device="cpu" if xp is np else "cuda")
    bias = rng.standard_normal(problem.K)
    out = xp.full(problem.y_shape, np.nan)
    implicit_gemm.forward_bias_activation(xp.asarray(x), xp.asarray(w), problem, out, bias=xp.asarray(bias),
                                          relu=True)
    want = np.maximum(run("forward", x, w, case, algo="reference") + bias.reshape(1, -1, 1, 1), 0)
    assert (want == 0).any() and (want > 0).any()
    assert_close(out, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bias, relu, error, match", [
    (np.zeros(5), False, ValueError, "bias must have K=6 values"),
    (np.zeros((6, 1)), False, ValueError, "bias must be 1-D"),
    (np.zeros(6, np.float32), False, TypeError, "bias and input must have the same dtype"),
    (np.zeros(6, np.int64), False, TypeError, "bias must be a float32, float64, float16 or bfloat16 array"),
    (None, 1, TypeError, "relu must be a bool"),
])
def test_forward_bias_activation_refuses_bad_arguments(bias, relu, error, match):
    x, w = np.zeros((1, 2, 5, 5)), np.zeros((6, 2, 3, 3))
    problem = conv.problem.forward_problem(x, w, 1, 0, 1, 1, "cpu")
    with pytest.raises(error, match=match):
        implicit_gemm.forward_bias_activation(x, w, problem, np.zeros(problem.y_shape), bias=bias, relu=relu)


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16"])
def test_launch_constants_are_the_kernels_tiles(name):
    """implicit_gemm.py sizes its grids with the .cu's tile constants: the two must never drift apart."""
    half = _cuda.HALF_BUILDS.get(name)
    kernel = cuda_constants("conv/implicit_gemm.cu", np.uint16 if half else name, half or ())
    assert (implicit_gemm.THREADS, implicit_gemm.TILE_M[name], implicit_gemm.TILE_N, implicit_gemm.TILE_K[name]) == \
        (kernel["THREADS"], kernel["TILE_M"], kernel["TILE_N"], kernel["TILE_K"])
    assert implicit_gemm.DEFAULT_CTAS_PER_SM == kernel["CTAS_PER_SM"]


def test_needs_no_workspace_and_says_it_is_not_deterministic():
    algorithm = conv.registry.get("implicit_gemm")
    problem = conv.problem.forward_problem(np.zeros((2, 3, 9, 9)), np.zeros((4, 3, 3, 3)), 2, 1, 1, 1, "cuda")
    assert [algorithm.workspace_bytes(problem, d) for d in DIRECTIONS] == [0, 0, 0]
    assert algorithm.deterministic is False  # backward-filter adds split-K partial sums with atomicAdd
    assert conv.selection.get(problem, "forward", 0) is algorithm  # auto's choice on the GPU without workspace


# ----------------------------------------------------------------------------------------------
# The kernels' resources, from nvcc's report (no GPU needed)
# ----------------------------------------------------------------------------------------------
KERNELS = ["implicit_gemm_forward", "implicit_gemm_backward_data", "implicit_gemm_backward_filter",
           "implicit_gemm_backward_data_by_phase"]


# The session's builds of implicit_gemm.cu, the float and double ones shared with test_cuda_sources.
@pytest.mark.parametrize("nvcc_build", [Build("conv/implicit_gemm.cu", scalar) for scalar in ("float", "double")]
                         + [Build("conv/implicit_gemm.cu", "float", (("HALF", half),)) for half in (1, 2)],
                         indirect=True, ids=str)
def test_kernels_fit_two_ctas_per_sm_without_spills(nvcc_build):
    result, scalar = nvcc_build, nvcc_build.build.scalar
    half = bool(nvcc_build.build.defines)
    assert result.returncode == 0, result.stderr
    report = {}
    for name, body in re.findall(r"Compiling entry function '(\w+)' for 'sm_90'\n(.*?)(?=ptxas info\s+: Compiling|\Z)",
                                 result.stderr, re.S):
        registers = int(re.search(r"Used (\d+) registers", body).group(1))
        spills = [int(n) for n in re.findall(r"(\d+) bytes (?:stack frame|spill stores|spill loads)", body)]
        shared = int(re.search(r"(\d+) bytes smem", body).group(1))
        report[name] = (registers, spills, shared)
    if half:  # the half build has its tensor-core kernels alone
        expected = [f"{name}_half" for name in KERNELS]
    else:  # the TF32 tensor-core kernels exist in the float build only
        expected = KERNELS + ([f"{name}_tf32" for name in KERNELS] if scalar == "float" else [])
    assert sorted(report) == sorted(expected)
    for name, (registers, spills, shared) in report.items():
        assert registers <= 128, f"{name}: {registers} registers, over 128 (two CTAs of 256 threads per SM)"
        assert spills == [0, 0, 0], f"{name}: stack frame and spills {spills} bytes"
        assert shared <= 48 * 1024, f"{name}: {shared} bytes of static shared memory"


@pytest.mark.parametrize("nvcc_build", [Build("conv/implicit_gemm.cu", "float", (("CTAS_PER_SM", 3),))],
                         indirect=True, ids=str)
def test_three_cta_build_fits_80_registers(nvcc_build):
    """The second build (CTAS_PER_SM=3) must leave room for three CTAs of 256 threads: 65536 / 768 registers,
    rounded down to the allocation unit of 8, is 80."""
    result = nvcc_build
    assert result.returncode == 0, result.stderr
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", result.stderr)]
    assert len(registers) == 2 * len(KERNELS) and max(registers) <= 80, registers


# ----------------------------------------------------------------------------------------------
# Two CTAs per SM or three: the wave model that picks the build
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ctas, expected", [
    (200, 2),   # one partial wave either way: the default build, which spills nothing
    (264, 2),   # exactly one wave of two on 132 SMs
    (392, 3),   # 1.5 waves of two, one wave of three (ResNet-50 layer3.0.conv2 forward)
    (400, 2),   # two waves either way, the second of three nearly empty
    (784, 3),   # three waves of two, two of three
    (1014, 2),  # four waves of two (cost 8) against three of three (3 x 3 x 0.9 = 8.1): the default stays
])
def test_build_follows_the_waves(ctas, expected):
    assert implicit_gemm.ctas_per_sm_for("forward", ctas, _cuda.REFERENCE_PROFILE.sm_count) == expected
    assert implicit_gemm.ctas_per_sm_for("backward_data_by_phase", ctas, _cuda.REFERENCE_PROFILE.sm_count) == expected
    assert implicit_gemm.ctas_per_sm_for("backward_filter", ctas, _cuda.REFERENCE_PROFILE.sm_count) == 3  # always: measured faster on every layer


@pytest.mark.gpu
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_both_builds_give_the_same_results(rng, direction, monkeypatch):
    """The three-CTA build is the same arithmetic in the same order: forward and backward-data agree bit for
    bit with the default build; backward-filter's atomics reorder its sums, so it agrees to float64 rounding."""
    case = TILE_EDGE_CASES["many_tiles_and_splits"]
    x, w, dy = random_inputs(rng, case)
    results = {}
    for per_sm in (2, 3):
        monkeypatch.setattr(implicit_gemm, "ctas_per_sm_for", lambda direction, ctas, sms, per_sm=per_sm: per_sm)
        implicit_gemm._launch_configuration.cache_clear()  # the build is chosen once per problem, then looked up
        results[per_sm] = to_numpy(on_gpu(direction, x, w, dy, case, np.float64))
    implicit_gemm._launch_configuration.cache_clear()  # no forced build left behind for later tests
    if direction == "backward_filter":
        assert_close(results[3], results[2], rtol=1e-12, atol=1e-12)
    else:
        assert np.array_equal(results[3], results[2])
    want = run(direction, *operands(direction, x, w, dy), case, algo="reference")
    assert_close(results[3], want, rtol=1e-10, atol=1e-10)
