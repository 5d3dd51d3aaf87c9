"""strided_dgrad: backward-data of a strided convolution as stride-1 phases.

Every direction of every registered algorithm is also run against the loop reference and on every model
shape by tests/test_primitives_conv.py; here, what is particular to the phases.
"""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda, convert, layout, tensor_map

from minidnn.primitives.conv import (implicit_gemm, implicit_gemm_nhwc, implicit_gemm_wgmma, plans, registry,
                                     selection, strided_dgrad)
from minidnn.primitives.conv.problem import ConvProblem
from minidnn.primitives.conv.strided_dgrad import phase_problem, phase_span, phase_taps
from tests.helpers import assert_close, to_numpy
from tests.test_primitives_conv import call, relative_error, run_on_a_poisoned_workspace

ALGORITHM = registry.get("strided_dgrad")


def problem(N=2, C=4, H=9, W=8, K=6, R=3, S=3, stride=(2, 2), padding=(1, 1), groups=2, dtype=np.float64,
            device="cpu"):
    return ConvProblem(N, C, H, W, K, R, S, stride, padding, (1, 1), groups, np.dtype(dtype), device)


@pytest.mark.parametrize("size, stride", [(3, 2), (7, 2), (5, 4), (1, 2), (2, 3), (3, 3)])
def test_the_phases_share_out_every_filter_tap_once(size, stride):
    taps = [list(range(phase, size, stride)) for phase in range(stride)]
    assert [phase_taps(size, stride, phase) for phase in range(stride)] == [len(t) for t in taps]
    assert sorted(tap for phase in taps for tap in phase) == list(range(size))


@pytest.mark.parametrize("extent, padding, stride", [(9, 1, 2), (10, 3, 4), (7, 0, 2), (6, 2, 3), (5, 0, 3)])
def test_the_phases_cover_every_input_row_once(extent, padding, stride):
    rows = []
    for phase in range(stride):
        first, stop, start = phase_span(extent, padding, stride, phase, length=10 ** 6)
        phase_rows = [start + stride * (h - first) for h in range(first, stop)]
        assert all((h + padding) % stride == phase for h in phase_rows)
        rows += phase_rows
    assert sorted(rows) == list(range(extent))


def test_a_phase_is_a_stride_1_unpadded_convolution_whose_output_is_dy():
    whole = problem(H=11, W=9, R=3, S=5, stride=(2, 3), padding=(1, 2))
    for a in range(2):
        for b in range(3):
            phase = phase_problem(whole, a, b)
            assert (phase.stride, phase.padding, phase.dilation) == ((1, 1), (0, 0), (1, 1))
            assert (phase.R, phase.S) == (phase_taps(3, 2, a), phase_taps(5, 3, b))
            assert phase.y_shape == whole.y_shape


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stride, padding, R", [((2, 2), (2, 0), 3), ((3, 2), (1, 1), 5), ((2, 3), (0, 0), 1)])
def test_every_pixel_is_written_and_the_workspace_is_exactly_what_is_carved(xp, rng, monkeypatch, dtype, stride,
                                                                           padding, R):
    # out starts as NaN and the workspace as 0xFF: the one-launch kernel clears nothing, so each pixel
    # must be written by its phase; the phase-by-phase route carves exactly its declared workspace.
    case = problem(N=3, C=4, H=11, W=9, K=6, R=R, S=R, stride=stride, padding=padding, dtype=dtype,
                   device="cpu" if xp is np else "cuda")
    ends, size, out, want = run_on_a_poisoned_workspace(xp, rng, monkeypatch, strided_dgrad, ALGORITHM, case,
                                                        "backward_data")
    assert max(ends, default=0) == size
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    assert_close(out, want, **tolerance)


