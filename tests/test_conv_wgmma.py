"""``implicit_gemm_wgmma``: ``implicit_gemm_nhwc`` with the products on Hopper's wgmma, in all three directions,
held on the GPU to the float64 reference by the half bound (tests/test_conv_half.py) and to the NumPy twin to a
rounding, on the cases of tests/test_conv_nhwc.py (rows, columns and reductions off the 128 × 128 × 64 tile, taps
on the padding, dilation, the 64-wide build, backward-filter's split, groups). Its NumPy twin is
implicit_gemm_nhwc's, which that file tests on the CPU.

The TF32 build (float32 problems, all three directions, backward-data at stride 1) is held on the same cases,
channels-last operands and C-contiguous ones, to the float64 product of its operands cut to TF32 (their low 13
fraction bits cleared) within float32 summation's error: what the kernel claims to compute, and what a build that
rounded the operands, or dropped a tap, would miss."""
from types import SimpleNamespace

import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda, conv, convert, layout, tensor_map
from minidnn.primitives.conv import implicit_gemm_nhwc, implicit_gemm_wgmma
from tests.test_conv_half import check_backward_filter_accumulates, operand_shapes
from tests.test_conv_implicit_gemm import output_shape, problem_of, relative_error, run
from tests.test_conv_nhwc import CASES, FORWARD_AND_FILTER, PADDED, STRIDED, check_direction, check_twins

ALGO = "implicit_gemm_wgmma"
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def test_what_it_supports(monkeypatch):
    """implicit_gemm_nhwc's problems; on the GPU only where wgmma runs."""
    algorithm, nhwc = implicit_gemm_wgmma.ImplicitGemmWgmma(), implicit_gemm_nhwc.ImplicitGemmNhwc()
    cases = [*CASES.values(), *STRIDED.values(), (2, 3, 9, 9, 16, 3, 3, 1, 1, 1, 1), (2, 16, 9, 9, 16, 3, 3, 1, 1, 1, 2)]
    monkeypatch.setattr(_cuda, "_tf32_enabled", False)  # float32 problems: implicit_gemm_nhwc's answer, no
    for hopper in (False, True):
        monkeypatch.setattr(_cuda, "has_wgmma", lambda hopper=hopper: hopper)
        for case in cases:
            for dtype, device in ((np.float16, "cpu"), (np.uint16, "cuda"), (np.float32, "cuda")):
                problem = problem_of(case, dtype, device)
                for direction in DIRECTIONS:
                    expected = nhwc.supports(problem, direction) and (hopper or device == "cpu")
                    assert algorithm.supports(problem, direction) == expected, (case, dtype, device, direction)
    on_gpu = problem_of(CASES["many_splits"], np.uint16, "cuda")
    assert [algorithm.is_deterministic(on_gpu, d) for d in DIRECTIONS] == [True, True, False]  # split-K's atomicAdd


def test_the_rules_prefer_it_on_hopper(monkeypatch):
    half_on_gpu = problem_of(CASES["rows_and_reduction_off_the_tiles"], np.uint16, "cuda")
    monkeypatch.setattr(_cuda, "has_wgmma", lambda: True)
    for direction in DIRECTIONS:
        assert conv.selection.get(half_on_gpu, direction, 1 << 30).name == ALGO


def test_shared_memory_holds_the_stages_on_the_swizzle_period():
    assert implicit_gemm_wgmma.shared_bytes(128) == 3 * 256 * 128 + 1024  # two CTAs fit an SM's 227 KiB
    assert implicit_gemm_wgmma.shared_bytes(64) == 3 * 192 * 128 + 1024
    # The forward kernel's launch bounds ask for three CTAs of a 64-wide tile an SM (FORWARD_CTAS_PER_SM): their
    # stages, each with the 1 KiB the driver keeps a CTA, fit the 228 KiB an SM has; a 128-wide tile's fit twice.
    assert 3 * (implicit_gemm_wgmma.shared_bytes(64) + 1024) <= 228 * 1024
    assert 3 * (implicit_gemm_wgmma.shared_bytes(128) + 1024) > 228 * 1024
    assert implicit_gemm_wgmma.shared_bytes(256) == 3 * 384 * 128 + 1024  # one CTA an SM
    # The epilogue's output tile reuses the stages: 128 rows of 256 float32 sums (and a pad of 8) fit in three.
    assert 128 * (256 + 8) * 4 <= 3 * 384 * 128


def test_the_tf32_backward_filter_holds_two_tiles_and_two_staging_buffers():
    """The TF32 backward-filter's shared memory: two staging buffers of 32 pixel rows (128 + 4 and width + 4 floats)
    and two stages of K-major tiles ((128 + width) rows of 128 bytes), one at 128 wide; two CTAs an SM at 64 and 128
    wide, one at 256 (each with the 1 KiB the driver keeps a CTA, within an SM's 228 KiB); the half build keeps
    forward's."""
    shared = implicit_gemm_wgmma.backward_filter_shared_bytes
    for width, tiles in ((64, 2), (128, 1), (256, 2)):
        assert shared(width, None) == tiles * (128 + width) * 128 + 2 * 32 * (132 + width + 4) * 4 + 1024
        ctas = implicit_gemm_wgmma.ctas_per_sm(width)
        assert ctas * (shared(width, None) + 1024) <= 228 * 1024 < (ctas + 1) * (shared(width, None) + 1024)
        for half in ("float16", "bfloat16"):
            assert shared(width, half) == implicit_gemm_wgmma.shared_bytes(width)
    assert [implicit_gemm_wgmma.ctas_per_sm(width) for width in (64, 128, 256)] == [2, 2, 1]


def test_every_build_and_direction_takes_implicit_gemm_nhwcs_widths():
    width = implicit_gemm_wgmma.tile_width
    columns = (8, 64, 65, 128, 136, 256, 264, 384, 392, 512, 1024, 2048)
    narrow = [64 if c <= 64 else 128 for c in columns]
    for kernel in ("forward", "backward_filter"):  # forward's kernel, which backward-data runs too; no build apart
        assert [width(c, kernel) for c in columns] == narrow  # (the TF32 backward-filter took 256 before)


