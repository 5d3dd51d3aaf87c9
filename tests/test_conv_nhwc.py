"""``implicit_gemm_nhwc``: half-precision implicit GEMM on channels-last copies (16-byte cp.async gathers, a
three-stage pipeline, mma.sync m16n8k16), and its NumPy twin, in all three directions, held to a float64
reference by the half bound of tests/test_conv_half.py (one rounding after a float32 sum of exact products).

The cases sit on the kernels' edges: rows not a multiple of the 128-row tile, K and C below, at and past the
64- and 128-wide tiles, reductions that end inside a 32-wide stage, taps on the padding, strides, dilation, a
padding wider than the filter (backward-data's turned problem then crops), backward-filter's split-K, and groups
(each group its own GEMM on a slice of every pixel's channels: a pointer or a pixel stride that forgot the other
groups reads the wrong channels).
"""
import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import conv, convert, layout
from minidnn.primitives.conv import implicit_gemm_nhwc
from tests.helpers import FLOAT32_UNIT, assert_half_twins_agree, assert_within_half_bound, half_operand
from tests.test_conv_half import check_backward_filter_accumulates, operand_shapes, poisoned_output, reduction_length
from tests.test_conv_implicit_gemm import arguments, output_shape, problem_of, run

ALGO = "implicit_gemm_nhwc"
DIRECTIONS = ("forward", "backward_data", "backward_filter")
# (N, C, H, W, K, R, S, stride, padding, dilation, groups)
CASES = {
    "rows_and_reduction_off_the_tiles": (3, 24, 17, 19, 40, 3, 3, 1, 1, 1, 1),  # M 969, C·R·S 216 = 6.75 stages
    "two_column_tiles_one_partial": (2, 40, 12, 11, 136, 3, 3, 1, 1, 1, 1),   # K 136: 128 + 8
    "five_by_five_wide_padding": (2, 16, 12, 12, 24, 5, 5, 1, 2, 1, 1),
    "padding_wider_than_the_filter": (2, 8, 9, 9, 8, 3, 3, 1, 3, 1, 1),      # backward-data's padding -1
    "dilated_one_sided_padding": (2, 24, 16, 13, 16, 3, 2, 1, (2, 0), (2, 3), 1),
    "one_by_one": (2, 32, 7, 9, 72, 1, 1, 1, 0, 1, 1),
    "many_splits": (8, 32, 28, 28, 64, 3, 3, 1, 1, 1, 1),                     # N·P·Q 6272: 196 stages
    "two_groups_off_the_tiles": (3, 32, 11, 13, 48, 3, 3, 1, 1, 1, 2),        # C/G 16, K/G 24
    "two_groups_two_column_tiles": (2, 16, 9, 9, 272, 3, 3, 1, 1, 1, 2),      # C/G 8, K/G 136: 128 + 8 each
    "caffenet_conv2_like_split": (6, 48, 13, 13, 64, 5, 5, 1, 2, 1, 2),      # C/G 24, K/G 32, split N·P·Q
    "four_groups_dilated": (2, 32, 12, 11, 32, 3, 3, 1, 2, 2, 4),            # C/G 8, K/G 8
}
# Strided: forward and backward-filter only (K need not be a multiple of 8 for forward).
STRIDED = {"stride_2": (2, 16, 15, 13, 24, 3, 3, 2, 1, 1, 1), "stride_2_odd_k": (2, 16, 15, 13, 9, 3, 3, 2, 1, 1, 1),
           "stride_2_two_groups": (2, 32, 15, 13, 48, 3, 3, 2, 1, 1, 2)}
# One group's C no multiple of the vector: forward and backward-filter run on copies padded with zero channels
# (padded_problem). An ImageNet network's 7 × 7 stride-2 first layer on 3 colour channels, and 5 channels.
PADDED = {"three_colour_channels_7x7_stride_2": (2, 3, 23, 21, 16, 7, 7, 2, 3, 1, 1),
          "five_channels": (3, 5, 10, 9, 24, 3, 3, 1, 1, 1, 1)}
