"""``implicit_gemm_wgmma``: ``implicit_gemm_nhwc`` with the products on Hopper's wgmma, in all three directions, held on the GPU to the float64 reference by the half bound (tests/test_conv_half.py) and to
the NumPy twin to a rounding, on the cases of tests/test_conv_nhwc.py (rows, columns and reductions off the
128 × 128 × 64 tile, taps on the padding, dilation, the 64-wide build, backward-filter's split,
groups). Its NumPy twin is implicit_gemm_nhwc's,
which that file tests on the CPU."""
import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda, conv
from minidnn.primitives.conv import implicit_gemm_nhwc, implicit_gemm_wgmma
from tests.test_conv_half import check_backward_filter_accumulates
from tests.test_conv_implicit_gemm import problem_of
from tests.test_conv_nhwc import CASES, STRIDED, check_direction, check_twins

ALGO = "implicit_gemm_wgmma"
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def test_what_it_supports(monkeypatch):
    """implicit_gemm_nhwc's problems; on the GPU only where wgmma runs."""
    algorithm, nhwc = implicit_gemm_wgmma.ImplicitGemmWgmma(), implicit_gemm_nhwc.ImplicitGemmNhwc()
    cases = [*CASES.values(), *STRIDED.values(), (2, 3, 9, 9, 16, 3, 3, 1, 1, 1, 1), (2, 16, 9, 9, 16, 3, 3, 1, 1, 1, 2)]
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
@pytest.mark.parametrize("case_name", STRIDED)
@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
def test_strided_within_the_half_bound_on_the_gpu(rng, case_name, direction, name):
    if not _cuda.has_wgmma():
        pytest.skip("wgmma needs a Hopper GPU")
    if not implicit_gemm_wgmma.ImplicitGemmWgmma().supports(problem_of(STRIDED[case_name], np.float16), direction):
        pytest.skip("backward-filter needs K a multiple of 8")
    check_direction(backend.cupy(), rng, STRIDED[case_name], direction, name, f"{case_name} {direction} {name}",
                    algo=ALGO)


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