def test_the_gpu_runs_the_phases_in_one_launch_when_each_has_taps():
    three, one = problem(device="cuda"), problem(R=1, S=1, device="cuda")
    assert strided_dgrad.in_one_launch(three) and ALGORITHM.workspace_bytes(three, "backward_data") == 0
    assert not strided_dgrad.in_one_launch(one) and ALGORITHM.workspace_bytes(one, "backward_data") > 0
    assert ALGORITHM.workspace_bytes(problem(), "backward_data") > 0  # the NumPy twin goes phase by phase
    with pytest.raises(ValueError, match="at least as large as the stride"):
        implicit_gemm.backward_data_by_phase(None, None, one, None, 1)


def test_the_grid_covers_the_largest_phase():
    # Phases differ by a row or a column: (H + pad − a) / u rounds differently for each a.
    for H, pad, u in [(11, 2, 2), (9, 1, 3), (7, 0, 2), (8, 3, 4)]:
        case = problem(N=2, H=H, W=H, stride=(u, u), padding=(pad, pad))
        sizes = []
        for a in range(u):
            first, stop, _ = phase_span(H, pad, u, a, length=10 ** 6)
            sizes.append(stop - first)
        assert sum(sizes) == H  # each dx row in exactly one phase
        assert strided_dgrad.largest_phase(case) == 2 * max(sizes) ** 2


def test_only_strided_undilated_backward_data_is_supported():
    assert ALGORITHM.supports(problem(), "backward_data")
    assert not ALGORITHM.supports(problem(), "forward")
    assert not ALGORITHM.supports(problem(), "backward_filter")
    assert not ALGORITHM.supports(problem(stride=(1, 1)), "backward_data")
    assert not ALGORITHM.supports(ConvProblem(2, 4, 9, 9, 6, 3, 3, (2, 2), (1, 1), (2, 2), 1, np.dtype(np.float64),
                                              "cpu"), "backward_data")


def test_a_stride_wider_than_the_filter_leaves_the_unreached_pixels_zero(xp, rng):
    # A 1x1 stride-2 shortcut: three of the four phases have no taps.
    dy = rng.standard_normal((2, 6, 4, 4))
    w = rng.standard_normal((6, 3, 1, 1))
    out_shape = (2, 3, 8, 7)
    got = call("backward_data", xp.asarray(dy), xp.asarray(w), out_shape, (2, 0, 1, 1), algo="strided_dgrad")
    want = call("backward_data", dy, w, out_shape, (2, 0, 1, 1), algo="reference")
    assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not np.any(to_numpy(got)[:, :, 1::2]) and not np.any(to_numpy(got)[:, :, :, 1::2])


def test_micro_batches_of_the_phases_equal_the_whole_batch(xp, rng):
    case = problem(N=7, R=1, S=1, padding=(0, 0))  # phase by phase on both devices: it has a workspace
    dy = rng.standard_normal(case.y_shape)
    w = rng.standard_normal(case.w_shape)
    limit = ALGORITHM.workspace_bytes(case.with_batch(2), "backward_data")
    seen = []
    plans.call_observer = lambda direction, p, plan: seen.append(plan)
    try:
        got = call("backward_data", xp.asarray(dy), xp.asarray(w), case.x_shape, (2, 0, 1, 2), algo="strided_dgrad",
                   workspace_limit=limit)
    finally:
        plans.call_observer = None
    assert [n for n, _ in seen[0].segments] == [2, 2, 2, 1]
    assert_close(got, call("backward_data", dy, w, case.x_shape, (2, 0, 1, 2), algo="reference"))


def test_find_and_get_offer_it_for_strided_backward_data_only(monkeypatch):
    case = problem()
    monkeypatch.setenv("MINIDNN_CACHE_DIR", "")  # find's times stay in memory
    selection.clear_cache()
    assert "strided_dgrad" in [perf.algorithm for perf in selection.find(case, "backward_data", 1 << 30)]
    assert "strided_dgrad" not in [perf.algorithm for perf in selection.find(case, "forward", 1 << 30)]
    selection.clear_cache()
    on_gpu = problem(device="cuda")
    assert selection.get(on_gpu, "backward_data", 1 << 30).name == "strided_dgrad"
    assert selection.get(on_gpu, "backward_data", 0).name == "strided_dgrad"  # it needs no workspace
    assert selection.get(problem(stride=(1, 1), device="cuda"), "backward_data", 1 << 30).name != "strided_dgrad"