def test_the_launch_geometry_of_resnet18s_last_layer_on_both_widths(monkeypatch):
    """ResNet-18's layer4 conv2 at batch 128 (512 -> 512 channels, 7 × 7) on 132 SMs: every kernel on 128-wide
    tiles, two CTAs an SM; the backward-filter's split aims at two waves of two. Forward takes the TMA build
    (512 channels fill 128-byte stages), on the gathers' grid."""
    kernels, launches = [], []
    monkeypatch.setattr(implicit_gemm_nhwc, "_launch_tile_kernel",
                        lambda kernel, grid, shared, args, threads=256: launches.append((grid, shared)))
    monkeypatch.setattr(implicit_gemm_wgmma, "_launch_tma", lambda x, w, out, shape, half, block_n, grid: (
        kernels.append((half, None, block_n)), launches.append((grid, "tma"))))
    monkeypatch.setattr(_cuda, "check_int32", lambda *arrays: None)
    monkeypatch.setattr(_cuda, "sm_count", lambda: 132)
    monkeypatch.setattr(implicit_gemm_wgmma, "_kernel", lambda *args, **options: kernels.append(args))
    case = (128, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1)
    for dtype in (np.float32, np.float16):  # float16 is a half type's storage on either device
        problem = problem_of(case, dtype, "cuda")
        out = np.zeros((1, 1, 1, 1), dtype)
        operand = SimpleNamespace(data=SimpleNamespace(ptr=256))  # on 16 bytes, as the maps need
        implicit_gemm_wgmma._launch_forward(operand, operand, out, implicit_gemm_nhwc._shape_struct(problem))
        implicit_gemm_wgmma._launch_backward_filter(None, None, None, problem)
    assert [args[2] for args in kernels] == [128, 128, 128, 128]
    staged = implicit_gemm_wgmma.backward_filter_shared_bytes(128, None)
    narrow = implicit_gemm_wgmma.shared_bytes(128)
    # forward: N·P·Q = 6272 rows, 49 tiles of 128, by 4 column tiles. backward-filter: R·S·C = 4608 rows, 36 tiles,
    # by 4 column tiles, 144 tiles for 4 × 132 CTAs: 196 stages of 32 pixels (TF32) in 4 slices of 49; 98 stages of
    # 64 (half values) in 4 slices of 25.
    assert launches == [((196, 1, 1), "tma"), ((144, 4, 1), staged), ((196, 1, 1), "tma"), ((144, 4, 1), narrow)]
    launches.clear()  # the gathers, where the TMA build is off
    monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_TMA", {128: False, 64: False, 256: False})
    implicit_gemm_wgmma._launch_forward(operand, operand, out, implicit_gemm_nhwc._shape_struct(problem))
    assert launches == [((196, 1, 1), narrow)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case_name", CASES)
def test_within_the_half_bound_on_the_gpu(rng, case_name, direction, name):
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    check_direction(backend.cupy(), rng, CASES[case_name], direction, name, f"{case_name} {direction} {name}",
                    algo=ALGO)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("case_name", FORWARD_AND_FILTER)
@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
def test_strided_and_padded_within_the_half_bound_on_the_gpu(rng, case_name, direction, name):
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    case = FORWARD_AND_FILTER[case_name]
    if not implicit_gemm_wgmma.ImplicitGemmWgmma().supports(problem_of(case, np.float16), direction):
        pytest.skip("backward-filter needs K a multiple of 8")
    check_direction(backend.cupy(), rng, case, direction, name, f"{case_name} {direction} {name}", algo=ALGO)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_backward_filter_adds_into_out_on_the_gpu(rng, name):
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    check_backward_filter_accumulates(backend.cupy(), rng, CASES["many_splits"], name, ALGO)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case", [(2, 40, 12, 11, 136, 3, 3, 1, 1, 1, 1), (16, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1),
                                  (4, 64, 30, 30, 64, 3, 3, 1, 1, 1, 1), (8, 32, 28, 28, 64, 3, 3, 1, 1, 1, 1)],
                         ids=["K136", "resnet_layer2", "K64", "many_splits"])