# The cases that run forward and backward-filter only.
FORWARD_AND_FILTER = {**STRIDED, **PADDED}


def supported(case, direction):
    return implicit_gemm_nhwc.ImplicitGemmNhwc().supports(problem_of(case, np.float16), direction)


def check_direction(xp, rng, case, direction, name, label, algo=ALGO):
    first_shape, second_shape = operand_shapes(case, direction)
    first, first_exact = half_operand(xp, rng, first_shape, name)
    second, second_exact = half_operand(xp, rng, second_shape, name, scale=0.5)
    out = poisoned_output(xp, output_shape(case, direction), name)
    assert run(direction, first, second, case, algo=algo, out=out) is out
    exact = run(direction, first_exact, second_exact, case, algo="reference")
    magnitude = run(direction, np.abs(first_exact), np.abs(second_exact), case, algo="reference")
    assert_within_half_bound(out, exact, magnitude, name, reduction_length(case, direction), label)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case_name", CASES)
def test_within_the_half_bound(xp, rng, case_name, direction, name):
    check_direction(xp, rng, CASES[case_name], direction, name, f"{case_name} {direction} {name} on {xp.__name__}")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
@pytest.mark.parametrize("case_name", FORWARD_AND_FILTER)
def test_strided_and_padded_within_the_half_bound(xp, rng, case_name, direction, name):
    case = FORWARD_AND_FILTER[case_name]
    if not supported(case, direction):
        pytest.skip("backward-filter needs K a multiple of 8")
    check_direction(xp, rng, case, direction, name, f"{case_name} {direction} {name} on {xp.__name__}")