@pytest.mark.gpu
def test_one_launch_across_tiles_groups_and_math_modes(rng):
    # 5 images of 23x23 under stride 2: phases of 12x12, 12x11, 11x12 and 11x11 pixels, 720 rows at most,
    # six row tiles for the largest phase (the others' last CTAs leave early); 72 channels per group: two
    # column tiles, the second partial.
    cupy = backend.cupy()
    case = problem(N=5, C=144, H=23, W=23, K=80, stride=(2, 2), padding=(1, 1), groups=2, device="cuda")
    assert strided_dgrad.in_one_launch(case)
    dy, w = rng.standard_normal(case.y_shape), rng.standard_normal(case.w_shape)
    want = call("backward_data", dy, w, case.x_shape, (2, 1, 1, 2), algo="reference")

    def on_gpu(dtype):
        out = cupy.full(case.x_shape, np.nan, dtype=dtype)
        ALGORITHM.run("backward_data", cupy.asarray(dy.astype(dtype)), cupy.asarray(w.astype(dtype)),
                      dataclasses.replace(case, dtype=np.dtype(dtype)), out, False, None)
        return out

    assert_close(on_gpu(np.float64), want, rtol=1e-10, atol=1e-10)
    with _cuda.tf32(False):
        fp32 = relative_error(on_gpu(np.float32), want)
    with _cuda.tf32(True):
        tf32 = relative_error(on_gpu(np.float32), want)
    assert fp32 < 2e-5, f"fp32: relative error {fp32:.2e}"
    assert tf32 < 2e-3, f"TF32: relative error {tf32:.2e}"  # 10 mantissa bits, as implicit_gemm's TF32 test
    assert tf32 > 20 * fp32, f"TF32 ({tf32:.2e}) is not coarser than fp32 ({fp32:.2e}): no tensor cores?"


# ----------------------------------------------------------------------------------------------
# Half precision: held to float64 by the half bound (tests/test_conv_half.py's docstring)
# ----------------------------------------------------------------------------------------------
# (N, C, H, W, K, R, S, stride, padding, dilation, groups), as tests/test_conv_implicit_gemm.py's cases
HALF_CASES = {
    "resnet_3x3_stride_2": (2, 16, 15, 13, 24, 3, 3, 2, 1, 1, 1),       # one launch on the GPU
    "shortcut_1x1_stride_2": (3, 24, 14, 13, 40, 1, 1, 2, 0, 1, 1),     # one phase, run as gemm_1x1
    "five_by_five_strides_3_2": (2, 8, 17, 14, 16, 5, 5, (3, 2), (1, 2), 1, 1),
    "groups": (2, 16, 11, 9, 24, 3, 3, 2, 1, 1, 2),
    "stride_wider_than_the_filter": (2, 8, 13, 11, 16, 3, 3, 4, 1, 1, 1),  # 1x1 phases and phases without taps
}


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("case_name", HALF_CASES)
def test_half_precision_within_the_half_bound(xp, rng, case_name, name):
    from tests.helpers import assert_within_half_bound, half_operand  # noqa: PLC0415
    from tests.test_conv_half import operand_shapes, poisoned_output, reduction_length  # noqa: PLC0415
    from tests.test_conv_implicit_gemm import output_shape, problem_of  # noqa: PLC0415
    from tests.test_conv_implicit_gemm import run as run_case  # noqa: PLC0415

    case = HALF_CASES[case_name]
    assert ALGORITHM.supports(problem_of(case, np.float16), "backward_data") and ALGORITHM.half_precision
    dy_shape, w_shape = operand_shapes(case, "backward_data")
    dy, dy_exact = half_operand(xp, rng, dy_shape, name)
    w, w_exact = half_operand(xp, rng, w_shape, name, scale=0.5)
    out = poisoned_output(xp, output_shape(case, "backward_data"), name)  # NaN: every pixel must be written
    assert run_case("backward_data", dy, w, case, algo="strided_dgrad", out=out) is out
    exact = run_case("backward_data", dy_exact, w_exact, case, algo="reference")
    magnitude = run_case("backward_data", np.abs(dy_exact), np.abs(w_exact), case, algo="reference")
    assert_within_half_bound(out, exact, magnitude, name, reduction_length(case, "backward_data"),
                             f"{case_name} {name} on {xp.__name__}")