def test_the_gpu_and_its_numpy_twin_agree_to_a_rounding(rng, case, direction, name):
    """Against implicit_gemm_nhwc's twin (float32 sums of the same exact products, in another order; backward-
    filter's partial sums of its slices added in any order)."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    check_twins(rng, case, direction, name, algo=ALGO)


# ----------------------------------------------------------------------------------------------
# The TF32 build
# ----------------------------------------------------------------------------------------------
# TF32's copies are four floats: reductions of channels multiples of 4 (not of 8) run too.
# K 264 takes three 128-wide tiles, the last 8 wide; K 392 (and backward-data's C 392) four, the last 8 wide.
# PADDED's 3 and 5 channels are copied as 4 and 8.
TF32_CASES = {**CASES, **STRIDED, **PADDED, "four_channels_a_copy": (2, 12, 10, 9, 20, 3, 3, 1, 1, 1, 1),
              "four_channels_two_groups": (2, 24, 9, 11, 8, 3, 3, 1, 1, 1, 2),  # C/G 12, K/G 4
              "three_column_tiles_one_partial": (2, 16, 9, 7, 264, 3, 3, 1, 1, 1, 1),
              "four_column_tiles_one_partial": (3, 392, 9, 7, 392, 3, 3, 1, 1, 1, 1)}
FORWARD_AND_DATA = ("forward", "backward_data")


def tf32_expected(problem, direction):
    """The TF32 build's rules, restated: Hopper, TF32 allowed, the reduction's channels per group multiples of 4
    (C/G and K/G but for forward, which reduces C/G alone), backward-data at stride 1; C of one group padded to 4 in
    forward and backward-filter."""
    C, K = problem.C // problem.groups, problem.K // problem.groups
    channels_fit = C % 4 == 0 or (problem.groups == 1 and direction != "backward_data")
    if direction == "forward":
        return channels_fit
    return channels_fit and K % 4 == 0 and (direction == "backward_filter" or problem.stride == (1, 1))


def test_tf32_what_it_supports(monkeypatch):
    algorithm = implicit_gemm_wgmma.ImplicitGemmWgmma()
    cases = [*TF32_CASES.values(), (2, 3, 9, 9, 16, 3, 3, 1, 1, 1, 1), (2, 16, 9, 9, 6, 3, 3, 1, 1, 1, 1),
             (2, 8, 9, 9, 12, 3, 3, 1, 1, 1, 4), (2, 3, 9, 9, 6, 3, 3, 1, 1, 1, 1)]  # C 3; K 6; C/G 2; C 3 and K 6
    for hopper in (False, True):
        monkeypatch.setattr(_cuda, "has_wgmma", lambda hopper=hopper: hopper)
        for tf32 in (False, True):
            monkeypatch.setattr(_cuda, "_tf32_enabled", tf32)
            for case in cases:
                for device in ("cpu", "cuda"):
                    problem = problem_of(case, np.float32, device)
                    for direction in DIRECTIONS:
                        expected = hopper and tf32 and device == "cuda" and tf32_expected(problem, direction)
                        assert algorithm.supports(problem, direction) == expected, (case, device, direction, tf32)
    assert not algorithm.supports(problem_of(CASES["many_splits"], np.float64, "cuda"), "forward")


def test_tf32_the_rules_prefer_it_on_hopper_where_implicit_gemm_ran(monkeypatch):
    monkeypatch.setattr(_cuda, "has_wgmma", lambda: True)
    strided = problem_of(STRIDED["stride_2"], np.float32, "cuda")  # no Winograd: implicit GEMM's layer
    monkeypatch.setattr(_cuda, "_tf32_enabled", True)
    assert conv.selection.get(strided, "forward", 1 << 30).name == ALGO
    assert conv.selection.get(strided, "backward_filter", 1 << 30).name == ALGO
    first_layer = problem_of(PADDED["three_colour_channels_7x7_stride_2"], np.float32, "cuda")  # C 3, padded to 4
    for direction in ("forward", "backward_filter"):  # padded on channels-last activations; NCHW: implicit GEMM's
        assert conv.selection.get(first_layer.laid_out(True), direction, 1 << 30).name == ALGO
        assert conv.selection.get(first_layer, direction, 1 << 30).name == "implicit_gemm"
    half_first_layer = problem_of(PADDED["three_colour_channels_7x7_stride_2"], np.uint16, "cuda")  # padded to 8
    assert conv.selection.get(half_first_layer.laid_out(True), "forward", 1 << 30).name == ALGO
    assert conv.selection.get(half_first_layer, "forward", 1 << 30).name == "implicit_gemm"
    monkeypatch.setattr(_cuda, "_tf32_enabled", False)
    assert conv.selection.get(strided, "forward", 1 << 30).name == "implicit_gemm"


def test_tf32_workspace_holds_float32_copies():
    """The filter's copy and a copy of the source, four bytes a value, each on a 256-byte boundary."""
    case = TF32_CASES["four_channels_a_copy"]  # N 2, C 12, H 10, W 9, K 20
    problem = problem_of(case, np.float32, "cuda")
    algorithm = implicit_gemm_wgmma.ImplicitGemmWgmma()

    def aligned(values):
        return -(-values * 4 // 256) * 256
    assert algorithm.workspace_bytes(problem, "forward") == aligned(20 * 9 * 12) + aligned(2 * 10 * 9 * 12)
    assert algorithm.workspace_bytes(problem, "backward_data") == aligned(12 * 9 * 20) + aligned(2 * 10 * 9 * 20)
    # backward-filter: the float32 sum (K, R, S, C), then copies of x and dy (P 10 - 3 + 2 + 1, Q 9)
    assert algorithm.workspace_bytes(problem, "backward_filter") == (aligned(20 * 9 * 12) + aligned(2 * 10 * 9 * 12)
                                                                     + aligned(2 * 10 * 9 * 20))


def cut_to_tf32(array):
    """float32 values with their low 13 fraction bits cleared: TF32's 10 bits, cut toward zero."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def cut_reference(direction, first, second, case):
    """The float64 reference of ``direction`` on the operands cut to TF32: what the TF32 build computes."""
    return run(direction, cut_to_tf32(first).astype(np.float64), cut_to_tf32(second).astype(np.float64), case,
               algo="reference")


@pytest.mark.gpu
@pytest.mark.parametrize("operands_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case_name", TF32_CASES)
def test_tf32_is_the_product_of_operands_cut_to_tf32_on_the_gpu(rng, case_name, direction, operands_last):
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    case = TF32_CASES[case_name]
    problem = problem_of(case, np.float32, "cuda")
    with _cuda.tf32(True):
        if not implicit_gemm_wgmma.ImplicitGemmWgmma().supports(problem, direction):
            pytest.skip("backward-data needs stride 1 and C a multiple of 4")
    cupy = backend.cupy()
    first_shape, second_shape = operand_shapes(case, direction)
    first = rng.standard_normal(first_shape).astype(np.float32)
    second = (rng.standard_normal(second_shape) / np.sqrt(np.prod(second_shape[1:]))).astype(np.float32)
    on_gpu = [cupy.asarray(a) for a in (first, second)]
    if operands_last:
        on_gpu = [layout.to_channels_last(a) for a in on_gpu]
    with _cuda.tf32(True):
        got = run(direction, *on_gpu, case, algo=ALGO)
    # dw comes back C-contiguous (K, C/G, R, S) whatever the operands' layout
    assert got.dtype == np.float32
    assert layout.is_channels_last(got) == (operands_last and direction != "backward_filter")
    got = cupy.asnumpy(got)
    assert np.isfinite(got).all()
    cut = cut_reference(direction, first, second, case)
    exact = run(direction, first.astype(np.float64), second.astype(np.float64), case, algo="reference")
    # Products of TF32 values are exact in float32, so only the float32 sums part got from the product of the cut
    # operands: relative ~1e-7·sqrt(terms). Operands rounded to nearest instead of cut would be ~1e-4 off it.
    assert relative_error(got, cut) < 2e-5, f"{case_name} {direction}: not the product of the cut operands"
    assert relative_error(got, exact) < 2e-3, f"{case_name} {direction}: beyond TF32's bound"


@pytest.mark.gpu
@pytest.mark.parametrize("direction", FORWARD_AND_DATA)
def test_tf32_into_a_given_out_of_either_layout_on_the_gpu(rng, direction):
    """out given, poisoned: every element written, C-contiguous operands into a channels-last out."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    cupy = backend.cupy()
    case = CASES["two_column_tiles_one_partial"]
    first_shape, second_shape = operand_shapes(case, direction)
    first, second = (rng.standard_normal(shape).astype(np.float32) for shape in (first_shape, second_shape))
    for last in (False, True):
        out = cupy.full(output_shape(case, direction), np.nan, dtype=np.float32)
        out = layout.to_channels_last(out) if last else out
        with _cuda.tf32(True):
            assert run(direction, cupy.asarray(first), cupy.asarray(second), case, algo=ALGO, out=out) is out
        cut = cut_reference(direction, first, second, case)
        assert relative_error(out, cut) < 2e-5, f"{direction} into a {'channels-last' if last else 'contiguous'} out"


@pytest.mark.gpu
@pytest.mark.parametrize("operands_last", [False, True], ids=["nchw", "channels_last"])
def test_tf32_backward_filter_accumulates_on_the_gpu(rng, operands_last):
    """accumulate adds the TF32 weight gradient, summed over many split slices of the pixels, to out's values."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    cupy = backend.cupy()
    case = CASES["many_splits"]
    x_shape, dy_shape = operand_shapes(case, "backward_filter")
    x, dy = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(dy_shape).astype(np.float32)
    before = rng.standard_normal(output_shape(case, "backward_filter")).astype(np.float32)
    on_gpu = [cupy.asarray(a) for a in (x, dy)]
    if operands_last:
        on_gpu = [layout.to_channels_last(a) for a in on_gpu]
    out = cupy.asarray(before)
    with _cuda.tf32(True):
        run("backward_filter", *on_gpu, case, algo=ALGO, out=out, accumulate=True)
    cut = cut_reference("backward_filter", x, dy, case)
    assert relative_error(out, before + cut) < 2e-5


# ----------------------------------------------------------------------------------------------
# The forward kernel's PRODUCER build: a producer warpgroup, mbarriers, one persistent CTA an SM
# ----------------------------------------------------------------------------------------------
# (STAGES, IN_FLIGHT, producer warpgroups); 6 stages are capped where they do not fit
PRODUCER_PIPELINES = [(3, 0, 1), (4, 1, 1), (6, 1, 1), (4, 1, 2)]
# With 132 SMs the last two give CTAs several tiles each: 200 tiles of 128 wide (K 200: 128 + 72), 144 of 64 wide.
PRODUCER_CASES = {name: CASES[name] for name in ("rows_and_reduction_off_the_tiles", "two_column_tiles_one_partial",
                                                  "two_groups_two_column_tiles", "one_by_one")}
PRODUCER_CASES.update(more_tiles_than_sms_128_wide=(8, 16, 40, 40, 200, 3, 3, 1, 1, 1, 1),
                      more_tiles_than_sms_64_wide=(8, 24, 48, 48, 64, 3, 3, 1, 1, 1, 1))


def test_the_producer_build_takes_the_stages_the_shared_memory_holds(monkeypatch):
    monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_PRODUCER", {128: (6, 1, 1), 64: (9, 1, 2), 256: (2, 2, 1)})
    limit = 227 * 1024
    # 128 wide: 32 KiB stages beside a 128 × 136 output tile: five of bfloat16 words, four of TF32's floats.
    for itemsize, most in ((2, 5), (4, 4)):
        build = implicit_gemm_wgmma.producer_build(128, itemsize)
        assert build[:3] == (most, 1, 1) and build.threads == 384
        assert build.shared_bytes == most * (256 * 128 + 16) + 128 * 136 * itemsize + 1024 <= limit
        assert build.shared_bytes + 256 * 128 + 16 > limit  # one stage more would not fit
    build = implicit_gemm_wgmma.producer_build(64, 2)  # 24 KiB stages: eight fit
    assert build.stages == 8 and build.shared_bytes <= limit < build.shared_bytes + 192 * 128 + 16
    assert build.threads == 512  # two producer warpgroups
    with pytest.raises(ValueError, match="more stages than the 2 in flight"):
        implicit_gemm_wgmma.producer_build(256, 2)
    monkeypatch.setitem(implicit_gemm_wgmma.FORWARD_PRODUCER, 128, (3, 1, 3))
    with pytest.raises(ValueError, match="1 or 2 producer warpgroups, got 3"):
        implicit_gemm_wgmma.producer_build(128, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("operands_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("direction", FORWARD_AND_DATA)
@pytest.mark.parametrize("pipeline", PRODUCER_PIPELINES, ids=lambda p: "stages{}_in_flight{}_producers{}".format(*p))
@pytest.mark.parametrize("case_name", PRODUCER_CASES)
def test_the_producer_build_equals_the_barrier_build_on_the_gpu(monkeypatch, rng, case_name, pipeline, direction,
                                                                dtype, operands_last):
    """The same products summed in the same order: bit for bit the barrier pipeline's output (which the tests above
    hold against float64 references), whatever the stages, the products in flight or the tiles a CTA runs."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    case = PRODUCER_CASES[case_name]
    cupy = backend.cupy()
    first_shape, second_shape = operand_shapes(case, direction)
    operands = [rng.standard_normal(shape).astype(np.float32) for shape in (first_shape, second_shape)]
    on_gpu = [cupy.asarray(a) for a in operands]
    if dtype == "bfloat16":
        on_gpu = [convert.float_to_half(a, "bfloat16") for a in on_gpu]
    if operands_last:
        on_gpu = [layout.to_channels_last(a) for a in on_gpu]
    monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_TMA", {128: False, 64: False, 256: False})  # the gathers
    with _cuda.tf32(dtype == "float32"):
        barrier = run(direction, *on_gpu, case, algo=ALGO)
        # The second call launches anew: no kept form of the first (a ready launch or a recording) may stand in.
        conv.registry.clear_caches()
        monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_PRODUCER", {128: pipeline, 64: pipeline, 256: None})
        produced = run(direction, *on_gpu, case, algo=ALGO)
    assert layout.is_channels_last(produced) == layout.is_channels_last(barrier) == operands_last
    words = np.uint16 if dtype == "bfloat16" else np.uint32
    assert np.array_equal(cupy.asnumpy(produced).view(words), cupy.asnumpy(barrier).view(words))
    assert cupy.asnumpy(barrier).view(words).any()  # not two empty outputs


