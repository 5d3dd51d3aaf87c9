"""The fft algorithm: grid sizes, the filter DFT matrices against real FFTs, the FFT seam (cuFFT plans on the GPU),
no wrap-around at the grid's edge, the float32 error on model shapes and the workspace formula.

All three directions are also run against the loop reference by tests/test_primitives_conv.py.
"""
import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives.conv import fft, registry
from minidnn.primitives.conv.problem import ConvProblem
from tests.helpers import assert_close, to_numpy
from tests.test_primitives_conv import DIRECTIONS, call, run_on_a_poisoned_workspace, loop_reference, relative_error


def test_smooth_size_is_the_next_size_with_prime_factors_2_3_5_7():
    def smooth(n):
        for prime in (2, 3, 5, 7):
            while n % prime == 0:
                n //= prime
        return n == 1

    for n in range(1, 300):
        size = fft.smooth_size(n)
        assert size >= n and smooth(size) and not any(smooth(k) for k in range(n, size))
    assert [fft.smooth_size(n) for n in (11, 13, 29, 31, 58, 97, 121)] == [12, 14, 30, 32, 60, 98, 125]


def test_grid_is_the_smallest_without_wrap_around():
    problem = ConvProblem(2, 3, 27, 29, 4, 5, 5, (1, 1), (2, 1), (1, 1), 1, np.dtype(np.float32), "cpu")
    shape = fft.grid(problem)
    assert (shape.height, shape.width) == (30, 30)  # 27 + 2 = 29 -> 30, 29 + 1 = 30
    assert (shape.half, shape.bins) == (16, 30 * 16)
    wide_padding = ConvProblem(1, 1, 4, 4, 1, 2, 3, (1, 1), (3, 0), (1, 1), 1, np.dtype(np.float32), "cpu")
    assert (fft.grid(wide_padding).height, fft.grid(wide_padding).width) == (9, 4)  # P = 4 + 6 − 2 + 1 = 9 > 4 + 3


@pytest.mark.parametrize("width", [8, 9])  # even: a Nyquist bin; odd: none
def test_filter_dft_matrices_equal_real_ffts_of_the_padded_filter(rng, width):
    shape, taps, dilation = fft.Grid(7, width), (3, 2), (2, 3)
    w = rng.standard_normal(taps)
    padded = np.zeros((7, width))
    padded[0:2 * 2 + 1:2, 0:3 * 1 + 1:3] = w
    rows, cols = fft.filter_dft(shape, taps, dilation, False, np.dtype(np.complex128), backend.device_of(w))
    assert_close(rows @ w @ cols.T, np.fft.rfft2(padded) / shape.size)
    rows, cols = fft.filter_dft(shape, taps, dilation, True, np.dtype(np.complex128), backend.device_of(w))
    assert_close(rows @ w @ cols.T, np.conj(np.fft.rfft2(padded)) / shape.size)
    # The inverse at the taps: a real plane's half spectrum back to its values at the dilated taps.
    plane = rng.standard_normal((7, width))
    rows, cols = fft.inverse_filter_dft(shape, taps, dilation, np.dtype(np.complex128), backend.device_of(w))
    values = np.stack([cols @ half for half in rows @ np.fft.rfft2(plane)]).real
    assert_close(values, plane[0:5:2, 0:4:3], rtol=1e-12, atol=1e-12)