def test_a_half_1x1_phase_runs_as_gemm_1x1_and_the_rules_offer_it_for_half_problems():
    half = problem(C=8, K=16, R=1, S=1, padding=(0, 0), groups=1, dtype=np.float16, device="cuda")
    assert [strided_dgrad.phase_algorithm(phase) for _, _, phase, _, _ in strided_dgrad.phases(half)] == ["gemm_1x1"]
    float_phases = strided_dgrad.phases(dataclasses.replace(half, dtype=np.dtype(np.float32)))
    assert [strided_dgrad.phase_algorithm(phase) for _, _, phase, _, _ in float_phases] == ["implicit_gemm"]
    assert selection.get(problem(C=8, K=16, dtype=np.float16, device="cuda"), "backward_data", 1 << 30).name == \
        "strided_dgrad"


# ----------------------------------------------------------------------------------------------
# Channels-last phases on implicit_gemm_wgmma, each writing its pixels of dx in place
# ----------------------------------------------------------------------------------------------
# (N, C, H, W, K, R, S, stride, padding, groups): channel counts multiples of 8 (the half builds' vectors)
IN_PLACE_CASES = {
    "resnet_3x3_stride_2_odd_sizes": (3, 16, 15, 13, 24, 3, 3, (2, 2), (1, 1), 1),
    "padding_2_groups": (2, 16, 11, 12, 32, 3, 3, (2, 2), (2, 2), 2),     # a phase's cropped padding below 0
    "five_by_five_strides_3_2": (2, 8, 17, 14, 16, 5, 5, (3, 2), (1, 2), 1),
    "shortcut_1x1_stride_2": (2, 8, 9, 8, 16, 1, 1, (2, 2), (0, 0), 1),    # three phases without taps: zeros
    "rows_no_dy_reaches": (2, 8, 10, 9, 8, 3, 3, (2, 2), (0, 0), 1),      # H = 10: dx's last row gets nothing
    # phases of 9 row tiles each, 136 channels of dx: two column tiles, the second 8 wide
    "many_tiles_two_column_tiles": (4, 136, 33, 31, 16, 3, 3, (2, 2), (1, 1), 1),
    # a 2×3 filter: phases (0, 0), (0, 1), (1, 0) of 2, 1, 2 taps, so the longest-first order is not (a, b)'s
    "phases_out_of_tap_order": (2, 8, 11, 12, 16, 2, 3, (2, 2), (0, 1), 1),
}


def in_place_problem(case, dtype, device):
    N, C, H, W, K, R, S, stride, padding, groups = case
    return ConvProblem(N, C, H, W, K, R, S, stride, padding, (1, 1), groups, np.dtype(dtype), device, True)