# ----------------------------------------------------------------------------------------------
# The forward kernel's TMA build: each stage copied by the bulk tensor copy engine through tensor maps
# ----------------------------------------------------------------------------------------------
# C and K per group multiples of 64 (a stage is one tap of 128 bytes of bfloat16 channels, 32 floats), so that
# forward and stride-1 backward-data both take the TMA build; the last two forward only.
TMA_CASES = {
    "rows_off_the_tile": (3, 64, 9, 11, 64, 3, 3, 1, 1, 1, 1),            # N·P·Q 297: the last tile's rows past N
    "two_slices_a_tap_two_column_tiles": (2, 128, 10, 9, 192, 3, 3, 1, 1, 1, 1),  # K 192: 128 + 64
    "dilated_one_sided_padding": (2, 64, 12, 11, 64, 3, 2, 1, (2, 0), (2, 3), 1),
    "two_groups": (2, 128, 8, 9, 128, 3, 3, 1, 1, 1, 2),                  # C/G 64, K/G 64
    "one_by_one": (4, 64, 7, 7, 64, 1, 1, 1, 0, 1, 1),
    "five_by_five_unpadded": (2, 64, 11, 12, 64, 5, 5, 1, 0, 1, 1),
    "stride_2": (2, 64, 13, 10, 128, 3, 3, 2, 1, 1, 1),
    "columns_off_the_tile": (3, 64, 9, 11, 72, 3, 3, 1, 1, 1, 1),         # K 72: a 128-wide tile, 56 columns empty
}
TMA_FORWARD_ONLY = ("stride_2", "columns_off_the_tile")


def test_the_tma_build_keeps_its_barriers_after_the_stages():
    for width in (64, 128):
        assert implicit_gemm_wgmma.tma_shared_bytes(width) == implicit_gemm_wgmma.shared_bytes(width) + 3 * 8
    # Three 64-wide CTAs an SM still fit, each with the 1 KiB the driver keeps a CTA.
    assert 3 * (implicit_gemm_wgmma.tma_shared_bytes(64) + 1024) <= 228 * 1024


