"""Cross-channel LRN primitives against a loop reference, finite differences and PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

from minidnn.primitives import layout
from minidnn.primitives.lrn import lrn_backward, lrn_forward
from tests.helpers import FD_TOLERANCE, assert_close, numerical_gradient, to_numpy


# Non-default hyper-parameters, so a mix-up of alpha, beta and k shows; alpha large enough that
# the window sums matter next to k.
PARAMS = dict(alpha=0.3, beta=0.7, k=1.5)


def window(c: int, size: int, channels: int) -> list[int]:
    """The channels whose squares enter scale[c]: c − size//2 … c + (size − 1)//2, clipped."""
    return [j for j in range(c - size // 2, c + (size - 1) // 2 + 1) if 0 <= j < channels]


def reference_lrn(x: np.ndarray, size: int, alpha: float, beta: float, k: float) -> tuple[np.ndarray, np.ndarray]:
    """Loops over images and channels; each channel's window is summed term by term in float64."""
    x = x.astype(np.float64)
    scale = np.empty_like(x)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            total = np.zeros(x.shape[2:])
            for j in window(c, size, x.shape[1]):
                total += x[n, j] ** 2
            scale[n, c] = k + alpha / size * total
    return x * scale ** -beta, scale


def reference_lrn_backward(dy: np.ndarray, x: np.ndarray, size: int, alpha: float, beta: float,
                           k: float) -> np.ndarray:
    """dx[c] = Σ_{c'} dy[c']·∂y[c']/∂x[c] by the chain rule, with membership c ∈ window(c') tested directly:
    ∂y[c']/∂x[c] = [c = c']·s[c']^−β − β·x[c']·s[c']^(−β−1)·(α/size)·2·x[c]·[c ∈ window(c')].
    """
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    _, scale = reference_lrn(x, size, alpha, beta, k)
    dx = np.zeros_like(x)
    channels = x.shape[1]
    for n in range(x.shape[0]):
        for c in range(channels):
            dx[n, c] = dy[n, c] * scale[n, c] ** -beta
            for c_out in range(channels):
                if c in window(c_out, size, channels):
                    dx[n, c] -= (dy[n, c_out] * beta * x[n, c_out] * scale[n, c_out] ** (-beta - 1)
                                 * alpha / size * 2 * x[n, c])
    return dx


CASES = [  # (shape, size): 3-D, 4-D and 5-D inputs, batch 1, C below, at and above size
    ((1, 3, 4), 1), ((2, 5, 3, 2), 1),
    ((1, 1, 3, 2), 2), ((2, 4, 3, 5), 2), ((1, 6, 2), 2),
    ((1, 2, 3, 3), 3), ((2, 5, 2, 3), 3), ((1, 3, 2, 2, 2), 3),
    ((1, 4, 3, 2), 4), ((2, 7, 1, 3), 4),
    ((1, 3, 2, 3), 5), ((2, 9, 2, 2), 5), ((1, 2, 5), 5),
]


@pytest.mark.parametrize("shape, size", CASES)
def test_lrn_matches_reference_float64(xp, rng, shape, size):
    x, dy = rng.standard_normal(shape) * 2, rng.standard_normal(shape)
    y, scale = lrn_forward(xp.asarray(x), size, **PARAMS, keep_scale=True)
    expected_y, expected_scale = reference_lrn(x, size, **PARAMS)
    assert y.dtype == xp.float64 and scale.dtype == xp.float64
    assert_close(scale, expected_scale, rtol=1e-13, atol=1e-14, name="scale")
    assert_close(y, expected_y, rtol=1e-13, atol=1e-14, name="y")
    dx = lrn_backward(xp.asarray(dy), xp.asarray(x), y, scale, size, **PARAMS)
    assert_close(dx, reference_lrn_backward(dy, x, size, **PARAMS), rtol=1e-12, atol=1e-14, name="dx")
    # A layer keeps no scale between the passes: the forward returns none, the backward recomputes it.
    y_only, no_scale = lrn_forward(xp.asarray(x), size, **PARAMS)
    assert no_scale is None
    assert_close(y_only, expected_y, rtol=1e-13, atol=1e-14, name="y without scale")
    dx = lrn_backward(xp.asarray(dy), xp.asarray(x), y_only, None, size, **PARAMS)
    assert_close(dx, reference_lrn_backward(dy, x, size, **PARAMS), rtol=1e-12, atol=1e-14, name="dx, scale recomputed")


@pytest.mark.parametrize("shape, size", [((1, 3, 2, 2), 1), ((2, 4, 2), 2), ((1, 5, 2, 2), 3), ((1, 4, 3, 1), 5),
                                         ((1, 2, 2, 3), 5), ((2, 1, 3), 3), ((1, 3, 1, 1, 2), 2)])
def test_lrn_backward_matches_finite_differences(xp, rng, shape, size):
    x, dy = rng.standard_normal(shape) * 2, rng.standard_normal(shape)
    expected = numerical_gradient(lambda a: lrn_forward(a, size, **PARAMS)[0], [x], 0, dy)
    y, scale = lrn_forward(xp.asarray(x), size, **PARAMS, keep_scale=True)
    dx = lrn_backward(xp.asarray(dy), xp.asarray(x), y, scale, size, **PARAMS)
    assert_close(dx, expected, **FD_TOLERANCE, name="LRN finite differences")


@pytest.mark.parametrize("size", [2, 5])
def test_lrn_float32_matches_float64_reference(xp, rng, size):
    # 24 channels of magnitudes spread over four decades: the prefix sums' cancellation must stay
    # within float32 tolerance.
    x = (rng.standard_normal((2, 24, 3, 2)) * 10.0 ** rng.uniform(-2, 2, size=(1, 24, 1, 1))).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    params = dict(alpha=1e-2, beta=0.75, k=2.0)
    y, scale = lrn_forward(xp.asarray(x), size, **params, keep_scale=True)
    dx = lrn_backward(xp.asarray(dy), xp.asarray(x), y, scale, size, **params)
    assert y.dtype == xp.float32 and scale.dtype == xp.float32 and dx.dtype == xp.float32
    expected_y, expected_scale = reference_lrn(x, size, **params)
    assert_close(scale, expected_scale, rtol=1e-5, atol=1e-6, name="float32 scale")
    assert_close(y, expected_y, rtol=1e-5, atol=1e-6, name="float32 y")
    expected_dx = reference_lrn_backward(dy, x, size, **params)
    assert_close(dx, expected_dx, rtol=1e-4, atol=1e-5 * np.abs(expected_dx).max(), name="float32 dx")


@pytest.mark.parametrize("size, raised_channels", [(1, [2]), (2, [2, 3]), (3, [1, 2, 3]), (4, [1, 2, 3, 4])])
def test_lrn_window_orientation(xp, size, raised_channels):
    """Only channel 2 is non-zero: exactly the channels whose window holds 2 get scale > k.
    For even size the window reaches further back (c − size//2) than forward, so with size 2
    channel 2 is seen by channels 2 and 3, not 1."""
    x = np.zeros((1, 6, 1, 1))
    x[0, 2] = 1.0
    _, scale = lrn_forward(xp.asarray(x), size, alpha=1.0, beta=0.75, k=1.0, keep_scale=True)
    expected = np.ones(6)
    expected[raised_channels] = 1.0 + 1.0 / size
    assert_close(to_numpy(scale)[0, :, 0, 0], expected, name="scale per channel")


def test_lrn_defaults_and_zero_input(xp, rng):
    x = rng.standard_normal((1, 5, 2, 2))
    y, scale = lrn_forward(xp.asarray(x), 3, keep_scale=True)
    expected_y, expected_scale = reference_lrn(x, 3, alpha=1e-4, beta=0.75, k=1.0)
    assert_close(y, expected_y, rtol=1e-13, name="default y")
    assert_close(scale, expected_scale, rtol=1e-13, name="default scale")
    zeros = xp.zeros((1, 4, 2, 3), dtype=xp.float32)
    y, scale = lrn_forward(zeros, 5, k=0.5, keep_scale=True)
    np.testing.assert_array_equal(to_numpy(scale), 0.5)
    np.testing.assert_array_equal(to_numpy(y), 0.0)


@pytest.mark.parametrize("shape, size", [((128, 8, 100, 100), 5), ((8, 96, 27, 27), 5), ((3, 40, 7), 64)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_lrn_large_shapes_match_numpy_twin(xp, rng, shape, size, dtype):
    """More pixels than one pass of the GPU grid (132·32·256 threads); AlexNet's LRN; a window wider than C."""
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    x, dy = (rng.standard_normal(shape) * 2).astype(dtype), rng.standard_normal(shape).astype(dtype)
    params = dict(alpha=1e-2, beta=0.75, k=2.0)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    y, scale = lrn_forward(xp.asarray(x), size, **params, keep_scale=True)
    y_twin, scale_twin = lrn_forward(x, size, **params, keep_scale=True)
    assert_close(scale, scale_twin, **tol, name="scale")
    assert_close(y, y_twin, **tol, name="y")
    dx = lrn_backward(xp.asarray(dy), xp.asarray(x), y, scale, size, **params)
    # dx subtracts two terms of similar size: float32's pow rounding (CUDA's powf is within 4 ulp) shows more.
    dx_tol = tol if dtype == np.float64 else dict(rtol=1e-4, atol=1e-5)
    assert_close(dx, lrn_backward(dy, x, to_numpy(y), to_numpy(scale), size, **params), **dx_tol, name="dx")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("channels, size", [(13, 5), (13, 4), (3, 7), (6, 1)])
def test_gpu_lrn_reads_and_writes_channels_last_arrays(xp, rng, dtype, channels, size):
    """A channels-last x gives channels-last y, scale and dx, read and written as they lie (no copies), equal to the
    NumPy twin on the same values, odd and even windows, one wider than C; a dy of the other layout still gives
    the twin's dx."""
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    shape, params = (3, channels, 9, 11), dict(alpha=1e-2, beta=0.75, k=2.0)
    x, dy = (rng.standard_normal(shape) * 2).astype(dtype), rng.standard_normal(shape).astype(dtype)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    dx_tol = tol if dtype == np.float64 else dict(rtol=1e-4, atol=1e-5)
    x_last, dy_last = (layout.to_channels_last(xp.asarray(a)) for a in (x, dy))
    y, scale = lrn_forward(x_last, size, **params, keep_scale=True)
    y_twin, scale_twin = lrn_forward(x, size, **params, keep_scale=True)
    assert layout.is_channels_last(y) and layout.is_channels_last(scale)
    assert_close(y, y_twin, **tol, name="y")
    assert_close(scale, scale_twin, **tol, name="scale")
    dx_twin = lrn_backward(dy, x, y_twin, scale_twin, size, **params)
    dx = lrn_backward(dy_last, x_last, y, scale, size, **params)
    assert layout.is_channels_last(dx)
    assert_close(dx, dx_twin, **dx_tol, name="dx")
    assert_close(lrn_backward(dy_last, x_last, y, None, size, **params), dx_twin, **dx_tol, name="dx, scale recomputed")
    assert_close(lrn_backward(xp.asarray(dy), x_last, y, scale, size, **params), dx_twin, **dx_tol, name="dx, mixed")


def test_lrn_errors_name_the_argument(xp):
    x = xp.ones((2, 3, 4, 4))
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        lrn_forward(x, 0)
    with pytest.raises(TypeError, match="size must be an int"):
        lrn_forward(x, 2.0)
    with pytest.raises(TypeError, match="size must be an int"):
        lrn_forward(x, True)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        lrn_forward(x, 3, alpha="0.1")
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        lrn_forward(xp.ones((2, 3, 4), dtype=xp.int32), 3)
    with pytest.raises(
            ValueError, match=r"x must be \(N, C, \*spatial\) with at least 3 dimensions, got shape \(2, 3\)$"):
        lrn_forward(xp.ones((2, 3)), 3)
    y, scale = lrn_forward(x, 3, keep_scale=True)
    with pytest.raises(ValueError, match=r"dy must have x's shape \(2, 3, 4, 4\), got \(2, 3, 4, 3\)"):
        lrn_backward(xp.ones((2, 3, 4, 3)), x, y, scale, 3)
    with pytest.raises(TypeError, match="scale and x must have the same dtype"):
        lrn_backward(x, x, y, scale.astype(xp.float32), 3)
    with pytest.raises(ValueError, match="size must be >= 1"):
        lrn_backward(x, x, y, scale, -1)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("shape", [(2, 5, 3, 4), (1, 3, 4), (1, 4, 2, 3, 2)])
def test_lrn_matches_torch(xp, rng, size, shape):
    torch = pytest.importorskip("torch")
    x, dy = rng.standard_normal(shape) * 2, rng.standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.local_response_norm(tx, size, **PARAMS)
    ty.backward(torch.tensor(dy))
    y, scale = lrn_forward(xp.asarray(x), size, **PARAMS, keep_scale=True)
    dx = lrn_backward(xp.asarray(dy), xp.asarray(x), y, scale, size, **PARAMS)
    assert_close(y, ty.detach().numpy(), rtol=1e-12, atol=1e-14, name="LRN vs torch")
    assert_close(dx, tx.grad.numpy(), rtol=1e-11, atol=1e-13, name="LRN grad vs torch")