def stand_in_placed_forward(x_last, w_last, out, shape):
    """implicit_gemm_wgmma's Y_PLACED forward kernel on NumPy, read off the NhwcShape it is handed: y (N, P, Q, K·G)
    of x_last (N, H, W, C·G) and w_last (K·G, R, S, C), stride 1, each output pixel (n, p, q) stored at pixel
    n·out_image + p·out_row + q·out_column + out_first of out's channels-last buffer."""
    assert layout.is_channels_last(out)
    N, C, H, W, K, R, S, P, Q, groups = (int(shape[f]) for f in ("N", "C", "H", "W", "K", "R", "S", "P", "Q", "groups"))
    assert (int(shape["stride_h"]), int(shape["stride_w"]), int(shape["dilation_h"]), int(shape["dilation_w"])) == \
        (1, 1, 1, 1)
    x, w = x_last.reshape(N, H, W, C * groups), w_last.reshape(groups, K, R, S, C)
    y = np.zeros((N, P, Q, K * groups))
    for r in range(R):
        for s in range(S):
            rows, columns = np.arange(P) - int(shape["pad_h"]) + r, np.arange(Q) - int(shape["pad_w"]) + s
            inside_rows, inside_columns = (rows >= 0) & (rows < H), (columns >= 0) & (columns < W)
            patch = np.zeros((N, P, Q, C * groups))
            patch[:, np.ix_(inside_rows, inside_columns)[0], np.ix_(inside_rows, inside_columns)[1]] = \
                x[:, rows[inside_rows]][:, :, columns[inside_columns]]
            for g in range(groups):
                y[..., g * K:(g + 1) * K] += patch[..., g * C:(g + 1) * C] @ w[g, :, r, s, :].T
    n, p, q = np.meshgrid(np.arange(N), np.arange(P), np.arange(Q), indexing="ij")
    placed_pixels = n * int(shape["out_image"]) + p * int(shape["out_row"]) + q * int(shape["out_column"]) + \
        int(shape["out_first"])
    layout.flat(out).reshape(-1, K * groups)[placed_pixels.ravel()] = y.reshape(-1, K * groups)


def stand_in_phases(dy_last, filters, dx, phases, grid):
    """implicit_gemm_wgmma's phase kernel on NumPy, read off the Phases argument it is handed: each phase's placed
    forward product with its sub-filter from its offset. Also checks what only the kernel reads: each phase's tiles
    are its forward grid's, one after another along x, and the longest reductions come first."""
    count = int(phases["count"])
    assert 0 < count <= implicit_gemm_wgmma.MAX_PHASES
    for i in range(count):
        shape = phases["shape"][i]
        K, R, S, C, groups = (int(shape[f]) for f in ("K", "R", "S", "C", "groups"))
        tiles = implicit_gemm_nhwc.forward_grid(shape, implicit_gemm_wgmma.tile_width(K, "forward"))[0]
        assert int(phases["first_tile"][i + 1]) - int(phases["first_tile"][i]) == tiles
        if i:
            assert R * S <= int(phases["shape"][i - 1]["R"]) * int(phases["shape"][i - 1]["S"])
        offset = int(phases["filter_offset"][i])
        stand_in_placed_forward(dy_last, filters[offset:offset + groups * K * R * S * C], dx, shape)
    assert int(phases["first_tile"][0]) == 0 and grid == (int(phases["first_tile"][count]), 1, groups)


@pytest.mark.parametrize("case_name", IN_PLACE_CASES)
def test_the_in_place_phases_on_numpy_with_the_kernels_stood_in(rng, monkeypatch, case_name):
    """The GPU path's Python (the cropped shapes, the placements, the zeroing where phases leave pixels, the
    workspace) run on NumPy, the sub-filters turned by turn_phase_filters' NumPy twin and the phase kernel stood in
    by its NumPy equivalent above: every pixel of a NaN-poisoned channels-last dx written, equal to the float64
    reference, within a 0xFF workspace of exactly the declared size."""
    case = in_place_problem(IN_PLACE_CASES[case_name], np.float64, "cpu")
    monkeypatch.setattr(strided_dgrad, "on_wgmma", lambda problem: problem.channels_last)
    monkeypatch.setattr(strided_dgrad.implicit_gemm_wgmma, "_launch_phases", stand_in_phases)
    dy, w = rng.standard_normal(case.y_shape), rng.standard_normal(case.w_shape)
    want = call("backward_data", dy, w, case.x_shape, (case.stride, case.padding, 1, case.groups), algo="reference")
    workspace = np.full(ALGORITHM.workspace_bytes(case, "backward_data"), 0xFF, dtype=np.uint8)
    out = layout.empty(case.x_shape, np.float64, np, True)
    out[...] = np.nan
    ALGORITHM.run_in_layout("backward_data", layout.to_channels_last(dy), w, case, out, False, workspace)
    assert_close(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "bfloat16", "float16"])