@pytest.mark.parametrize("operands_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
def test_the_kernels_see_zero_channels_after_the_layers_own(monkeypatch, rng, direction, operands_last):
    """The GPU path's padding driven on NumPy arrays, the kernels and the finishing pass stood in by NumPy: a float32
    problem's 3 channels reach the kernel as 4 (TF32's vector; padded_problem), the copies' fourth channel is zero in
    a workspace poisoned with NaN, and backward-filter's finished gradient drops the fourth channel's sums."""
    case = PADDED["three_colour_channels_7x7_stride_2"]
    problem = problem_of(case, np.float32, "cuda")
    work = implicit_gemm_nhwc.padded_problem(problem)
    assert (work.C, work.x_shape[0], work.K, work.P) == (4, problem.N, problem.K, problem.P)
    assert implicit_gemm_nhwc.padded_problem(problem_of(CASES["many_splits"], np.float32, "cuda")) is None
    x, w, dy = (rng.standard_normal(shape).astype(np.float32)
                for shape in (problem.x_shape, problem.w_shape, problem.y_shape))
    if operands_last:
        x, w, dy = (layout.to_channels_last(a) for a in (x, w, dy))
    workspace = np.full(implicit_gemm_nhwc.ImplicitGemmNhwc().workspace_bytes(problem, direction), 255, np.uint8)
    launches = []

    def padded_copy(array):
        assert array.shape[-1] == 4 and not np.isnan(array).any() and (array[..., 3] == 0).all()
        return array

    def forward(x_last, w_last, out, shape):
        launches.append(int(shape["C"]))
        y = np.zeros((len(x_last), work.P, work.Q, work.K), np.float64)
        for r, s, view in implicit_gemm_nhwc._tap_views(padded_copy(x_last), work.with_batch(len(x_last))):
            y += view @ padded_copy(w_last)[:, r, s, :].T.astype(np.float64)
        out[...] = y.transpose(0, 3, 1, 2)

    def backward_filter(x_last, dy_last, sums, chunk):
        launches.append(chunk.C)
        dy_rows = dy_last.reshape(-1, chunk.K).astype(np.float64)
        for r, s, view in implicit_gemm_nhwc._tap_views(padded_copy(x_last), chunk):
            sums[:, r, s, :] += dy_rows.T @ np.ascontiguousarray(view).reshape(-1, chunk.C)

    def finish(sums, out, finished_problem, accumulate):
        assert sums.shape == (problem.K, problem.R, problem.S, 3) and finished_problem is problem
        out[...] = sums.transpose(0, 3, 1, 2)

    monkeypatch.setattr(implicit_gemm_nhwc, "_finish_filter_gradient", finish)
    monkeypatch.setattr(implicit_gemm_nhwc, "_to_channels_last",  # dy's transpose (layout.cu's on the GPU)
                        lambda array, out: out.__setitem__(Ellipsis, array.transpose(0, 2, 3, 1)))
    if direction == "forward":
        got = np.empty(problem.y_shape, np.float32)
        implicit_gemm_nhwc._forward_by_chunks(x, w, problem, got, workspace, "forward", forward)
    else:
        got = np.empty(problem.w_shape, np.float32)
        implicit_gemm_nhwc._backward_filter_by_chunks(x, dy, problem, got, False, workspace, backward_filter)
    assert launches == [4]
    first, second = (x, w) if direction == "forward" else (x, dy)
    want = run(direction, first.astype(np.float64), second.astype(np.float64), case, algo="reference")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_backward_filter_adds_into_out(xp, rng, name):
    check_backward_filter_accumulates(xp, rng, CASES["many_splits"], name, ALGO)


def test_what_it_supports():
    algorithm = implicit_gemm_nhwc.ImplicitGemmNhwc()

    def problem(case, dtype=np.float16):
        return problem_of(case, dtype)

    base = CASES["rows_and_reduction_off_the_tiles"]
    assert all(algorithm.supports(problem(base), d) for d in DIRECTIONS)
    assert not any(algorithm.supports(problem(base, np.float32), d) for d in DIRECTIONS)  # half problems only
    grouped = (2, 16, 9, 9, 16, 3, 3, 1, 1, 1, 2)  # C/G and K/G 8
    assert all(algorithm.supports(problem(grouped), d) for d in DIRECTIONS)
    group_channels_4 = (2, 16, 9, 9, 16, 3, 3, 1, 1, 1, 4)  # a 16-byte vector would span two groups
    assert not any(algorithm.supports(problem(group_channels_4), d) for d in DIRECTIONS)
    group_filters_12 = (2, 16, 9, 9, 24, 3, 3, 1, 1, 1, 2)  # K/G 12: forward only
    assert [algorithm.supports(problem(group_filters_12), d) for d in DIRECTIONS] == [True, False, False]
    channels_3 = (2, 3, 9, 9, 16, 3, 3, 1, 1, 1, 1)  # forward and backward-filter pad C to 8; backward-data's
    assert [algorithm.supports(problem(channels_3), d) for d in DIRECTIONS] == [True, False, True]  # dx has 3
    channels_3_odd_k = (2, 3, 9, 9, 9, 3, 3, 1, 1, 1, 1)  # K is backward-filter's reduction too: not padded
    assert [algorithm.supports(problem(channels_3_odd_k), d) for d in DIRECTIONS] == [True, False, False]
    odd_k = (2, 16, 9, 9, 9, 3, 3, 1, 1, 1, 1)  # forward only: K is not a reduction there
    assert [algorithm.supports(problem(odd_k), d) for d in DIRECTIONS] == [True, False, False]
    strided = STRIDED["stride_2"]  # backward-data is a forward convolution only at stride 1
    assert [algorithm.supports(problem(strided), d) for d in DIRECTIONS] == [True, False, True]


def test_workspace_holds_the_channels_last_copies():
    algorithm = implicit_gemm_nhwc.ImplicitGemmNhwc()
    case = (2, 16, 9, 7, 24, 3, 3, 1, 1, 1, 1)  # x 2016 values, w 3456, dy 3024 (P 9, Q 7)
    on_gpu = problem_of(case, np.uint16, "cuda")  # bfloat16's words
    aligned = implicit_gemm_nhwc._aligned
    assert algorithm.workspace_bytes(on_gpu, "forward") == aligned(2 * 2016) + aligned(2 * 3456)
    assert algorithm.workspace_bytes(on_gpu, "backward_data") == aligned(2 * 3024) + aligned(2 * 3456)
    assert algorithm.workspace_bytes(on_gpu, "backward_filter") == aligned(2 * 2016) + aligned(2 * 3024) + 4 * 3456
    assert algorithm.workspace_bytes(problem_of(case, np.float16), "forward") == 0
    grouped = problem_of((2, 16, 9, 7, 24, 3, 3, 1, 1, 1, 2), np.uint16, "cuda")  # the filters hold C/G: 1728 values
    assert algorithm.workspace_bytes(grouped, "forward") == aligned(2 * 2016) + aligned(2 * 1728)
    assert algorithm.workspace_bytes(grouped, "backward_data") == aligned(2 * 3024) + aligned(2 * 1728)
    assert algorithm.workspace_bytes(grouped, "backward_filter") == (aligned(2 * 2016) + aligned(2 * 3024)
                                                                     + 4 * 1728)
    padded = problem_of((2, 3, 9, 7, 24, 3, 3, 1, 1, 1, 1), np.uint16, "cuda")  # C 3 copied as 8: x 1008, w 1728
    assert algorithm.workspace_bytes(padded, "forward") == aligned(2 * 1008) + aligned(2 * 1728)
    assert algorithm.workspace_bytes(padded, "backward_filter") == aligned(2 * 1008) + aligned(2 * 3024) + 4 * 1728


def test_large_batches_run_in_chunks_within_the_bound(monkeypatch):
    """ResNet-18's 56 x 56 layer at batch 128: backward-filter's copies (98 MiB) in chunks of images within 60 MiB,
    forward's (49 MiB) whole."""
    algorithm = implicit_gemm_nhwc.ImplicitGemmNhwc()
    layer = problem_of((128, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1), np.uint16, "cuda")
    assert implicit_gemm_nhwc.images_per_chunk(layer, "forward") == 128
    images = implicit_gemm_nhwc.images_per_chunk(layer, "backward_filter")
    per_image = 2 * 2 * 64 * 56 * 56
    assert images == (implicit_gemm_nhwc.CHUNK_WORKSPACE - 4 * 64 * 64 * 9) // per_image == 78
    assert algorithm.workspace_bytes(layer, "backward_filter") <= implicit_gemm_nhwc.CHUNK_WORKSPACE
    one_image = problem_of((1, 512, 200, 200, 8, 3, 3, 1, 1, 1, 1), np.uint16, "cuda")  # over the bound alone
    assert implicit_gemm_nhwc.images_per_chunk(one_image, "forward") == 1


def test_the_rules_prefer_it_for_half_problems_on_the_gpu(monkeypatch):
    monkeypatch.setattr(conv.implicit_gemm_wgmma._cuda, "has_wgmma", lambda: False)  # a GPU before Hopper
    case = CASES["rows_and_reduction_off_the_tiles"]
    half_on_gpu = problem_of(case, np.uint16, "cuda")
    for direction in DIRECTIONS:
        assert conv.selection.get(half_on_gpu, direction, 1 << 30).name == ALGO
        # Over the workspace limit, implicit GEMM (no workspace but backward-filter's float32 sum) takes it.
        limit = conv.registry.get("implicit_gemm").workspace_bytes(half_on_gpu, direction)
        assert conv.selection.get(half_on_gpu, direction, limit).name == "implicit_gemm"


def test_backward_data_problem_turns_the_convolution():
    case = CASES["dilated_one_sided_padding"]
    problem = problem_of(case, np.float32)
    turned = implicit_gemm_nhwc.backward_data_problem(problem)
    assert (turned.C, turned.K, turned.H, turned.W, turned.P, turned.Q) == (
        problem.K, problem.C, problem.P, problem.Q, problem.H, problem.W)
    assert turned.padding == (2 * 2 - 2, 3 * 1 - 0) and turned.stride == (1, 1)


def test_the_twins_turned_filter_is_each_groups_filter_turned():
    """Backward-data's filter (K, C/G, R, S) turned group by group, (G, C/G, R, S, K/G): element by element."""
    case = (1, 6, 5, 5, 8, 3, 2, 1, 1, 1, 2)  # K 8, C/G 3, K/G 4
    problem = problem_of(case, np.float16)
    w = np.arange(8 * 3 * 3 * 2, dtype=np.float16).reshape(8, 3, 3, 2)
    turned = implicit_gemm_nhwc._numpy_filter(w, problem, turned=True)
    assert turned.shape == (6, 3, 2, 4)
    for g in range(2):
        for c in range(3):
            for r in range(3):
                for s in range(2):
                    for k in range(4):
                        assert turned[g * 3 + c, r, s, k] == w[g * 4 + k, c, 2 - r, 1 - s]


def test_the_launch_geometry_of_caffenets_grouped_conv2(monkeypatch):
    """CaffeNet's conv2 at batch 256 (96 -> 256 channels, 5 x 5, groups 2) on 132 SMs: every group's tiles along
    x, the groups along z, and backward-filter's split counting both groups' tiles."""
    launches = []
    monkeypatch.setattr(conv.implicit_gemm_nhwc, "_launch_tile_kernel", lambda kernel, grid, *_: launches.append(grid))
    monkeypatch.setattr(conv.implicit_gemm_nhwc._cuda, "check_int32", lambda *arrays: None)
    monkeypatch.setattr(conv.implicit_gemm_nhwc._cuda, "sm_count", lambda: 132)
    monkeypatch.setattr(conv.implicit_gemm_nhwc, "_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(conv.implicit_gemm_wgmma, "_kernel", lambda *args, **kwargs: None)
    problem = problem_of((256, 96, 27, 27, 256, 5, 5, 1, 2, 1, 2), np.uint16, "cuda")
    shape = implicit_gemm_nhwc._shape_struct(problem)
    assert (shape["C"], shape["K"], shape["groups"]) == (48, 128, 2)
    out = np.zeros((1, 1, 1, 1), np.uint16)
    for module in (conv.implicit_gemm_nhwc, conv.implicit_gemm_wgmma):
        module._launch_forward(None, None, out, shape)
        module._launch_backward_filter(None, None, None, problem)
    rows_tiles = -(-256 * 27 * 27 // 128)  # 1458 tiles of 128 pixels, one 128-wide column tile per group
    filter_tiles = -(-25 * 48 // 128)      # R·S·C/G = 1200 rows: 10 tiles per group
    # N·P·Q = 186624 pixels: 5832 stages of 32 (nhwc), 2916 of 64 (wgmma); split for 8 (nhwc) or 4 (wgmma) CTAs
    # per SM over both groups' 20 tiles: 53 or 27 slices of 111 or 108 stages.
    assert launches == [(rows_tiles, 1, 2), (filter_tiles, -(-5832 // 111), 2),
                        (rows_tiles, 1, 2), (filter_tiles, -(-2916 // 108), 2)]
    assert implicit_gemm_nhwc.steps_per_split(problem, 132, 32, 8) == 111
    assert implicit_gemm_nhwc.steps_per_split(problem, 132, 64, 4) == 108


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case_name", ["two_column_tiles_one_partial", "many_splits", "caffenet_conv2_like_split"])
def test_the_gpu_and_its_numpy_twin_agree_to_a_rounding(rng, case_name, direction, name):
    check_twins(rng, CASES[case_name], direction, name)


def check_twins(rng, case, direction, name, algo=ALGO):
    """``algo`` on the GPU against its NumPy twin: within a rounding plus what two float32 sums of the same exact
    products may differ by."""
    cupy = backend.cupy()
    first_shape, second_shape = operand_shapes(case, direction)
    first, first_exact = half_operand(np, rng, first_shape, name)
    second, second_exact = half_operand(np, rng, second_shape, name, scale=0.5)
    on_cpu = run(direction, first, second, case, algo=algo)
    on_gpu = run(direction, *(cupy.asarray(a.view(np.uint16) if name == "bfloat16" else a) for a in (first, second)),
                 case, algo=algo)
    magnitude = run(direction, np.abs(first_exact), np.abs(second_exact), case, algo="reference")
    assert_half_twins_agree(on_gpu, on_cpu, name, 2 * reduction_length(case, direction) * FLOAT32_UNIT * magnitude)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("weight_last", [False, True], ids=["weight_contiguous", "weight_last"])
@pytest.mark.parametrize("phase", [False, True], ids=["whole", "phase"])
@pytest.mark.parametrize("turned", [False, True], ids=["forward", "turned"])
def test_the_gpus_filter_copies_are_the_twins(rng, turned, phase, weight_last, dtype):
    """layout.filter_to_channels_last on the GPU, bit for bit the twin's copy, grouped: forward's (K, R, S, C/G) and
    backward-data's turned (G, C/G, R, S, K/G), from a C-contiguous or a channels-last w, or a strided phase
    w[:, :, 1::2, 0::2] of either (read at its strides, as strided_dgrad hands it), of 2- and 4-byte words (the half
    builds' and TF32's)."""
    cupy = backend.cupy()
    problem = problem_of((1, 24, 5, 5, 32, 3, 2, 1, 1, 1, 2), dtype)  # C/G 12, K/G 16
    K, group_channels, R, S = problem.w_shape
    whole = rng.standard_normal((K, group_channels, 2 * R, 2 * S) if phase else problem.w_shape).astype(dtype)
    on_gpu = cupy.asarray(whole)
    on_gpu = layout.to_channels_last(on_gpu) if weight_last else on_gpu
    w = np.ascontiguousarray(whole[:, :, 1::2, 0::2]) if phase else whole
    on_gpu = on_gpu[:, :, 1::2, 0::2] if phase else on_gpu
    expected = implicit_gemm_nhwc._numpy_filter(w, problem, turned).astype(dtype)  # the twin widens: exact
    out = cupy.empty(expected.shape, dtype)
    layout.filter_to_channels_last(on_gpu, out, turned, problem.groups)
    assert np.array_equal(cupy.asnumpy(out), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_resnet_layer_within_the_bound_on_the_gpu(rng, direction):
    """ResNet-18's layer2 3x3 shape at batch 16 (28 x 28, 128 channels): full tiles, the 128-wide kernel,
    more shared memory than the static 48 KiB."""
    cupy = backend.cupy()
    case = (16, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1)
    check_direction(cupy, rng, case, direction, "bfloat16", f"resnet layer2 {direction}")
    assert convert.half_type_of(cupy.zeros(1, cupy.uint16)) == "bfloat16"


@pytest.mark.gpu
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_chunks_of_images_on_the_gpu(monkeypatch, rng, direction):
    """A bound of about three images' copies: 8 images in chunks of 2-3, the filter copied once, dw summed over
    every chunk (and the last chunk shorter)."""
    cupy = backend.cupy()
    case = (8, 16, 12, 10, 24, 3, 3, 1, 1, 1, 1)
    problem = problem_of(case, np.uint16, "cuda")
    fixed = implicit_gemm_nhwc._bytes(implicit_gemm_nhwc._pieces(problem, direction, 0))
    per_image = implicit_gemm_nhwc._bytes(implicit_gemm_nhwc._pieces(problem, direction, 1)) - fixed
    monkeypatch.setattr(implicit_gemm_nhwc, "CHUNK_WORKSPACE", fixed + 3 * per_image)
    conv.registry.clear_caches()  # plans and chunk sizes worked out under the default bound
    try:
        assert implicit_gemm_nhwc.images_per_chunk(problem, direction) == 3
        check_direction(cupy, rng, case, direction, "bfloat16", f"chunks {direction}")
    finally:
        monkeypatch.undo()
        conv.registry.clear_caches()