def test_the_tma_launch_maps_both_operands_and_picks_its_pipeline(monkeypatch):
    """ResNet-50's layer2 3×3 (128 -> 128 channels, 28 × 28) at batch 32 in bf16: x mapped as im2col boxes of 128
    pixels × 64 channels with the convolution's corners, w (K·G, R·S·C) as boxes of 64 values × 128 rows; the barrier
    pipeline on the gathers' grid with room for its three mbarriers, or the PRODUCER build on one persistent CTA an SM
    (132 here) of 384 threads."""
    launches, encoded = [], []
    monkeypatch.setattr(_cuda, "check_int32", lambda *arrays: None)
    monkeypatch.setattr(_cuda, "sm_count", lambda: 132)
    monkeypatch.setattr(implicit_gemm_nhwc, "allow_shared_bytes", lambda kernel, shared: None)
    monkeypatch.setattr(implicit_gemm_wgmma, "_maps", SimpleNamespace(
        get=lambda arguments, address: encoded.append((arguments, address)) or address))

    def function(source, name, dtype, defines):
        return lambda grid, block, args, shared_mem: launches.append((dict(defines), grid, block, args, shared_mem))

    monkeypatch.setattr(_cuda, "function", function)
    problem = problem_of((32, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1), np.uint16, "cuda")
    shape = implicit_gemm_nhwc._shape_struct(problem)
    x = SimpleNamespace(data=SimpleNamespace(ptr=1 << 20), dtype=np.dtype(np.uint16))
    w = SimpleNamespace(data=SimpleNamespace(ptr=1 << 21), dtype=np.dtype(np.uint16))
    out = np.zeros((32, 128, 28, 28), np.uint16)
    implicit_gemm_wgmma._launch_forward(x, w, out, shape)
    monkeypatch.setitem(implicit_gemm_wgmma.FORWARD_PRODUCER, 128, (4, 1, 1))
    implicit_gemm_wgmma._launch_forward(x, w, out, shape)
    x_map, w_map = encoded[0][0], encoded[1][0]
    assert [address for _, address in encoded] == [1 << 20, 1 << 21] * 2
    assert x_map == tensor_map.im2col_arguments(32, 28, 28, 128, 2, (3, 3), (1, 1), (1, 1), (1, 1), 64, 128)
    assert w_map.dims == (9 * 128, 128) and w_map.box == (64, 128)
    (barrier, grid, block, args, shared), (producer, persistent, producer_block, _, producer_shared) = launches
    assert args[:2] == (1 << 20, 1 << 21) and args[3] is shape
    tiles = -(-32 * 28 * 28 // 128)  # 196 tiles of 128 pixels, one column tile: more than the SMs
    assert barrier["TMA"] == 1 and "PRODUCER" not in barrier and (barrier["STAGES"], barrier["IN_FLIGHT"]) == (3, 0)
    assert grid == (tiles, 1, 1) and block == (256,) and shared == implicit_gemm_wgmma.tma_shared_bytes(128)
    build = implicit_gemm_wgmma.producer_build(128, 2)
    assert producer["TMA"] == producer["PRODUCER"] == 1 and producer["STAGES"] == build.stages
    assert persistent == (min(tiles, 132), 1, 1) and producer_block == (384,) and producer_shared == build.shared_bytes


def test_the_tma_maps_take_the_problems_window_height_first():
    """A problem whose filter, stride, padding and dilation differ in every value, height and width: the TMA checks
    and x's map take each as (h, w) in that order, C the group's channels times the groups; a group of 48 bf16
    channels (96 bytes, not a whole stage) keeps the gathers."""
    problem = conv.problem.ConvProblem(2, 128, 17, 19, 96, 3, 5, (2, 1), (1, 2), (3, 2), 2, np.dtype(np.uint16),
                                       "cuda")
    shape = implicit_gemm_nhwc._shape_struct(problem).tobytes()
    assert implicit_gemm_wgmma._shape_fits(shape, 2)
    x_map, _ = implicit_gemm_wgmma._map_arguments(shape, 2, 64)
    assert x_map == tensor_map.im2col_arguments(2, 17, 19, 128, 2, (3, 5), (2, 1), (1, 2), (3, 2), 64, 128)
    narrow = conv.problem.ConvProblem(2, 96, 17, 19, 96, 3, 5, (2, 1), (1, 2), (3, 2), 2, np.dtype(np.uint16), "cuda")
    assert not implicit_gemm_wgmma._shape_fits(implicit_gemm_nhwc._shape_struct(narrow).tobytes(), 2)


def tma_operands(rng, case, direction, dtype, operands_last):
    cupy = backend.cupy()
    first_shape, second_shape = operand_shapes(case, direction)
    on_gpu = [cupy.asarray(rng.standard_normal(shape).astype(np.float32)) for shape in (first_shape, second_shape)]
    if dtype != "float32":
        on_gpu = [convert.float_to_half(a, dtype) for a in on_gpu]
    if operands_last:
        on_gpu = [layout.to_channels_last(a) for a in on_gpu]
    return on_gpu


@pytest.mark.gpu
@pytest.mark.parametrize("operands_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("direction", FORWARD_AND_DATA)
@pytest.mark.parametrize("producer", [None, (4, 1, 1)], ids=["barrier", "producer"])
@pytest.mark.parametrize("case_name", TMA_CASES)
def test_the_tma_build_equals_the_gathering_build_on_the_gpu(monkeypatch, rng, case_name, producer, direction, dtype,
                                                             operands_last):
    """The bulk tensor copies land the values the gathers do, zeros on the padding and past the last image, in the
    same stages: the output is bit for bit the gathering build's (which the tests above hold against float64
    references), in the barrier pipeline and in the PRODUCER build's (4 stages, 1 product group in flight). Every
    call here takes the TMA build."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    if direction == "backward_data" and case_name in TMA_FORWARD_ONLY:
        pytest.skip("strided backward-data is strided_dgrad's; K 72 is no multiple of a stage's channels")
    case = TMA_CASES[case_name]
    cupy = backend.cupy()
    on_gpu = tma_operands(rng, case, direction, dtype, operands_last)
    launches = []
    launch = implicit_gemm_wgmma._launch_tma
    monkeypatch.setattr(implicit_gemm_wgmma, "_launch_tma", lambda *a: (launches.append(a), launch(*a)))
    monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_TMA", {128: False, 64: False, 256: False})
    with _cuda.tf32(dtype == "float32"):
        gathered = run(direction, *on_gpu, case, algo=ALGO)
        assert not launches
        conv.registry.clear_caches()  # the second call launches anew
        monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_TMA", {128: True, 64: True, 256: False})
        monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_PRODUCER", {128: producer, 64: producer, 256: None})
        copied = run(direction, *on_gpu, case, algo=ALGO)
    assert launches  # the TMA build ran
    assert layout.is_channels_last(copied) == layout.is_channels_last(gathered) == operands_last
    words = np.uint16 if dtype == "bfloat16" else np.uint32
    assert np.array_equal(cupy.asnumpy(copied).view(words), cupy.asnumpy(gathered).view(words))
    assert cupy.asnumpy(gathered).view(words).any()  # not two empty outputs


@pytest.mark.gpu
def test_a_recorded_tma_launch_maps_the_addresses_it_is_handed(monkeypatch, rng):
    """A recording of the TMA launch (what a ReadyCall replays on a training step's next arrays) maps its operands
    anew at each replay: their tensor maps hold addresses, and maps kept from the first call would read its
    operands."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    cupy = backend.cupy()
    monkeypatch.setattr(implicit_gemm_wgmma, "FORWARD_TMA", {128: True, 64: True, 256: False})
    case = TMA_CASES["rows_off_the_tile"]
    problem = problem_of(case, np.uint16, "cuda")
    shape = implicit_gemm_nhwc._shape_struct(problem)

    def operands():
        x, w = (convert.float_to_half(cupy.asarray(rng.standard_normal(s).astype(np.float32)), "bfloat16")
                for s in ((problem.N, problem.H, problem.W, problem.C), (problem.K, problem.R, problem.S, problem.C)))
        return x, w

    x, w = operands()
    out = cupy.empty(problem.y_shape, dtype=np.uint16)
    with _cuda.recording() as steps:
        implicit_gemm_wgmma._launch_forward(x, w, out, shape)
    ready = _cuda.ReadyCall(steps, (x, w), (out,), (out,))
    x2, w2 = operands()
    (replayed,) = ready(x2, w2)
    direct = cupy.empty_like(out)
    implicit_gemm_wgmma._launch_forward(x2, w2, direct, shape)
    assert np.array_equal(cupy.asnumpy(replayed), cupy.asnumpy(direct))
    assert not np.array_equal(cupy.asnumpy(replayed), cupy.asnumpy(out))


# ----------------------------------------------------------------------------------------------
# The half backward-filter's TMA build: x through im2col boxes of a stage's 64 pixels, dy through a tiled map
# ----------------------------------------------------------------------------------------------
def test_the_filter_tma_launch_maps_both_operands_on_the_gathers_grid(monkeypatch):
    """ResNet-50's layer2 3×3 (128 -> 128 channels, 28 × 28) at batch 32 in bf16: with FILTER_TMA on, x is mapped as
    im2col boxes of 64 pixels × 64 channels with the convolution's corners, dy (N·P·Q, K) as boxes of 64 filters ×
    64 pixel rows; the TMA build on the gathers' grid and split, with room for its three mbarriers. Off (the
    default), the gathers' build."""
    launches, encoded, kernels = [], [], []
    monkeypatch.setattr(_cuda, "check_int32", lambda *arrays: None)
    monkeypatch.setattr(_cuda, "sm_count", lambda: 132)
    monkeypatch.setattr(implicit_gemm_nhwc, "allow_shared_bytes", lambda kernel, shared: None)
    monkeypatch.setattr(implicit_gemm_wgmma, "_maps", SimpleNamespace(
        get=lambda arguments, address: encoded.append((arguments, address)) or address))
    monkeypatch.setattr(implicit_gemm_nhwc, "_launch_tile_kernel",
                        lambda kernel, grid, shared, args, threads=256: launches.append((kernel, grid, shared, args)))

    def function(source, name, dtype, defines):
        kernels.append((name, dict(defines)))
        return lambda grid, block, args, shared_mem: launches.append((name, grid, block, args, shared_mem))

    monkeypatch.setattr(_cuda, "function", function)
    problem = problem_of((32, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1), np.uint16, "cuda")
    x = SimpleNamespace(data=SimpleNamespace(ptr=1 << 20), dtype=np.dtype(np.uint16))
    dy = SimpleNamespace(data=SimpleNamespace(ptr=1 << 21), dtype=np.dtype(np.uint16))
    sums = object()
    grid, per_split = implicit_gemm_nhwc.filter_gradient_grid(problem, 64, 4, 128)
    # 9 tiles of R·S·C = 1152 rows; 392 stages of 64 pixels, at least 16 a slice (MIN_STEPS_PER_SPLIT)
    assert grid == (9, 25, 1) and per_split == 16
    implicit_gemm_wgmma._launch_backward_filter(x, dy, sums, problem)  # off: the gathers
    assert kernels.pop() == ("implicit_gemm_wgmma_backward_filter",
                             {"HALF": 2, "BLOCK_N": 128, "STAGES": 3, "IN_FLIGHT": 0})
    (_, gathers_grid, gathers_shared, gathers_args), = launches
    assert gathers_grid == grid and gathers_shared == implicit_gemm_wgmma.shared_bytes(128) and not encoded
    launches.clear()
    monkeypatch.setitem(implicit_gemm_wgmma.FILTER_TMA, 128, True)
    implicit_gemm_wgmma._launch_backward_filter(x, dy, sums, problem)
    assert kernels.pop() == ("implicit_gemm_wgmma_backward_filter",
                             {"HALF": 2, "BLOCK_N": 128, "STAGES": 3, "IN_FLIGHT": 0, "TMA": 1})
    (name, tma_grid, block, args, shared), = launches
    assert name == "implicit_gemm_wgmma_backward_filter"
    assert tma_grid == grid and block == (256,) and shared == implicit_gemm_wgmma.tma_shared_bytes(128)
    assert [address for _, address in encoded] == [1 << 20, 1 << 21]
    x_map, dy_map = encoded[0][0], encoded[1][0]
    assert x_map == tensor_map.im2col_arguments(32, 28, 28, 128, 2, (3, 3), (1, 1), (1, 1), (1, 1), 64, 64)
    assert dy_map == tensor_map.tiled_arguments(32 * 28 * 28, 128, 2, 64, 64)
    assert args[:3] == (1 << 20, 1 << 21, sums) and args[3:] == gathers_args[3:]  # the shape, the stages a split
    assert int(args[4]) == per_split


def test_the_filter_tma_build_takes_half_problems_of_whole_panels():
    """A 64-row panel of A is one tap's channels only where C per group is a multiple of 64: 96 channels in two
    groups of 48 keep the gathers, as do float32 problems (the TF32 build's tiles are K-major) and operands off 16
    bytes; the window's every value apart (h from w) reaches x's map in order."""
    aligned, off = (SimpleNamespace(data=SimpleNamespace(ptr=p)) for p in (1 << 20, (1 << 20) + 8))
    window = (3, 5, (2, 1), (1, 2), (3, 2))
    problem = conv.problem.ConvProblem(2, 128, 17, 19, 96, *window, 2, np.dtype(np.uint16), "cuda")
    assert implicit_gemm_wgmma.filter_tma_fits(problem, aligned, aligned)
    assert not implicit_gemm_wgmma.filter_tma_fits(problem, aligned, off)
    assert not implicit_gemm_wgmma.filter_tma_fits(problem, off, aligned)
    x_map, dy_map = implicit_gemm_wgmma._filter_map_arguments(problem)
    assert x_map == tensor_map.im2col_arguments(2, 17, 19, 128, 2, (3, 5), (2, 1), (1, 2), (3, 2), 64, 64)
    assert dy_map.dims == (96, 2 * problem.P * problem.Q) and dy_map.box == (64, 64)
    for other in (conv.problem.ConvProblem(2, 96, 17, 19, 96, *window, 2, np.dtype(np.uint16), "cuda"),
                  conv.problem.ConvProblem(2, 128, 17, 19, 96, *window, 2, np.dtype(np.float32), "cuda")):
        assert not implicit_gemm_wgmma.filter_tma_fits(other, aligned, aligned)


def two_splits(problem, sms, block_k, ctas_per_sm, block_n=None, within_waves=False):
    """Backward-filter's stages per slice such that N·P·Q falls in two slices: their two atomic additions into each
    zeroed sum give one result whichever lands first, so that two runs can be compared bit for bit."""
    steps = -(-problem.N * problem.P * problem.Q // block_k)
    return max(1, -(-steps // 2))


@pytest.mark.gpu
@pytest.mark.parametrize("operands_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case_name", TMA_CASES)
def test_the_filter_tma_build_equals_the_gathering_build_on_the_gpu(monkeypatch, rng, case_name, dtype,
                                                                    operands_last):
    """The bulk tensor copies land the pixels the gathers do, zeros on the padding and past the last pixel and
    filter, in the same panels: dw is bit for bit the gathering build's (which the tests above hold against float64
    references), each on two slices of the pixels, the second starting mid-image. Every call here takes the TMA
    build."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    case = TMA_CASES[case_name]
    cupy = backend.cupy()
    on_gpu = tma_operands(rng, case, "backward_filter", dtype, operands_last)
    monkeypatch.setattr(implicit_gemm_nhwc, "steps_per_split", two_splits)
    launches = []
    launch = implicit_gemm_wgmma._launch_filter_tma
    monkeypatch.setattr(implicit_gemm_wgmma, "_launch_filter_tma", lambda *a: (launches.append(a), launch(*a)))
    gathered = run("backward_filter", *on_gpu, case, algo=ALGO)
    assert not launches
    conv.registry.clear_caches()  # the second call launches anew
    monkeypatch.setattr(implicit_gemm_wgmma, "FILTER_TMA", {128: True, 64: True})
    copied = run("backward_filter", *on_gpu, case, algo=ALGO)
    assert launches and all(grid[1] == 2 for *_, grid, _ in launches)  # the TMA build ran, on two slices
    assert np.array_equal(cupy.asnumpy(copied).view(np.uint16), cupy.asnumpy(gathered).view(np.uint16))
    assert cupy.asnumpy(gathered).view(np.uint16).any()  # not two empty outputs


@pytest.mark.gpu
def test_a_recorded_filter_tma_launch_maps_the_addresses_it_is_handed(monkeypatch, rng):
    """A recording of the backward-filter's TMA launch maps x and dy anew at each replay, as the forward's does."""
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    cupy = backend.cupy()
    monkeypatch.setattr(implicit_gemm_wgmma, "FILTER_TMA", {128: True, 64: True})
    problem = problem_of(TMA_CASES["two_slices_a_tap_two_column_tiles"], np.uint16, "cuda")

    def operands():
        return (convert.float_to_half(cupy.asarray(rng.standard_normal(s).astype(np.float32)), "bfloat16")
                for s in ((problem.N, problem.H, problem.W, problem.C), (problem.N, problem.P, problem.Q, problem.K)))

    launches = []
    launch = implicit_gemm_wgmma._launch_filter_tma
    monkeypatch.setattr(implicit_gemm_wgmma, "_launch_filter_tma", lambda *a: (launches.append(a), launch(*a)))
    x, dy = operands()
    sums = cupy.zeros((problem.K, problem.R, problem.S, problem.C), dtype=np.float32)
    with _cuda.recording() as steps:
        implicit_gemm_wgmma._launch_backward_filter(x, dy, sums, problem)
    assert launches and len(steps) == 1  # the TMA build, recorded once
    ready = _cuda.ReadyCall(steps, (x, dy, sums), (), ())
    x2, dy2 = operands()
    replayed, direct, first = (cupy.zeros_like(sums) for _ in range(3))
    ready(x2, dy2, replayed)
    implicit_gemm_wgmma._launch_backward_filter(x2, dy2, direct, problem)
    implicit_gemm_wgmma._launch_backward_filter(x, dy, first, problem)
    # 180 pixels are three stages, one slice: one addition into each sum, so the runs agree bit for bit
    assert np.array_equal(cupy.asnumpy(replayed), cupy.asnumpy(direct))
    assert not np.array_equal(cupy.asnumpy(replayed), cupy.asnumpy(first))


def test_the_split_within_its_waves_leaves_no_last_wave_of_a_few_ctas(monkeypatch):
    """Backward-filter's slices of N·P·Q, rounded up from the CTAs aimed at (two waves of two on 132 SMs: 528), make
    a few more CTAs than that on these layers: a third wave of 12 on CaffeNet's conv3 (54 tiles × 10 slices), 48 on
    ResNet-18's layer4. Rounded down (SPLIT_K_WITHIN_WAVES), they never make more, and the launch takes them."""
    monkeypatch.setattr(_cuda, "sm_count", lambda: 132)
    layers = {"resnet18.layer2": ((128, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1), 531, 504),
              "resnet18.layer3": ((128, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1), 540, 504),
              "resnet18.layer4": ((128, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1), 576, 432),
              "caffenet.conv3": ((256, 256, 13, 13, 384, 3, 3, 1, 1, 1, 1), 540, 486),
              "caffenet.conv4": ((256, 384, 13, 13, 384, 3, 3, 1, 1, 1, 2), 560, 504)}
    for name, (case, up, within) in layers.items():
        problem = problem_of(case, np.uint16, "cuda")
        block_n = implicit_gemm_wgmma.tile_width(problem.K // problem.groups, "backward_filter")
        ctas = []
        for within_waves in (False, True):
            (tiles, slices, groups), per_split = implicit_gemm_nhwc.filter_gradient_grid(problem, 64, 4, block_n,
                                                                                          within_waves)
            assert (slices - 1) * per_split < -(-problem.N * problem.P * problem.Q // 64) <= slices * per_split
            ctas.append(tiles * slices * groups)
        assert ctas == [up, within], name
        assert up > 528 >= within
    launches = []
    monkeypatch.setattr(_cuda, "check_int32", lambda *arrays: None)
    monkeypatch.setattr(implicit_gemm_wgmma, "_kernel", lambda *args, **options: None)
    monkeypatch.setattr(implicit_gemm_nhwc, "_launch_tile_kernel", lambda kernel, grid, *_: launches.append(grid))
    problem = problem_of(layers["caffenet.conv3"][0], np.uint16, "cuda")
    implicit_gemm_wgmma._launch_backward_filter(None, None, None, problem)
    monkeypatch.setattr(implicit_gemm_wgmma, "SPLIT_K_WITHIN_WAVES", True)
    implicit_gemm_wgmma._launch_backward_filter(None, None, None, problem)
    assert launches == [(54, 10, 1), (54, 9, 1)]  # 676 stages of 64 pixels: 10 slices of 68, or 9 of 76


# ----------------------------------------------------------------------------------------------
# A first layer's backward-filter on pixel pairs (implicit_gemm_nhwc.paired_problem, PAIRED_FILTER)
# ----------------------------------------------------------------------------------------------
PAIRED_CASES = {
    "resnet_first_layer": (2, 3, 23, 21, 16, 7, 7, 2, 3, 1, 1),       # padding odd, S odd: a last pair half dropped
    "caffenet_first_layer": (2, 3, 27, 27, 16, 11, 11, 4, 0, 1, 1),   # stride 4, no padding
    "even_taps_even_padding": (3, 2, 12, 14, 8, 4, 4, 2, 2, 1, 1),
    "one_channel_unread_columns": (2, 1, 9, 12, 8, 3, 3, 2, 1, 1, 1),  # W 12: the last column read by no window
}


def test_the_pairs_problem_halves_the_rows_and_keeps_the_output():
    """ResNet's 7 × 7 stride-2 first layer at 224 × 224: 4 tap pairs over 113 vectors a row, stride 1 and padding 1
    along W, the same 112 × 112 output; 224 GEMM rows where the padded problem has 392. Layers without an even
    stride along W, with more than 4 channels, with groups or a dilation along W keep the padded copy."""
    problem = problem_of((128, 3, 224, 224, 64, 7, 7, 2, 3, 1, 1), np.float16, "cuda")
    pairs = implicit_gemm_nhwc.paired_problem(problem)
    assert (pairs.C, pairs.W, pairs.S, pairs.stride, pairs.padding) == (8, 113, 4, (2, 1), (3, 1))
    assert (pairs.P, pairs.Q, pairs.R * pairs.S * pairs.C) == (112, 112, 224)
    padded = implicit_gemm_nhwc.padded_problem(problem)
    assert padded.R * padded.S * padded.C == 392
    for other in ((2, 3, 9, 9, 8, 3, 3, 1, 1, 1, 1), (2, 5, 9, 9, 8, 3, 3, 2, 1, 1, 1), (2, 4, 9, 9, 8, 3, 3, 2, 1, 1, 2),
                  (2, 3, 9, 9, 8, 3, 3, 2, 1, 2, 1)):
        assert implicit_gemm_nhwc.paired_problem(problem_of(other, np.float16, "cuda")) is None, other
    assert implicit_gemm_nhwc.paired_problem(problem_of(PAIRED_CASES["resnet_first_layer"], np.float32, "cuda")) \
        is None  # float32: TF32's four channels already fill its vectors


@pytest.mark.parametrize("operands_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("case_name", PAIRED_CASES)
def test_the_gpu_paths_pairs_reach_the_kernel_and_come_back_as_taps(monkeypatch, rng, case_name, operands_last):
    """The GPU path with PAIRED_FILTER driven on NumPy arrays (float16), its kernel and finishing pass stood in by
    NumPy: the kernel reads the pairs' problem from a NaN-poisoned workspace sized for it, each vector's halves two
    adjacent columns of x (zeros past x and in the channels after its own), and the unpaired sums are the float64
    reference's (to float32's rounding of the workspace's sums)."""
    case = PAIRED_CASES[case_name]
    problem = problem_of(case, np.float16, "cuda")
    pairs = implicit_gemm_nhwc.paired_problem(problem)
    monkeypatch.setattr(implicit_gemm_wgmma, "PAIRED_FILTER", True)
    x, dy = (rng.standard_normal(shape).astype(np.float16) for shape in (problem.x_shape, problem.y_shape))
    if operands_last:
        x, dy = layout.to_channels_last(x), layout.to_channels_last(dy)
    algorithm = implicit_gemm_wgmma.ImplicitGemmWgmma()
    assert algorithm.workspace_bytes(problem, "backward_filter") == implicit_gemm_nhwc.chunk_workspace_bytes(
        pairs, "backward_filter")
    workspace = np.full(algorithm.workspace_bytes(problem, "backward_filter"), 255, np.uint8)
    launches = []

    def backward_filter(x_last, dy_last, sums, chunk):
        launches.append(chunk)
        values = x_last.view(np.float16).astype(np.float64)
        assert values.shape == (chunk.N, pairs.H, pairs.W, 8) and not np.isnan(values).any()
        halves = values.reshape(chunk.N, pairs.H, pairs.W, 2, 4)
        padded_x = np.zeros((chunk.N, problem.H, 2 * pairs.W + 2, 4))
        padded_x[:, :, 1:problem.W + 1, :problem.C] = np.asarray(layout.contiguous(x)).transpose(0, 2, 3, 1)
        odd = problem.padding[1] % 2
        for half in (0, 1):  # vector m's half j: column 2m − o + j (shifted by one for the zero column in front)
            want = padded_x[:, :, 1 + half - odd:1 + half - odd + 2 * pairs.W:2][:, :, :pairs.W]
            np.testing.assert_array_equal(halves[..., half, :], want)
        dy_rows = dy_last.reshape(-1, chunk.K).view(np.float16).astype(np.float64)
        for r, s, view in implicit_gemm_nhwc._tap_views(values, chunk):
            sums[:, r, s, :] += dy_rows.T @ np.ascontiguousarray(view).reshape(-1, chunk.C)

    def finish(sums, out, finished_problem, accumulate):
        assert sums.shape == (problem.K, problem.R, problem.S, problem.C) and finished_problem is problem
        out[...] = sums.transpose(0, 3, 1, 2)

    monkeypatch.setattr(implicit_gemm_nhwc, "_finish_filter_gradient", finish)
    monkeypatch.setattr(implicit_gemm_nhwc, "_to_channels_last",  # dy's transpose (layout.cu's on the GPU)
                        lambda array, out: out.view(array.dtype).__setitem__(Ellipsis, array.transpose(0, 2, 3, 1)))
    got = np.empty(problem.w_shape, np.float64)
    implicit_gemm_nhwc._backward_filter_by_chunks(x, dy, problem, got, False, workspace, backward_filter,
                                                  paired=True)
    assert [chunk.C for chunk in launches] == [8] and launches[0].S == pairs.S
    want = run("backward_filter", np.asarray(layout.contiguous(x), np.float64),
               np.asarray(layout.contiguous(dy), np.float64), case, algo="reference")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)  # the workspace's float32 sums


def test_the_gpu_call_asks_for_the_pairs_where_they_are_on(monkeypatch):
    """implicit_gemm_wgmma's backward-filter on the GPU hands its chunk loop the pairs where PAIRED_FILTER is on and
    the problem takes them (a first layer), the padded copy otherwise."""
    calls = []
    monkeypatch.setattr(implicit_gemm_nhwc, "_backward_filter_by_chunks", lambda *args: calls.append(args[-1]))
    monkeypatch.setattr(implicit_gemm_wgmma.backend, "is_cuda_array", lambda array: True)
    first_layer = problem_of(PAIRED_CASES["resnet_first_layer"], np.float16, "cuda")
    algorithm = implicit_gemm_wgmma.ImplicitGemmWgmma()
    for on in (False, True):
        monkeypatch.setattr(implicit_gemm_wgmma, "PAIRED_FILTER", on)
        algorithm.backward_filter(None, None, first_layer, None, False, None)
        algorithm.backward_filter(None, None, problem_of(CASES["many_splits"], np.float16, "cuda"), None, False, None)
    assert calls == [False, False, True, False]


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("case_name", PAIRED_CASES)
def test_the_paired_filter_gradient_within_the_half_bound(xp, monkeypatch, rng, case_name, name):
    """With PAIRED_FILTER on, backward-filter of a first layer runs on pixel pairs (its NumPy twin on the CPU, the
    kernel on the GPU): within the half bound of the float64 reference."""
    if xp is not np and not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    monkeypatch.setattr(implicit_gemm_wgmma, "PAIRED_FILTER", True)
    paired = []
    pair = implicit_gemm_nhwc.pair_pixels
    monkeypatch.setattr(implicit_gemm_nhwc, "pair_pixels", lambda *a: (paired.append(a[2]), pair(*a)))
    conv.registry.clear_caches()
    check_direction(xp, rng, PAIRED_CASES[case_name], "backward_filter", name,
                    f"{case_name} backward_filter {name} on {xp.__name__}", algo=ALGO)
    assert paired  # the pairs ran