@pytest.mark.parametrize("case_name", IN_PLACE_CASES)
def test_the_in_place_phases_on_wgmma(rng, case_name, precision):
    """A channels-last problem's phases on implicit_gemm_wgmma (on Hopper): every pixel of a NaN-poisoned dx of
    either layout written, within TF32's error or the half bound of the float64 reference."""
    from tests.helpers import assert_within_half_bound, half_operand  # noqa: PLC0415

    if not _cuda.has_wgmma():
        pytest.skip("Hopper's kernel")
    cupy = backend.cupy()
    half = None if precision == "tf32" else precision
    storage = {None: np.float32, "float16": np.float16, "bfloat16": np.uint16}[half]  # bfloat16: 16-bit words
    case = in_place_problem(IN_PLACE_CASES[case_name], storage, "cuda")
    args = (case.stride, case.padding, 1, case.groups)
    with _cuda.tf32(True):
        assert strided_dgrad.on_wgmma(case)
        for out_last in (True, False):
            if half is None:
                dy, w = rng.standard_normal(case.y_shape), rng.standard_normal(case.w_shape)
                operands = (cupy.asarray(dy.astype(np.float32)), cupy.asarray(w.astype(np.float32)))
                out = layout.empty(case.x_shape, np.float32, cupy, out_last)
                out[...] = np.nan
            else:
                (dy_gpu, dy), (w_gpu, w) = half_operand(cupy, rng, case.y_shape, half), \
                    half_operand(cupy, rng, case.w_shape, half, scale=0.5)
                operands = (dy_gpu, w_gpu)
                out = layout.empty(case.x_shape, storage, cupy, out_last)
                out[...] = convert.float_to_half(cupy.full(case.x_shape, np.nan, dtype=np.float32), half)
            ALGORITHM.run_in_layout("backward_data", layout.to_channels_last(operands[0]), operands[1], case, out,
                                    False, cupy.empty(ALGORITHM.workspace_bytes(case, "backward_data"), np.uint8))
            want = call("backward_data", dy, w, case.x_shape, args, algo="reference")
            if half is None:
                error = relative_error(layout.contiguous(out), want)
                assert error < 2e-3, f"TF32: relative error {error:.2e}"
            else:
                magnitude = call("backward_data", np.abs(dy), np.abs(w), case.x_shape, args, algo="reference")
                assert_within_half_bound(layout.contiguous(out), want, magnitude, half,
                                         case.K // case.groups * case.R * case.S, f"{case_name} {half}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case_name", IN_PLACE_CASES)
def test_gpu_phase_filters_equal_the_twin(rng, case_name, dtype):
    """strided_dgrad.cu's one pass lays every phase's turned sub-filter where the NumPy twin does, word for word, from
    a C-contiguous w and from a channels-last one (read at its strides), 4- and 2-byte words; the words between the
    copies (alignment) are left as they were."""
    cupy = backend.cupy()
    case = in_place_problem(IN_PLACE_CASES[case_name], dtype, "cuda")
    values = strided_dgrad._placed_launches(case)[1]
    w = rng.standard_normal(case.w_shape).astype(dtype)
    want = np.full(values, 7, dtype=dtype)
    strided_dgrad.turn_phase_filters(w, want, case)
    for w_gpu in (cupy.asarray(w), layout.to_channels_last(cupy.asarray(w))):
        got = cupy.full(values, 7, dtype=dtype)
        strided_dgrad.turn_phase_filters(w_gpu, got, case)
        np.testing.assert_array_equal(to_numpy(got).view(np.uint8), want.view(np.uint8))


# The phase kernel's TMA build (implicit_gemm_wgmma.PHASES_TMA): the in-place cases with K per group 64, so that
# every phase's channels fill whole 128-byte stages (bf16 and fp16: 64 values; TF32: two stages of 32)
TMA_PHASE_CASES = {name: case[:4] + (64 * case[9],) + case[5:] for name, case in IN_PLACE_CASES.items()}


def corners(lower, upper, size):
    """The window corners a stride-1 im2col map walks along one dimension."""
    return list(range(lower, size + upper))


@pytest.mark.parametrize("case_name", TMA_PHASE_CASES)
def test_the_phase_tma_launch_maps_each_phase_to_its_cropped_output(monkeypatch, case_name):
    """With PHASES_TMA on, each launch's PhaseMaps argument holds every phase's two maps: dy's im2col box walks
    exactly the phase's cropped output rows and columns from its first corner (−pad, its padding below 0 where the
    crop cuts it), and its sub-filter's tiled map starts at its offset in the filters; the TMA build's kernel, with
    room for its barriers. Off (the default), the gathers."""
    problem_ = in_place_problem(TMA_PHASE_CASES[case_name], np.float16, "cuda")
    encoded, launches = [], []
    monkeypatch.setattr(_cuda, "check_int32", lambda *arrays: None)
    monkeypatch.setattr(implicit_gemm_nhwc, "allow_shared_bytes", lambda kernel, shared: None)
    monkeypatch.setattr(implicit_gemm_nhwc, "_launch_tile_kernel",
                        lambda kernel, grid, shared, args, threads=256: launches.append(("gathers", grid)))

    def encode(arguments, address):
        encoded.append((arguments, address))
        value = np.zeros((), dtype=tensor_map.MAP_DTYPE)
        value["words"][0] = address
        return value[()]

    def function(source, name, dtype, defines):
        return lambda grid, block, args, shared_mem: launches.append((name, dict(defines), grid, args, shared_mem))

    monkeypatch.setattr(implicit_gemm_wgmma, "_maps", SimpleNamespace(get=encode))
    monkeypatch.setattr(_cuda, "function", function)
    dy = SimpleNamespace(data=SimpleNamespace(ptr=1 << 20), dtype=np.dtype(np.float16))
    filters = SimpleNamespace(data=SimpleNamespace(ptr=1 << 22))
    dx = layout.empty(problem_.x_shape, np.float16, np, True)
    placed = strided_dgrad._placed_launches(problem_)[0]
    for _, argument, grid in placed:
        implicit_gemm_wgmma._launch_phases(dy, filters, dx, argument, grid)
    assert [launch[0] for launch in launches] == ["gathers"] * len(placed)
    launches.clear()
    monkeypatch.setattr(implicit_gemm_wgmma, "PHASES_TMA", {128: True, 64: True})
    for turns, argument, grid in placed:
        encoded.clear()
        implicit_gemm_wgmma._launch_phases(dy, filters, dx, argument, grid)
        name, defines, launched_grid, args, shared = launches.pop()
        assert name == "implicit_gemm_wgmma_phases" and launched_grid == grid
        assert defines["TMA"] == defines["Y_LAST"] == defines["Y_PLACED"] == 1
        assert shared == implicit_gemm_wgmma.tma_shared_bytes(defines["BLOCK_N"])
        maps, flat_dx, phases = args
        assert np.shares_memory(flat_dx, dx) and flat_dx.shape == layout.flat(dx).shape and phases is argument
        assert len(encoded) == 2 * len(turns)
        for i, (a, b, phase, offset) in enumerate(turns):
            shape = argument["shape"][i]
            (dy_map, dy_address), (w_map, w_address) = encoded[2 * i], encoded[2 * i + 1]
            assert dy_address == 1 << 20 and w_address == (1 << 22) + offset * 2
            assert maps["dy"][i]["words"][0] == dy_address and maps["w"][i]["words"][0] == w_address
            assert dy_map.dims == (problem_.K, problem_.Q, problem_.P, problem_.N)  # dy, channels innermost
            rows = corners(dy_map.lower_corner[1], dy_map.upper_corner[1], problem_.P)
            columns = corners(dy_map.lower_corner[0], dy_map.upper_corner[0], problem_.Q)
            assert rows == [p - int(shape["pad_h"]) for p in range(int(shape["P"]))]
            assert columns == [q - int(shape["pad_w"]) for q in range(int(shape["Q"]))]
            assert w_map.dims == (phase.R * phase.S * problem_.K // problem_.groups, problem_.C)
        assert not maps["dy"][len(turns):]["words"].any()  # the phases past the launch's count: zero


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "bfloat16", "float16"])
@pytest.mark.parametrize("case_name", TMA_PHASE_CASES)
def test_the_phase_tma_build_equals_the_gathering_build_on_the_gpu(monkeypatch, rng, case_name, precision):
    """The TMA phase kernel's copies land what the gathers do, each phase through its own maps: dx, every pixel
    written once by one CTA, is bit for bit the gathering build's (which the test above holds to the float64
    reference), NaN-poisoned first; the recorded launch replays onto other operands the same way."""
    if not _cuda.has_wgmma():
        pytest.skip("Hopper's kernel")
    cupy = backend.cupy()
    half = None if precision == "tf32" else precision
    storage = {None: np.float32, "float16": np.float16, "bfloat16": np.uint16}[half]
    case = in_place_problem(TMA_PHASE_CASES[case_name], storage, "cuda")
    launched = []
    launch = implicit_gemm_wgmma._launch_mapped
    monkeypatch.setattr(implicit_gemm_wgmma, "_launch_mapped", lambda *a: (launched.append(a), launch(*a)))

    def operands():
        values = [cupy.asarray(rng.standard_normal(shape).astype(np.float32)) for shape in (case.y_shape, case.w_shape)]
        return [v if half is None else convert.float_to_half(v, half) for v in values]

    words = np.uint32 if half is None else np.uint16

    def backward_data(dy, w):
        out = layout.empty(case.x_shape, storage, cupy, True)
        layout.flat(out).view(words)[...] = words(0x7FC00000 if half is None else 0xFFFF)  # NaN in each type
        ALGORITHM.run_in_layout("backward_data", layout.to_channels_last(dy), w, case, out, False,
                                cupy.empty(ALGORITHM.workspace_bytes(case, "backward_data"), np.uint8))
        return out

    dy, w = operands()
    with _cuda.tf32(True):
        assert strided_dgrad.on_wgmma(case)
        gathered = backward_data(dy, w)
        assert not launched
        monkeypatch.setattr(implicit_gemm_wgmma, "PHASES_TMA", {128: True, 64: True})
        copied = backward_data(dy, w)
        assert launched  # the TMA build ran
        assert np.array_equal(to_numpy(layout.flat(copied)).view(words), to_numpy(layout.flat(gathered)).view(words))
        dy2, w2 = operands()
        dy_last, dy2_last = layout.to_channels_last(dy), layout.to_channels_last(dy2)  # outside the recording
        out = layout.empty(case.x_shape, storage, cupy, True)
        workspace = cupy.empty(ALGORITHM.workspace_bytes(case, "backward_data"), np.uint8)
        with _cuda.recording() as steps:
            ALGORITHM.run_in_layout("backward_data", dy_last, w, case, out, False, workspace)
        ready = _cuda.ReadyCall(steps, (dy_last, w, layout.flat(out), workspace), (), ())
        replayed = layout.empty(case.x_shape, storage, cupy, True)
        layout.flat(replayed).fill(0)  # as the call's own fill leaves the pixels no phase writes
        ready(dy2_last, w2, layout.flat(replayed), cupy.empty_like(workspace))
        direct = backward_data(dy2, w2)
    assert np.array_equal(to_numpy(layout.flat(replayed)).view(words), to_numpy(layout.flat(direct)).view(words))
    assert not np.array_equal(to_numpy(layout.flat(replayed)).view(words), to_numpy(layout.flat(copied)).view(words))