def test_real_ffts_write_into_the_given_arrays(xp, rng):
    planes = xp.asarray(rng.standard_normal((5, 6, 10)).astype(np.float32))
    spectra = xp.full((5, 6, 6), np.nan, dtype=np.complex64)
    fft.real_fft(planes, spectra)
    assert_close(spectra, np.fft.rfft2(to_numpy(planes).astype(np.float64)), rtol=1e-5, atol=1e-5)
    back = xp.full((5, 6, 10), np.nan, dtype=np.float32)
    fft.inverse_real_fft(spectra, back)  # unnormalised: F1·F2 times the planes
    assert_close(back, 60 * to_numpy(planes), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_cufft_plans_are_cached_and_bounded(rng):
    cupy = backend.cupy()
    fft._plans.clear()
    for count in range(1, fft.PLAN_CACHE_SIZE + 3):
        planes = cupy.asarray(rng.standard_normal((count, 4, 6)))
        spectra = cupy.empty((count, 4, 4), dtype=np.complex128)
        fft.real_fft(planes, spectra)
        fft.real_fft(planes, spectra)  # the second call reuses the plan
    assert len(fft._plans) == fft.PLAN_CACHE_SIZE


# Grids with no slack (each side already 7-smooth), so a result that wrapped around would land on real data:
# sized by H + pad (8 = 6 + 2, 9 = 8 + 1, dilated filters), by P (pad 3 > the filter: P = 9 > 4 + 3), and one
# whose 7-tap filter is longer than its 5-row grid (2 + 3).
NO_SLACK = [(2, 3, 6, 8, 4, 3, 2, (2, 1), (2, 2), (8, 9)), (1, 2, 4, 5, 3, 2, 2, (3, 2), (1, 1), (9, 8)),
            (2, 2, 2, 5, 3, 7, 3, (3, 1), (1, 2), (5, 6))]


@pytest.mark.parametrize("case", NO_SLACK, ids=["by_input", "by_output", "filter_longer_than_grid"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_no_wrap_around_on_a_grid_without_slack(xp, rng, direction, case):
    N, C, H, W, K, R, S, padding, dilation, expected_grid = case
    problem = ConvProblem(N, C, H, W, K, R, S, (1, 1), padding, dilation, 1, np.dtype(np.float64), "cpu")
    assert (fft.grid(problem).height, fft.grid(problem).width) == expected_grid
    x, w = rng.standard_normal((N, C, H, W)), rng.standard_normal((K, C, R, S))
    y, backward_data, backward_filter = loop_reference(x, w, 1, padding, dilation, 1)
    dy = rng.standard_normal(y.shape)
    first, second, shape, want = {"forward": (x, w, None, y), "backward_data": (dy, w, x.shape, backward_data(dy)),
                                  "backward_filter": (x, dy, w.shape, backward_filter(dy))}[direction]
    got = call(direction, xp.asarray(first), xp.asarray(second), shape, (1, padding, dilation, 1), algo="fft")
    assert_close(got, want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# float32 error against float64 on model shapes
# ----------------------------------------------------------------------------------------------
MODEL_SHAPES = [  # (N, C, H, W, K, R, padding, groups): CaffeNet's conv2 (FFT's home), ResNet's 56² and 7² layers
    (1, 96, 27, 27, 256, 5, 2, 2), (1, 64, 56, 56, 64, 3, 1, 1), (1, 512, 7, 7, 512, 3, 1, 1)]
BOUND = 2e-6  # about 5x the largest error measured on every stride-1 model shape: 4.1e-7 (direct GEMM: 3.9e-7)


def test_float32_error_on_model_shapes(xp, rng):
    errors = []
    for N, C, H, W, K, R, padding, groups in MODEL_SHAPES:
        x = rng.standard_normal((N, C, H, W)).astype(np.float32)
        w = (rng.standard_normal((K, C // groups, R, R)) / np.sqrt(C // groups * R * R)).astype(np.float32)
        dy = rng.standard_normal((N, K, H, W)).astype(np.float32)
        args = (1, padding, 1, groups)
        inputs = {"forward": (x, w, None), "backward_data": (dy, w, x.shape), "backward_filter": (x, dy, w.shape)}
        for direction, (first, second, shape) in inputs.items():
            want = call(direction, first.astype(np.float64), second.astype(np.float64), shape, args, algo="reference")
            got = call(direction, xp.asarray(first), xp.asarray(second), shape, args, algo="fft",
                       workspace_limit=1 << 40)
            errors.append((relative_error(got, want), direction, (N, C, H, W, K, R)))
    assert max(errors)[0] < BOUND, max(errors)


# ----------------------------------------------------------------------------------------------
# The workspace formula: what is carved (up to the last array's alignment), and enough (poisoned, it works)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_workspace_formula_is_what_is_carved(xp, rng, monkeypatch, direction, dtype):
    device = "cpu" if xp is np else "cuda"
    problem = ConvProblem(3, 4, 11, 9, 6, 3, 2, (1, 1), (2, 0), (1, 2), 2, np.dtype(dtype), device)
    algorithm = registry.get("fft")
    ends, size, out, want = run_on_a_poisoned_workspace(xp, rng, monkeypatch, fft, algorithm, problem,
                                                        direction)
    assert size - fft.ALIGNMENT < max(ends) <= size
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    assert_close(out, want, **tolerance)
