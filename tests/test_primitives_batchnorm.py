"""Batch normalisation primitives against an independent float64 reference, finite differences and torch."""
from __future__ import annotations

import math

import numpy as np
import pytest

from minidnn.primitives.batchnorm import (batch_norm_backward_inference, batch_norm_backward_training,
                                          batch_norm_forward_inference, batch_norm_forward_training)
from tests.helpers import assert_close, numerical_gradient, to_numpy

EPS = 1e-5
# Odd shapes: 2-D (N, C), 3-D, 4-D with N = 1 and spatial > 1, 5-D.
SHAPES = [(5, 3), (2, 3, 5), (3, 2, 4, 5), (1, 4, 3, 2), (2, 3, 2, 1, 3)]
FD_SHAPES = [(4, 3), (2, 3, 3, 2), (1, 2, 3, 3)]


# ----------------------------------------------------------------------------------------------
# Independent float64 reference: per-channel loops, exact sums, an explicit Jacobian for backward
# ----------------------------------------------------------------------------------------------
def channel_values(x: np.ndarray, c: int) -> list[float]:
    """Every value of channel c (axis 1), as Python floats."""
    return [float(v) for v in np.asarray(x, dtype=np.float64)[:, c].ravel()]


def reference_statistics(x: np.ndarray) -> tuple[list[float], list[float], int]:
    """Per-channel mean and biased variance with exact (fsum) sums, and M."""
    means, variances = [], []
    for c in range(x.shape[1]):
        values = channel_values(x, c)
        mean = math.fsum(values) / len(values)
        means.append(mean)
        variances.append(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return means, variances, len(channel_values(x, 0))


def reference_normalise(x, weight, bias, means, variances, eps=EPS) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        w = 1.0 if weight is None else float(weight[c])
        b = 0.0 if bias is None else float(bias[c])
        y[:, c] = (x[:, c] - means[c]) / math.sqrt(variances[c] + eps) * w + b
    return y


def reference_backward_training(dy, x, weight, eps=EPS):
    """dx = Jᵀ·dy with the explicit per-channel Jacobian ∂y_i/∂x_j = w/σ·(δ_ij − 1/M − x̂_i·x̂_j/M)."""
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    means, variances, count = reference_statistics(x)
    dx = np.empty_like(x)
    dweight, dbias = np.empty(x.shape[1]), np.empty(x.shape[1])
    for c in range(x.shape[1]):
        sigma = math.sqrt(variances[c] + eps)
        xhat = (np.array(channel_values(x, c)) - means[c]) / sigma
        grad = np.array(channel_values(dy, c))
        w = 1.0 if weight is None else float(weight[c])
        jacobian = w / sigma * (np.eye(count) - 1.0 / count - np.outer(xhat, xhat) / count)
        dx[:, c] = (jacobian.T @ grad).reshape(dx[:, c].shape)
        dweight[c] = math.fsum(grad * xhat)
        dbias[c] = math.fsum(grad)
    return dx, dweight, dbias


def reference_backward_inference(dy, x, weight, running_mean, running_var, eps=EPS):
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    dx = np.empty_like(x)
    dweight, dbias = np.empty(x.shape[1]), np.empty(x.shape[1])
    for c in range(x.shape[1]):
        invstd = 1.0 / math.sqrt(float(running_var[c]) + eps)
        w = 1.0 if weight is None else float(weight[c])
        dx[:, c] = dy[:, c] * w * invstd
        xhat = (np.array(channel_values(x, c)) - float(running_mean[c])) * invstd
        dweight[c] = math.fsum(np.array(channel_values(dy, c)) * xhat)
        dbias[c] = math.fsum(channel_values(dy, c))
    return dx, dweight, dbias


def random_inputs(rng, shape, affine=True, dtype=np.float64):
    """x with a per-channel offset and scale (so mean and variance matter), weight, bias, running stats."""
    C = shape[1]
    centre = rng.uniform(-2, 2, size=(1, C) + (1,) * (len(shape) - 2))
    x = (rng.standard_normal(shape) * rng.uniform(0.5, 2.0, size=centre.shape) + centre).astype(dtype)
    weight = rng.uniform(0.5, 1.5, C).astype(dtype) if affine else None
    bias = rng.standard_normal(C).astype(dtype) if affine else None
    running_mean = rng.standard_normal(C).astype(dtype)
    running_var = rng.uniform(0.5, 2.0, C).astype(dtype)
    return x, weight, bias, running_mean, running_var


def on(xp, *arrays):
    """Fresh device copies (xp.asarray of a NumPy array would alias it, and running stats change in place)."""
    return [None if a is None else xp.array(a, copy=True) for a in arrays]


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_forward_training_matches_reference(xp, rng, shape, affine):
    x, weight, bias, _, _ = random_inputs(rng, shape, affine)
    y, mean, invstd = batch_norm_forward_training(*on(xp, x, weight, bias), None, None)
    means, variances, _ = reference_statistics(x)
    assert_close(y, reference_normalise(x, weight, bias, means, variances), name="y")
    assert_close(mean, np.array(means), name="mean")
    assert_close(invstd, 1.0 / np.sqrt(np.array(variances) + EPS), name="invstd")
    assert to_numpy(mean).dtype == to_numpy(invstd).dtype == np.float64


@pytest.mark.parametrize("momentum", [0.1, 0.35, 1.0, 0.0])
def test_running_statistics_update_in_place_with_unbiased_variance(xp, rng, momentum):
    x, weight, bias, running_mean, running_var = random_inputs(rng, (3, 4, 2, 3))
    rm, rv = on(xp, running_mean, running_var)
    rm_id, rv_id = id(rm), id(rv)
    x_dev = xp.asarray(x)
    y, _, _ = batch_norm_forward_training(x_dev, *on(xp, weight, bias), rm, rv, momentum=momentum)
    means, variances, count = reference_statistics(x)
    assert count == 3 * 2 * 3
    unbiased = np.array(variances) * count / (count - 1)
    assert id(rm) == rm_id and id(rv) == rv_id
    assert_close(rm, (1 - momentum) * running_mean + momentum * np.array(means), name="running_mean")
    assert_close(rv, (1 - momentum) * running_var + momentum * unbiased, name="running_var")
    # The normalisation itself uses the biased variance, and tracking statistics does not change y.
    assert_close(y, reference_normalise(x, weight, bias, means, variances), name="y")
    assert_close(x_dev, x, name="x unchanged")


def test_running_statistics_accumulate_over_steps(xp, rng):
    running_mean, running_var = xp.zeros(2), xp.ones(2)
    expected_mean, expected_var = np.zeros(2), np.ones(2)
    for _ in range(3):
        x = rng.standard_normal((2, 2, 3)) * 3 + 1
        batch_norm_forward_training(xp.asarray(x), None, None, running_mean, running_var, momentum=0.2)
        means, variances, count = reference_statistics(x)
        expected_mean = 0.8 * expected_mean + 0.2 * np.array(means)
        expected_var = 0.8 * expected_var + 0.2 * np.array(variances) * count / (count - 1)
    assert_close(running_mean, expected_mean, name="running_mean")
    assert_close(running_var, expected_var, name="running_var")


@pytest.mark.parametrize("engine", ["minidnn", "naive"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_num_batches_tracked_counts_each_training_call(xp, rng, engine, dtype):
    """The optional counter gains 1 per call, in place (on the GPU in the statistics kernel: nn.BatchNorm's
    count costs no launch), whether the running statistics are tracked or not."""
    from minidnn.naive import plain  # noqa: PLC0415
    from minidnn.primitives import batchnorm, convert  # noqa: PLC0415

    if engine == "naive" and dtype == "bfloat16":
        pytest.skip("the naive engine has no half precision")
    library = batchnorm if engine == "minidnn" else plain
    counter = xp.asarray(np.array(41, dtype=np.int64))
    x = xp.asarray(rng.standard_normal((5, 3, 4, 4)).astype(np.float32))
    if dtype == "bfloat16":
        x = convert.float_to_half(x, "bfloat16")
    running_mean, running_var = xp.zeros(3, np.float32), xp.ones(3, np.float32)
    for calls in range(1, 4):
        library.batch_norm_forward_training(x, None, None, running_mean, running_var, num_batches_tracked=counter)
        assert int(counter) == 41 + calls
    library.batch_norm_forward_training(x, None, None, None, None, num_batches_tracked=counter)
    library.batch_norm_forward_training(x, None, None, running_mean, running_var)
    assert int(counter) == 45
    with pytest.raises(TypeError, match="num_batches_tracked must be an int64 array"):
        library.batch_norm_forward_training(x, None, None, None, None, num_batches_tracked=xp.zeros(1, np.int32))
    with pytest.raises(TypeError, match="num_batches_tracked must be an int64 array"):
        library.batch_norm_forward_training(x, None, None, None, None, num_batches_tracked=xp.zeros(2, np.int64))
    if xp is not np:
        with pytest.raises(ValueError, match="num_batches_tracked must be on x's device"):
            library.batch_norm_forward_training(x, None, None, None, None, num_batches_tracked=np.zeros((), np.int64))


@pytest.mark.parametrize("shape", SHAPES + [(1, 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_forward_inference_matches_reference(xp, rng, shape, affine):
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape, affine)
    y = batch_norm_forward_inference(*on(xp, x, weight, bias, running_mean, running_var), eps=1e-3)
    expected = reference_normalise(x, weight, bias, list(running_mean), list(running_var), eps=1e-3)
    assert_close(y, expected, name="y")


def test_statistics_are_numerically_sound_in_float32(xp, rng):
    """|mean| ≫ std: E[x²] − E[x]² would lose every digit in float32; two-pass keeps them."""
    x = (1e4 + rng.standard_normal((16, 3, 9, 7))).astype(np.float32)
    y, mean, invstd = batch_norm_forward_training(xp.asarray(x), None, None, None, None)
    means, variances, _ = reference_statistics(x)  # of the very float32 values, in float64
    assert_close(mean, np.array(means, dtype=np.float32), rtol=1e-7, atol=0, name="mean")
    assert_close(invstd, 1.0 / np.sqrt(np.array(variances) + EPS), rtol=1e-5, atol=0, name="invstd")
    assert_close(y, reference_normalise(x, None, None, means, variances), rtol=1e-4, atol=1e-3, name="y")


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_backward_training_matches_reference(xp, rng, shape, affine):
    x, weight, _, _, _ = random_inputs(rng, shape, affine)
    dy = rng.standard_normal(shape)
    _, mean, invstd = batch_norm_forward_training(*on(xp, x, weight), None, None, None)
    dx, dweight, dbias = batch_norm_backward_training(*on(xp, dy, x, weight), mean, invstd)
    expected = reference_backward_training(dy, x, weight)
    for name, actual, wanted in zip(("dx", "dweight", "dbias"), (dx, dweight, dbias), expected):
        assert_close(actual, wanted, rtol=1e-9, atol=1e-11, name=name)


@pytest.mark.parametrize("shape", FD_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_backward_training_finite_differences(xp, rng, shape, affine):
    """Through the batch statistics: perturbing x moves the mean and the variance too."""
    x, weight, bias, _, _ = random_inputs(rng, shape, affine=True)
    dy = rng.standard_normal(shape)
    if not affine:
        weight = bias = None

    def f(x_, w_, b_):
        return to_numpy(batch_norm_forward_training(*on(xp, x_, w_, b_), None, None)[0])

    _, mean, invstd = batch_norm_forward_training(*on(xp, x, weight, bias), None, None)
    dx, dweight, dbias = batch_norm_backward_training(*on(xp, dy, x, weight), mean, invstd)
    assert_close(dx, numerical_gradient(f, [x, weight, bias], 0, dy), rtol=1e-6, atol=1e-7, name="dx")
    # dweight/dbias are computed without a weight too: they are the gradients at weight = 1, bias = 0.
    ones, zeros = np.ones(shape[1]), np.zeros(shape[1])
    w_at, b_at = (weight, bias) if affine else (ones, zeros)
    assert_close(dweight, numerical_gradient(f, [x, w_at, b_at], 1, dy), rtol=1e-6, atol=1e-7, name="dweight")
    assert_close(dbias, numerical_gradient(f, [x, w_at, b_at], 2, dy), rtol=1e-6, atol=1e-7, name="dbias")


@pytest.mark.parametrize("shape", SHAPES[:3])
@pytest.mark.parametrize("affine", [True, False])
def test_backward_inference_matches_reference(xp, rng, shape, affine):
    x, weight, _, running_mean, running_var = random_inputs(rng, shape, affine)
    dy = rng.standard_normal(shape)
    actual = batch_norm_backward_inference(*on(xp, dy, x, weight, running_mean, running_var))
    expected = reference_backward_inference(dy, x, weight, running_mean, running_var)
    for name, a, e in zip(("dx", "dweight", "dbias"), actual, expected):
        assert_close(a, e, name=name)


@pytest.mark.parametrize("shape", [(1, 3), (2, 3, 2, 2)])
def test_backward_inference_finite_differences(xp, rng, shape):
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape)
    dy = rng.standard_normal(shape)

    def f(x_, w_, b_):
        return to_numpy(batch_norm_forward_inference(*on(xp, x_, w_, b_, running_mean, running_var), eps=0.1))

    dx, dweight, dbias = batch_norm_backward_inference(*on(xp, dy, x, weight, running_mean, running_var), eps=0.1)
    inputs = [x, weight, bias]
    for index, (name, actual) in enumerate(zip(("dx", "dweight", "dbias"), (dx, dweight, dbias))):
        assert_close(actual, numerical_gradient(f, inputs, index, dy), rtol=1e-6, atol=1e-8, name=name)


# ----------------------------------------------------------------------------------------------
# Fused ReLU: y = max(BN(x), 0) and its backward, against the references composed with a ReLU
# ----------------------------------------------------------------------------------------------
def relu_mask(y: np.ndarray) -> np.ndarray:
    """ReLU's gradient as a function of its output (0 at 0, as PyTorch), from a float64 reference y."""
    return (np.asarray(y) > 0).astype(np.float64)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_fused_relu_training_matches_reference(xp, rng, shape, affine):
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape, affine)
    dy = rng.standard_normal(shape)
    rm, rv = on(xp, running_mean, running_var)
    y, mean, invstd = batch_norm_forward_training(*on(xp, x, weight, bias), rm, rv, momentum=0.3, relu=True)
    means, variances, count = reference_statistics(x)
    normalised = reference_normalise(x, weight, bias, means, variances)
    assert_close(y, np.maximum(normalised, 0), name="y")
    # The ReLU changes neither the statistics nor the running statistics.
    assert_close(mean, np.array(means), name="mean")
    assert_close(invstd, 1.0 / np.sqrt(np.array(variances) + EPS), name="invstd")
    assert_close(rm, 0.7 * running_mean + 0.3 * np.array(means), name="running_mean")
    assert_close(rv, 0.7 * running_var + 0.3 * np.array(variances) * count / (count - 1), name="running_var")

    grads = batch_norm_backward_training(*on(xp, dy, x, weight), mean, invstd, relu_output=y)
    expected = reference_backward_training(dy * relu_mask(normalised), x, weight)
    for name, actual, wanted in zip(("dx", "dweight", "dbias"), grads, expected):
        assert_close(actual, wanted, rtol=1e-9, atol=1e-11, name=name)


@pytest.mark.parametrize("shape", SHAPES[:3] + [(1, 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_fused_relu_inference_matches_reference(xp, rng, shape, affine):
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape, affine)
    dy = rng.standard_normal(shape)
    arrays = on(xp, x, weight, bias, running_mean, running_var)
    y = batch_norm_forward_inference(*arrays, relu=True)
    normalised = reference_normalise(x, weight, bias, list(running_mean), list(running_var))
    assert_close(y, np.maximum(normalised, 0), name="y")
    grads = batch_norm_backward_inference(*on(xp, dy, x, weight, running_mean, running_var), relu_output=y)
    expected = reference_backward_inference(dy * relu_mask(normalised), x, weight, running_mean, running_var)
    for name, actual, wanted in zip(("dx", "dweight", "dbias"), grads, expected):
        assert_close(actual, wanted, name=name)


def fused_and_unfused(xp, x, weight, bias, dy, training):
    """(y, dx, dweight, dbias) of the fused primitives and of BN followed by relu_forward/relu_backward."""
    from minidnn.primitives.activation import relu_backward, relu_forward

    C = x.shape[1]
    running_mean, running_var = np.linspace(-0.5, 0.5, C), np.linspace(0.5, 2.0, C)
    results = []
    for fused in (True, False):
        arrays = on(xp, x, weight, bias, dy, running_mean, running_var)
        x_, w_, b_, dy_, rm, rv = arrays
        if training:
            y, mean, invstd = batch_norm_forward_training(x_, w_, b_, rm, rv, relu=fused)
        else:
            y = batch_norm_forward_inference(x_, w_, b_, rm, rv, relu=fused)
        if not fused:
            y = relu_forward(y)
            dy_ = relu_backward(dy_, y)
        relu_output = y if fused else None
        if training:
            grads = batch_norm_backward_training(dy_, x_, w_, mean, invstd, relu_output=relu_output)
        else:
            grads = batch_norm_backward_inference(dy_, x_, w_, rm, rv, relu_output=relu_output)
        results.append([to_numpy(a) for a in (y, *grads)])
    return results


@pytest.mark.parametrize("training", [True, False])
def test_fused_relu_exact_zeros_infinities_and_nan_as_the_unfused_path(xp, rng, training):
    """Outputs exactly 0 get no gradient (channel 0: weight 0 and bias 0; channel 1: one x equal to the
    mean it is normalised with), an infinite dy where y <= 0 gives 0 (a select, not a product), a NaN
    bias makes its channel NaN forward and gradient-free backward: all as BN, relu_forward and
    relu_backward in turn do."""
    N, C, S = 4, 4, 5
    x = rng.standard_normal((N, C, S))
    x[:, 1] = rng.permutation(np.append(np.arange(-9.0, 10.0), 0.0)).reshape(N, S)  # mean exactly 0, two 0s
    if not training:  # inference subtracts fused_and_unfused's running mean instead
        x[:, 1] += np.linspace(-0.5, 0.5, C)[1]
    weight, bias = rng.uniform(0.5, 1.5, C), rng.standard_normal(C)
    weight[0] = bias[0] = bias[1] = 0.0
    bias[3] = np.nan
    dy = rng.standard_normal(x.shape)
    y = fused_and_unfused(xp, x, weight, bias, dy, training)[0][0]
    zero_before_relu = np.zeros(x.shape, dtype=bool)
    zero_before_relu[:, 0] = True
    zero_before_relu[:, 1] = x[:, 1] == (0.0 if training else np.linspace(-0.5, 0.5, C)[1])
    assert np.all(y[zero_before_relu] == 0) and zero_before_relu[:, 1].sum() == 2
    assert np.all(np.isnan(y[:, 3])) and not np.any(np.isnan(y[:, :3]))
    dy[np.isfinite(y) & (y == 0)] = np.inf
    fused, unfused = fused_and_unfused(xp, x, weight, bias, dy, training)
    for name, a, b in zip(("y", "dx", "dweight", "dbias"), fused, unfused):
        assert_close(a, b, rtol=1e-12, atol=1e-14, name=name)
    _, dx, dweight, dbias = fused
    assert np.all(np.isfinite(dx)) and np.all(dx[:, 3] == 0) and dweight[3] == dbias[3] == 0


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("affine", [True, False])
def test_the_relu_mask_recomputed_from_x_is_the_forwards_to_the_bit(xp, rng, dtype, channels_last, affine):
    """The training backward with relu=True (the mask [y > 0] recomputed from x, mean, invstd, weight and bias)
    gives the same bits as with relu_output=y, the forward's own output: the forward normalises with the statistics
    it returns. In float32 a quarter of each channel sits exactly at the mean the forward returns (set to it until
    it stays put), the ReLU's kink where the bias is 0: there y is exactly 0, where a forward normalising with the
    mean in double would let about half of them through. Packed shapes included (S and C multiples of 8); the naive
    engine too, in float."""
    from minidnn import naive  # noqa: PLC0415
    from minidnn.primitives import convert, layout  # noqa: PLC0415

    shape = (6, 16, 8, 8) if channels_last else (6, 16, 5, 8)
    vector = np.float64 if dtype == "float64" else np.float32
    x64 = rng.standard_normal(shape).astype(vector).astype(np.float64)
    picked = rng.random(shape) < 0.25
    # The picked values at the mean of the others (which is then the mean of all), rounded to float32; then set
    # to the forward's own mean until it stays put (its sums round differently).
    others = np.where(picked, 0.0, x64).sum(axis=(0, 2, 3)) / (~picked).sum(axis=(0, 2, 3))
    x64 = np.where(picked, others.astype(np.float32)[None, :, None, None], x64)
    weight, bias = (rng.uniform(0.5, 1.5, 16), rng.standard_normal(16) * 0.1) if affine else (None, None)
    if affine:
        bias[:8] = 0.0  # the kink at the mean itself
        weight, bias = xp.asarray(weight.astype(vector)), xp.asarray(bias.astype(vector))

    def device(values):
        array = xp.asarray(values.astype(vector))
        if dtype in ("bfloat16", "float16"):
            array = convert.float_to_half(array, dtype)
        return layout.to_channels_last(array) if channels_last else array

    engines = [batch_norm_forward_training, batch_norm_backward_training], [naive.batch_norm_forward_training,
                                                                           naive.batch_norm_backward_training]
    dy = device(rng.standard_normal(shape))
    for forward, backward in engines[:1] if dtype in ("bfloat16", "float16") else engines:
        x = device(x64)
        for _ in range(8 if dtype == "float32" else 0):
            mean = to_numpy(forward(x, weight, bias, None, None, relu=True)[1]).astype(np.float64)
            if np.all(x64[picked] == np.broadcast_to(mean[None, :, None, None], shape)[picked]):
                break
            x64 = np.where(picked, mean[None, :, None, None], x64)
            x = device(x64)
        y, mean, invstd = forward(x, weight, bias, None, None, relu=True)
        from_y = backward(dy, x, weight, mean, invstd, relu_output=y)
        from_x = backward(dy, x, weight, mean, invstd, bias=bias, relu=True)
        kept = backward(dy, x, weight, mean, invstd, bias=bias, relu=True)  # the GPU's kept launch
        for name, a, b, c in zip(("dx", "dweight", "dbias"), from_y, from_x, kept):
            np.testing.assert_array_equal(to_numpy(layout.contiguous(b)), to_numpy(layout.contiguous(a)),
                                          err_msg=f"{forward.__module__} {name}")
            np.testing.assert_array_equal(to_numpy(layout.contiguous(c)), to_numpy(layout.contiguous(b)))
        if forward is batch_norm_forward_training:  # the naive engine's layout is its array library's rule
            assert layout.is_channels_last(from_x[0]) == channels_last
        if dtype == "float32":  # the kink: y is exactly 0 where x is the returned mean and the bias 0
            at_mean = (x64 == to_numpy(mean)[None, :, None, None])[:, :8]
            assert at_mean.sum() >= picked[:, :8].sum() * 0.9, f"{forward.__module__}: the mean did not settle"
            assert np.all(to_numpy(layout.contiguous(y))[:, :8][at_mean] == 0)


def test_the_relu_mask_from_x_is_an_alternative_to_relu_output(xp):
    x = xp.asarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    y, mean, invstd = batch_norm_forward_training(x, None, None, None, None, relu=True)
    with pytest.raises(ValueError, match="relu_output .* or relu=True .*, not both"):
        batch_norm_backward_training(x, x, None, mean, invstd, relu_output=y, relu=True)
    with pytest.raises(TypeError, match="relu"):
        batch_norm_backward_training(x, x, None, mean, invstd, relu=1)
    with pytest.raises(ValueError, match="bias must have shape"):
        batch_norm_backward_training(x, x, None, mean, invstd, bias=xp.zeros(4, np.float32), relu=True)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 3)])
@pytest.mark.parametrize("training", [True, False])
def test_fused_relu_backward_finite_differences(xp, rng, shape, training):
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape)
    dy = rng.standard_normal(shape)

    def f(x_, w_, b_, relu=True):
        if training:
            return to_numpy(batch_norm_forward_training(*on(xp, x_, w_, b_), None, None, relu=relu)[0])
        return to_numpy(batch_norm_forward_inference(*on(xp, x_, w_, b_, running_mean, running_var), relu=relu))

    # Shift each channel's bias so that its kink falls in the middle of the widest gap between its
    # sorted middle outputs: a third to two thirds of them are clipped, none is near the kink.
    before = np.sort(np.moveaxis(f(x, weight, bias, relu=False), 1, 0).reshape(shape[1], -1), axis=1)
    low, high = before.shape[1] // 3, 2 * before.shape[1] // 3
    gaps = np.diff(before[:, low - 1:high + 1], axis=1)
    widest = low - 1 + np.argmax(gaps, axis=1)
    rows = np.arange(shape[1])
    bias = bias - (before[rows, widest] + before[rows, widest + 1]) / 2
    y = f(x, weight, bias)
    assert 0.2 < np.mean(y == 0) < 0.8 and np.min(np.abs(f(x, weight, bias, relu=False))) > 1e-3, \
        "outputs near the kink spoil the finite differences"
    y_dev = xp.asarray(y)
    if training:
        _, mean, invstd = batch_norm_forward_training(*on(xp, x, weight, bias), None, None, relu=True)
        grads = batch_norm_backward_training(*on(xp, dy, x, weight), mean, invstd, relu_output=y_dev)
    else:
        grads = batch_norm_backward_inference(*on(xp, dy, x, weight, running_mean, running_var), relu_output=y_dev)
    for index, (name, actual) in enumerate(zip(("dx", "dweight", "dbias"), grads)):
        assert_close(actual, numerical_gradient(f, [x, weight, bias], index, dy), rtol=1e-6, atol=1e-7, name=name)


# ----------------------------------------------------------------------------------------------
# float32
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7, 3), (2, 5, 4, 3), (1, 3, 5, 5)])
def test_float32_against_float64_reference(xp, rng, shape):
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape)
    dy = rng.standard_normal(shape)
    x32, w32, b32, rm32, rv32, dy32 = (a.astype(np.float32) for a in (x, weight, bias, running_mean, running_var, dy))
    # The reference runs on the float32 values, so only the arithmetic's rounding is compared.
    x64, w64, b64, rm64, rv64, dy64 = (a.astype(np.float64) for a in (x32, w32, b32, rm32, rv32, dy32))
    tol = dict(rtol=2e-5, atol=2e-5)

    rm, rv = on(xp, rm32, rv32)
    y, mean, invstd = batch_norm_forward_training(*on(xp, x32, w32, b32), rm, rv, momentum=0.3)
    means, variances, count = reference_statistics(x64)
    for name, array in (("y", y), ("mean", mean), ("invstd", invstd), ("running_mean", rm), ("running_var", rv)):
        assert to_numpy(array).dtype == np.float32, name
    assert_close(y, reference_normalise(x64, w64, b64, means, variances), **tol, name="y")
    assert_close(mean, np.array(means), **tol, name="mean")
    assert_close(invstd, 1 / np.sqrt(np.array(variances) + EPS), **tol, name="invstd")
    assert_close(rm, 0.7 * rm64 + 0.3 * np.array(means), **tol, name="running_mean")
    assert_close(rv, 0.7 * rv64 + 0.3 * np.array(variances) * count / (count - 1), **tol, name="running_var")

    grads = batch_norm_backward_training(*on(xp, dy32, x32, w32), mean, invstd)
    for name, actual, expected in zip(("dx", "dweight", "dbias"), grads, reference_backward_training(dy64, x64, w64)):
        assert to_numpy(actual).dtype == np.float32, name
        assert_close(actual, expected, rtol=1e-4, atol=1e-4, name=name)

    y_inf = batch_norm_forward_inference(*on(xp, x32, w32, b32, rm32, rv32))
    assert to_numpy(y_inf).dtype == np.float32
    assert_close(y_inf, reference_normalise(x64, w64, b64, list(rm64), list(rv64)), **tol, name="y inference")
    grads = batch_norm_backward_inference(*on(xp, dy32, x32, w32, rm32, rv32))
    expected = reference_backward_inference(dy64, x64, w64, rm64, rv64)
    for name, actual, wanted in zip(("dx", "dweight", "dbias"), grads, expected):
        assert to_numpy(actual).dtype == np.float32, name
        assert_close(actual, wanted, **tol, name=name)


# ----------------------------------------------------------------------------------------------
# GPU: split reductions and grid-stride loops against the NumPy twin
# ----------------------------------------------------------------------------------------------
# Large enough that the GPU kernels split each channel over several blocks, give every thread many
# values (chunks of four and a tail), step across planes with S > 256, S = 1 and S < 256, and loop
# more than once in the grid-stride element-wise kernels (4·3·300·400 > 132·32·256 threads). The fourth
# and fifth have S a multiple of 16 bytes' worth of elements: the kernels' 16-byte builds; the last of 8 bytes'
# worth but not 16 for float32 (its 8-byte build; float64's 16-byte one); the others: single elements.
GPU_SHAPES = [(64, 3, 33, 35), (20000, 2), (300, 2, 7, 9), (4, 3, 300, 400), (8, 3, 20, 24), (8, 3, 21, 22)]


@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("relu", [False, True])
def test_gpu_large_shapes_match_numpy_twin(xp, rng, shape, dtype, relu):
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape, dtype=dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    # The twin runs in float64 on the very same values: the GPU accumulates in float64 for float32
    # too, so float32 results differ from it by their final rounding only.
    x64, w64, b64, rm64, rv64, dy64 = (a.astype(np.float64) for a in (x, weight, bias, running_mean, running_var, dy))
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == "float64" else dict(rtol=1e-5, atol=1e-6)

    rm, rv = on(xp, running_mean, running_var)
    y, mean, invstd = batch_norm_forward_training(*on(xp, x, weight, bias), rm, rv, momentum=0.3, relu=relu)
    rm_twin, rv_twin = rm64.copy(), rv64.copy()
    expected = batch_norm_forward_training(x64, w64, b64, rm_twin, rv_twin, momentum=0.3, relu=relu)
    for name, actual, wanted in zip(("y", "mean", "invstd"), (y, mean, invstd), expected):
        assert to_numpy(actual).dtype == dtype, name
        assert_close(actual, wanted, **tol, name=name)
    assert_close(rm, rm_twin, **tol, name="running_mean")
    assert_close(rv, rv_twin, **tol, name="running_var")

    # The backward from the GPU's own (rounded) mean, invstd and y, so that only its arithmetic is compared.
    relu_output = y if relu else None
    grads = batch_norm_backward_training(*on(xp, dy, x, weight), mean, invstd, relu_output=relu_output)
    mean64, invstd64 = to_numpy(mean).astype(np.float64), to_numpy(invstd).astype(np.float64)
    y64 = to_numpy(y).astype(np.float64) if relu else None
    expected = batch_norm_backward_training(dy64, x64, w64, mean64, invstd64, relu_output=y64)
    for name, actual, wanted in zip(("dx", "dweight", "dbias"), grads, expected):
        assert to_numpy(actual).dtype == dtype, name
        assert_close(actual, wanted, **tol, name=name)

    y = batch_norm_forward_inference(*on(xp, x, weight, bias, running_mean, running_var), relu=relu)
    assert_close(y, batch_norm_forward_inference(x64, w64, b64, rm64, rv64, relu=relu), **tol, name="y inference")
    relu_output, y64 = (y, to_numpy(y).astype(np.float64)) if relu else (None, None)
    grads = batch_norm_backward_inference(*on(xp, dy, x, weight, running_mean, running_var), relu_output=relu_output)
    expected = batch_norm_backward_inference(dy64, x64, w64, rm64, rv64, relu_output=y64)
    for name, actual, wanted in zip(("dx", "dweight", "dbias"), grads, expected):
        assert_close(actual, wanted, **tol, name=name + " inference")


@pytest.mark.gpu
def test_gpu_launches_per_direction_and_repeatable_bits(rng, monkeypatch):
    """Two launches per training direction and one per inference direction, the fused ReLU costing none;
    every repetition gives the same bits (the last block of a channel merges its splits in a fixed order,
    and leaves its counter at 0 for the next launch, which must finish its channels too)."""
    from minidnn.primitives import _cuda

    cupy = __import__("cupy")
    launches = []
    for name in ("launch", "launch_blocks"):
        original = getattr(_cuda, name)
        monkeypatch.setattr(_cuda, name, lambda kernel, *args, _original=original, **kwargs:
                            (launches.append(kernel), _original(kernel, *args, **kwargs))[1])
    packed_call = _cuda.PackedLaunch.__call__  # a kept call's launches
    monkeypatch.setattr(_cuda.PackedLaunch, "__call__", lambda self, *arrays:
                        (launches.append(self.kernel), packed_call(self, *arrays))[1])
    x, weight, bias, running_mean, running_var = random_inputs(rng, (64, 5, 33, 35))
    dy = rng.standard_normal(x.shape)
    x, weight, bias, dy, running_mean, running_var = on(cupy, x, weight, bias, dy, running_mean, running_var)
    results = []
    for relu in (False, True, False, True, True):
        counts = []
        launches.clear()
        y, mean, invstd = batch_norm_forward_training(x, weight, bias, None, None, relu=relu)
        counts.append(len(launches))
        relu_output = y if relu else None
        grads = batch_norm_backward_training(dy, x, weight, mean, invstd, relu_output=relu_output)
        counts.append(len(launches) - sum(counts))
        y_inference = batch_norm_forward_inference(x, weight, bias, running_mean, running_var, relu=relu)
        counts.append(len(launches) - sum(counts))
        grads_inference = batch_norm_backward_inference(dy, x, weight, running_mean, running_var,
                                                        relu_output=y_inference if relu else None)
        counts.append(len(launches) - sum(counts))
        assert counts == [2, 2, 1, 1], counts
        results.append([to_numpy(a) for a in (y, mean, invstd, *grads, y_inference, *grads_inference)])
    for first, repeated in ((0, 2), (1, 3), (1, 4)):
        for a, b in zip(results[first], results[repeated]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
def test_gpu_repeated_training_calls_skip_the_checks_and_keep_their_bits(rng, monkeypatch):
    """A training call whose arrays match an earlier call's (type, shape, strides, dtype, GPU, address modulo 16)
    skips the checks and the launch's sizing, and gives the checked call's bits and running statistics; an x in
    another layout or 8 bytes off 16 is checked again (its pack build differs), and bad arguments after a kept call
    still raise."""
    from minidnn.primitives import batchnorm  # noqa: PLC0415

    cupy = __import__("cupy")
    checked = []
    original = batchnorm._check_input
    monkeypatch.setattr(batchnorm, "_check_input", lambda *args, **kwargs: (checked.append(1), original(*args, **kwargs))[1])
    monkeypatch.setattr(batchnorm, "_launches", {})
    x_host, weight_host, bias_host, mean_host, var_host = random_inputs(rng, (6, 8, 5, 8))
    x, weight, bias = on(cupy, x_host, weight_host, bias_host)
    dy = cupy.asarray(rng.standard_normal(x.shape))

    def step(x, dy, **kwargs):
        running_mean, running_var = on(cupy, mean_host, var_host)
        y, mean, invstd = batch_norm_forward_training(x, weight, bias, running_mean, running_var, **kwargs)
        grads = batch_norm_backward_training(dy, x, weight, mean, invstd, relu_output=y if kwargs.get("relu") else None)
        return [to_numpy(a) for a in (y, mean, invstd, running_mean, running_var, *grads)]

    first = step(x, dy)
    assert len(checked) == 2  # forward and backward, checked once
    for a, b in zip(first, step(x, dy)):
        np.testing.assert_array_equal(a, b)
    assert len(checked) == 2  # the steady state: no checks
    step(x, dy, relu=True)
    assert len(checked) == 3  # the forward has no key of its own for relu; the backward's relu_output is new
    step(x, dy, relu=True)
    assert len(checked) == 3

    from minidnn.primitives import layout  # noqa: PLC0415

    last = step(layout.to_channels_last(x), layout.to_channels_last(dy))
    assert len(checked) == 5
    off = cupy.empty(x.size + 1)[1:].reshape(x.shape)  # 8 bytes past a 16-byte boundary: single elements, not packs
    off[...] = x
    assert off.data.ptr % 16 == 8
    shifted = step(off, dy)
    assert len(checked) == 7
    for a, b, c in zip(first, last, shifted):
        assert_close(b, a, rtol=1e-12, atol=1e-12)
        assert_close(c, a, rtol=1e-12, atol=1e-12)

    with pytest.raises(ValueError, match="momentum"):
        batch_norm_forward_training(x, weight, bias, None, None, momentum=2.0)
    with pytest.raises(TypeError, match="relu"):
        batch_norm_forward_training(x, weight, bias, None, None, relu=1)
    with pytest.raises(TypeError, match="weight"):
        batch_norm_forward_training(x, weight.astype(cupy.float32), bias, None, None)
    with pytest.raises(ValueError, match="dy"):
        batch_norm_backward_training(dy[:3], x, weight, *batch_norm_forward_training(x, weight, bias, None, None)[1:])


@pytest.mark.gpu
def test_gpu_kept_calls_allocate_only_their_results_and_nothing_is_kept_in_a_capture(rng, monkeypatch):
    """A kept training call reuses its launch's float64 scratch, which comes from the device, not the caching pool:
    each direction then allocates only its output and its two (C,) vectors, and gives the checked call's bits. A call
    first seen while a CUDA graph is captured keeps nothing (its scratch is the graph's memory)."""
    from minidnn.primitives import batchnorm  # noqa: PLC0415

    cupy = __import__("cupy")
    monkeypatch.setattr(batchnorm, "_launches", {})
    x, weight, bias, _, _ = on(cupy, *random_inputs(rng, (10, 7, 9, 11)))
    dy = cupy.asarray(rng.standard_normal(x.shape))
    pool = cupy.get_default_memory_pool()
    sizes = []

    def counted(size):
        sizes.append(size)
        return pool.malloc(size)

    def step():
        y, mean, invstd = batch_norm_forward_training(x, weight, bias, None, None, relu=True)
        return [to_numpy(a) for a in (y, mean, invstd, *batch_norm_backward_training(dy, x, weight, mean, invstd, y))]

    first = step()
    assert len(batchnorm._launches) == 2
    with cupy.cuda.using_allocator(counted):
        y, mean, invstd = batch_norm_forward_training(x, weight, bias, None, None, relu=True)
        assert sizes == [y.nbytes, mean.nbytes, invstd.nbytes], sizes  # y, then mean and invstd
        grads = batch_norm_backward_training(dy, x, weight, mean, invstd, y)
        assert len(sizes) == 6, sizes  # dx, dweight and dbias
    for a, b in zip(first, [to_numpy(a) for a in (y, mean, invstd, *grads)]):
        np.testing.assert_array_equal(a, b)

    other = cupy.asarray(rng.standard_normal((4, 3, 5, 6)))
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        batch_norm_forward_training(other, None, None, None, None)
        stream.end_capture()
    assert len(batchnorm._launches) == 2


def test_the_steady_state_key_and_scalars_leave_anything_unusual_to_the_checks():
    """batchnorm's steady-state path: NumPy arrays and other objects give no key (the checks then run and say what
    is wrong), and only a float momentum in [0, 1], a finite float eps > 0 and a bool relu skip the scalar checks."""
    from types import SimpleNamespace  # noqa: PLC0415

    from minidnn.primitives import _cuda, batchnorm, convert  # noqa: PLC0415

    x = np.zeros((2, 3, 4, 4), np.float32)
    assert _cuda.steady_key("forward_training", x, None) is None
    assert _cuda.steady_key("forward_training", None, 1.5) is None
    assert _cuda.steady_key("forward_training", x.astype(convert.bfloat16())) is None  # no buffer format: no key

    def device_array(strides, device, address):  # what the key reads of a CuPy array
        return SimpleNamespace(shape=(2, 3), strides=strides, dtype=np.dtype(np.float32),
                               data=SimpleNamespace(device_id=device, ptr=address))

    key = _cuda.steady_key("f", device_array((12, 4), 0, 4096), None)
    assert key == ("f", (SimpleNamespace, (2, 3), (12, 4), np.dtype(np.float32), 0, 0), None)
    for other in (device_array((4, 8), 0, 4096), device_array((12, 4), 1, 4096), device_array((12, 4), 0, 4104)):
        assert _cuda.steady_key("f", other, None) != key  # another layout, GPU or pack alignment: another key
    assert _cuda.steady_key("f", device_array((12, 4), 0, 4096 + 32), None) == key  # the same pack alignment
    assert batchnorm._plain_scalars(0.1, 1e-5, False) and batchnorm._plain_scalars(1.0, 1e-3, True)
    for momentum, eps, relu in ((1, 1e-5, False), (1.5, 1e-5, False), (-0.1, 1e-5, False), (float("nan"), 1e-5, False),
                                (0.1, 0.0, False), (0.1, float("inf"), False), (0.1, 1, False), (0.1, 1e-5, 1),
                                (np.float64(0.1), 1e-5, False), (0.1, 1e-5, np.bool_(True))):
        assert not batchnorm._plain_scalars(momentum, eps, relu), (momentum, eps, relu)


@pytest.mark.gpu
def test_gpu_training_step_replays_in_a_cuda_graph(rng):
    """Forward and backward captured once and replayed on new data in the same buffers: the counters of
    the last-block handshake are left at 0 by every launch, so each replay finishes every channel."""
    cupy = __import__("cupy")
    shape = (16, 6, 17, 19)
    x, weight, bias, _, _ = random_inputs(rng, shape)
    x_static, dy_static = cupy.asarray(x), cupy.asarray(rng.standard_normal(shape))
    weight, bias = cupy.asarray(weight), cupy.asarray(bias)

    def step():
        y, mean, invstd = batch_norm_forward_training(x_static, weight, bias, None, None, relu=True)
        return (y, *batch_norm_backward_training(dy_static, x_static, weight, mean, invstd, relu_output=y))

    step()  # compile the kernels and allocate the counters outside the capture
    cupy.cuda.Device().synchronize()  # the work queued so far, on the default stream, is done
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # the copies below too: a non-blocking stream does not wait for the default stream
        stream.begin_capture()
        outputs = step()
        graph = stream.end_capture()
        for _ in range(3):
            x_new, dy_new = random_inputs(rng, shape)[0], rng.standard_normal(shape)
            x_static[...], dy_static[...] = cupy.asarray(x_new), cupy.asarray(dy_new)
            graph.launch(stream=stream)
            stream.synchronize()
            means, variances, _ = reference_statistics(x_new)
            normalised = reference_normalise(x_new, to_numpy(weight), to_numpy(bias), means, variances)
            assert_close(outputs[0], np.maximum(normalised, 0), name="y")
            expected = reference_backward_training(dy_new * relu_mask(normalised), x_new, to_numpy(weight))
            for name, actual, wanted in zip(("dx", "dweight", "dbias"), outputs[1:], expected):
                assert_close(actual, wanted, rtol=1e-9, atol=1e-11, name=name)


def test_gpu_strided_running_statistics_are_updated_in_place(xp, rng):
    """Running statistics that are strided views (columns of one buffer) are updated where they live."""
    x = rng.standard_normal((6, 4, 5, 5))
    buffer = np.stack([rng.standard_normal(4), rng.uniform(0.5, 2.0, 4)], axis=1)  # (4, 2)
    expected_mean, expected_var = buffer[:, 0].copy(), buffer[:, 1].copy()
    batch_norm_forward_training(x, None, None, expected_mean, expected_var)
    device_buffer = xp.array(buffer, copy=True)
    batch_norm_forward_training(xp.asarray(x), None, None, device_buffer[:, 0], device_buffer[:, 1])
    assert_close(device_buffer[:, 0], expected_mean, name="running_mean")
    assert_close(device_buffer[:, 1], expected_var, name="running_var")


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1, 1), (1, 2, 1)])
def test_one_value_per_channel_is_an_error_in_training_only(xp, shape):
    x = xp.ones(shape)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        batch_norm_forward_training(x, None, None, None, None)
    batch_norm_forward_inference(x, None, None, xp.zeros(shape[1]), xp.ones(shape[1]))


def test_argument_errors(xp):
    x, c3 = xp.ones((2, 3, 2)), xp.ones(3)
    train = batch_norm_forward_training
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        train(xp.ones((2, 3), dtype=xp.int64), None, None, None, None)
    with pytest.raises(ValueError, match=r"x must be at least 2-D \(N, C, \*spatial\), got shape \(3,\)"):
        train(xp.ones(3), None, None, None, None)
    with pytest.raises(ValueError, match=r"weight must have shape \(C,\) = \(3,\).*got \(4,\)"):
        train(x, xp.ones(4), None, None, None)
    with pytest.raises(ValueError, match=r"bias must have shape \(C,\) = \(3,\)"):
        train(x, c3, xp.ones((3, 1)), None, None)
    with pytest.raises(TypeError, match="weight must have x's dtype float64, got float32"):
        train(x, xp.ones(3, dtype=xp.float32), None, None, None)
    with pytest.raises(ValueError, match="running_mean and running_var must both be arrays or both be None"):
        train(x, None, None, c3, None)
    with pytest.raises(ValueError, match=r"running_var must have shape \(C,\) = \(3,\)"):
        train(x, None, None, c3, xp.ones(2))
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\], got 1.5"):
        train(x, None, None, None, None, momentum=1.5)
    with pytest.raises(TypeError, match="momentum must be a real number, got None"):
        train(x, None, None, None, None, momentum=None)
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got 0.0"):
        train(x, None, None, None, None, eps=0.0)
    with pytest.raises(TypeError, match="running_mean must be a \\(3,\\) array, got None"):
        batch_norm_forward_inference(x, None, None, None, c3)
    with pytest.raises(ValueError, match=r"dy must have x's shape \(2, 3, 2\), got \(2, 3\)"):
        batch_norm_backward_training(xp.ones((2, 3)), x, None, c3, c3)
    with pytest.raises(TypeError, match="dy must have x's dtype float64, got float32"):
        batch_norm_backward_training(xp.ones((2, 3, 2), dtype=xp.float32), x, None, c3, c3)
    with pytest.raises(ValueError, match=r"invstd must have shape \(C,\) = \(3,\)"):
        batch_norm_backward_training(x, x, None, c3, xp.ones(2))
    with pytest.raises(ValueError, match=r"running_var must have shape \(C,\) = \(3,\)"):
        batch_norm_backward_inference(x, x, None, c3, xp.ones(5))
    with pytest.raises(TypeError, match="relu must be a bool, got 1"):
        train(x, None, None, None, None, relu=1)
    with pytest.raises(TypeError, match="relu must be a bool, got None"):
        batch_norm_forward_inference(x, None, None, c3, c3, relu=None)
    with pytest.raises(ValueError, match=r"relu_output must have x's shape \(2, 3, 2\), got \(2, 3\)"):
        batch_norm_backward_training(x, x, None, c3, c3, relu_output=xp.ones((2, 3)))
    with pytest.raises(TypeError, match="relu_output must have x's dtype float64, got float32"):
        batch_norm_backward_inference(x, x, None, c3, c3, relu_output=xp.ones((2, 3, 2), dtype=xp.float32))
    with pytest.raises(TypeError, match="relu_output must be a float32 or float64 array"):
        batch_norm_backward_training(x, x, None, c3, c3, relu_output=[1.0])


# ----------------------------------------------------------------------------------------------
# Optional cross-check with PyTorch
# ----------------------------------------------------------------------------------------------
def test_matches_torch(xp, rng):
    torch = pytest.importorskip("torch")
    x, weight, bias, running_mean, running_var = random_inputs(rng, (3, 4, 5, 2))
    dy = rng.standard_normal(x.shape)
    rm, rv = on(xp, running_mean, running_var)
    y, mean, invstd = batch_norm_forward_training(*on(xp, x, weight, bias), rm, rv, momentum=0.25)
    dx, dweight, dbias = batch_norm_backward_training(*on(xp, dy, x, weight), mean, invstd)

    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, weight, bias))
    trm, trv = torch.tensor(running_mean), torch.tensor(running_var)
    ty = torch.nn.functional.batch_norm(tx, trm, trv, tw, tb, training=True, momentum=0.25, eps=EPS)
    ty.backward(torch.tensor(dy))
    assert_close(y, ty.detach().numpy(), name="y")
    assert_close(rm, trm.numpy(), name="running_mean")
    assert_close(rv, trv.numpy(), name="running_var")
    for name, ours, theirs in (("dx", dx, tx), ("dweight", dweight, tw), ("dbias", dbias, tb)):
        assert_close(ours, theirs.grad.numpy(), rtol=1e-9, atol=1e-11, name=name)

    tx.grad = None
    ty = torch.nn.functional.batch_norm(tx, trm, trv, tw, tb, training=False, eps=EPS)
    ty.backward(torch.tensor(dy))
    assert_close(batch_norm_forward_inference(*on(xp, x, weight, bias), rm, rv), ty.detach().numpy(), name="y")
    dx = batch_norm_backward_inference(*on(xp, dy, x, weight), rm, rv)[0]
    assert_close(dx, tx.grad.numpy(), name="dx inference")


# ----------------------------------------------------------------------------------------------
# Half precision: x, dy, relu_output, y and dx in float16 / bfloat16, the vectors float32
# ----------------------------------------------------------------------------------------------
HALF_SHAPES = [(6, 3), (3, 4, 5, 7), (2, 5, 33, 3)]  # the last: several blocks per channel on the GPU
# S a multiple of 8: the GPU kernels' 16-byte packs (batchnorm.cu's Pack); of 4 but not 8: their 8-byte packs.
# The last two have several blocks per channel, and run on the GPU only.
HALF_PACKED_SHAPES = [(3, 4, 4, 6), (3, 4, 4, 5), (8, 3, 64, 40), (16, 3, 28, 25)]


def _half_arrays(xp, rng, shape, name, relu):
    """(x half, weight, bias, running_mean, running_var float32 on xp, x's exact float64 values)."""
    from minidnn.primitives import convert  # noqa: PLC0415

    x, weight, bias, running_mean, running_var = random_inputs(rng, shape, dtype=np.float32)
    stored = convert.float_to_half(xp.asarray(x), name)
    return (stored, *on(xp, weight, bias, running_mean, running_var),
            to_numpy(convert.half_to_float(stored, name)).astype(np.float64))


def _assert_half_close(got, exact, scale, name, label):
    """got (half storage) within one rounding of exact (relative, or below the smallest normal half the
    subnormal step) plus 2⁻¹⁶ of ``scale``: the float32 arithmetic of the twin (the GPU's is double) is far
    inside that."""
    from tests.helpers import HALF_SUBNORMAL_ROUNDOFF, HALF_UNIT_ROUNDOFF, half_values  # noqa: PLC0415

    values = half_values(got, name)
    bound = HALF_UNIT_ROUNDOFF[name] * np.abs(exact) + HALF_SUBNORMAL_ROUNDOFF[name] + 2.0 ** -16 * scale
    worst = np.unravel_index(np.argmax(np.abs(values - exact) - bound), exact.shape)
    assert np.all(np.abs(values - exact) <= bound), f"{label}: {values[worst]} against {exact[worst]} at {worst}"


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", HALF_SHAPES + HALF_PACKED_SHAPES)
@pytest.mark.parametrize("relu", [False, True])
def test_half_precision_training_against_float64(xp, rng, name, shape, relu):
    if xp is np and shape in HALF_PACKED_SHAPES[2:]:
        pytest.skip("the GPU's packs over several blocks per channel (the float64 reference takes a minute here)")
    _check_half_training(xp, rng, name, shape, relu)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("relu", [False, True])
def test_gpu_half_packs_in_long_blocks_against_float64(rng, monkeypatch, name, relu):
    """One block per channel (a large minimum of values per block), so that each thread takes four packs
    per step and then a tail: the reductions' main loop, which the default split reaches only for channels
    of over a million values."""
    from minidnn import backend  # noqa: PLC0415
    from minidnn.primitives import _cuda  # noqa: PLC0415

    monkeypatch.setattr(_cuda, "MIN_VALUES_PER_BLOCK", 1 << 20)
    _check_half_training(backend.cupy(), rng, name, (4, 3, 40, 48), relu)


@pytest.mark.gpu
def test_gpu_pack_width_follows_the_plane_and_the_alignment():
    """16-byte packs (8 half words, 4 floats, 2 doubles) where every array is 16-byte aligned and, for batch
    norm, the plane S is a multiple of the pack (S = 1 included: a pack would cross channels); single
    elements otherwise."""
    from minidnn import backend  # noqa: PLC0415
    from minidnn.primitives import _cuda  # noqa: PLC0415

    cupy = backend.cupy()
    words, floats, doubles = (cupy.zeros(4 * 48, dtype) for dtype in (np.uint16, np.float32, np.float64))
    assert [_cuda.elements_per_access((a,), plane=48) for a in (words, floats, doubles)] == [8, 4, 2]
    assert _cuda.elements_per_access((words,), plane=20) == 1 and _cuda.elements_per_access((floats,), plane=20) == 4
    assert _cuda.elements_per_access((floats,), plane=1) == 1 and _cuda.elements_per_access((floats,)) == 4
    assert _cuda.elements_per_access((words, words[4:]), plane=48) == 1  # a view 8 bytes in
    assert _cuda.elements_per_access((words, words[8:], None), plane=48) == 8  # 16 bytes in
    assert _cuda.elements_per_access((words[3:],)) == 1 and _cuda.pack_build("relu_forward", 8) == "relu_forward_vector"


def test_pack_build_is_the_widest_that_fits_the_plane_and_the_alignment():
    """16-byte packs where the plane S is a multiple of the pack and every array starts on 16 bytes, else
    8-byte packs on the same terms (a 14 x 14 plane of half words), else single elements; doubles have no
    8-byte build of more than one element. Stand-in arrays: only their item size and address are read."""
    from types import SimpleNamespace  # noqa: PLC0415

    from minidnn.primitives import batchnorm  # noqa: PLC0415

    def array(itemsize, address=4096):
        return SimpleNamespace(itemsize=itemsize, data=SimpleNamespace(ptr=address))

    words, floats, doubles = array(2), array(4), array(8)
    assert batchnorm._packing((words, words), 48) == ("_vector", 8)
    assert batchnorm._packing((words, None), 196) == ("_vector8", 4)
    assert batchnorm._packing((words,), 49) == ("", 1)
    assert batchnorm._packing((words, array(2, 4096 + 8)), 48) == ("_vector8", 4)  # a view 8 bytes in
    assert batchnorm._packing((words, array(2, 4096 + 4)), 48) == ("", 1)
    assert batchnorm._packing((floats,), 462) == ("_vector8", 2)
    assert batchnorm._packing((doubles,), 462) == ("_vector", 2)
    assert batchnorm._packing((doubles,), 49) == ("", 1)


def test_channels_last_launch_spans_128_bytes_of_a_row_and_one_wave():
    """batchnorm._rows_packing and _rows_split: a reduction block's columns span 128 bytes of a row (at most 32
    packs), so a channel block holds 64 bfloat16 channels or 32 float32 ones; the splits fill one wave of the blocks
    the GPU holds at once (here 3 an SM, or 2, of 132 SMs) and no more, each of at least 8 passes of rows; the
    element-wise row kernels take 8 packs a thread (_element_count), plane kernels one. Stand-in arrays: only their
    item size and address are read."""
    from types import SimpleNamespace  # noqa: PLC0415

    from minidnn.primitives import batchnorm  # noqa: PLC0415

    words, floats = (SimpleNamespace(itemsize=size, data=SimpleNamespace(ptr=4096)) for size in (2, 4))
    assert batchnorm._rows_packing((words, words), 256) == ("_last_vector", 8, 8)
    assert batchnorm._rows_packing((floats,), 256) == ("_last_vector", 4, 8)  # 64 packs of 4 floats a row
    assert batchnorm._rows_packing((words,), 12) == ("_last", 1, 12)  # 12 single words: one block
    wave, two_an_sm = 3 * 132, 2 * 132
    # ResNet-18's layer3 at batch 128: 32 packs a row in 4 channel blocks of 8, 98 splits of 8 passes (99 would fit).
    assert batchnorm._rows_split(256, 25088, 8, 8, wave) == ((4, 98), 256)
    assert batchnorm._rows_split(256, 25088, 4, 8, wave) == ((8, 49), 512)  # 8 channel blocks: 49 of them a wave
    assert batchnorm._rows_split(520, 18, 8, 8, wave) == ((9, 1), 18)  # the last channel block one pack
    assert batchnorm._rows_split(12, 30, 1, 12, wave) == ((1, 1), 30)
    # The stem: bfloat16 in one channel block, float32 in two, a wave of 3 or of 2 blocks an SM.
    assert batchnorm._rows_split(64, 1605632, 8, 8, wave) == ((1, 396), 4055)
    assert batchnorm._rows_split(64, 1605632, 4, 8, two_an_sm) == ((2, 132), 12164)
    assert batchnorm._element_count(True, 100) == 13 and batchnorm._element_count(False, 100) == 100


def test_reduction_split_within_a_number_of_blocks():
    """_cuda.reduction_split with ``blocks``: channels x splits never above it (one split a channel at least), every
    value in one split, no split empty."""
    from minidnn.primitives import _cuda  # noqa: PLC0415

    for channels, values, minimum, blocks in ((4, 25088, 256, 396), (1, 1605632, 256, 396), (7, 1000, 10, 50),
                                              (600, 5000, 1, 396), (3, 0, 1, 396)):
        splits, per = _cuda.reduction_split(channels, values, minimum, blocks=blocks)
        assert channels * splits <= max(blocks, channels)
        assert (splits - 1) * per < max(values, 1) <= splits * per
    assert _cuda.reduction_split(7, 1000, 10, blocks=50) == (7, 143)  # 50 // 7 = 7 splits


def test_resident_blocks_is_the_occupancy_count_times_the_sms(monkeypatch):
    """_cuda.resident_blocks: the driver's blocks an SM for the kernel's function and the block size, times the SMs
    (at least one block an SM); a RawKernel-like object is asked for its function. Stand-in driver and device."""
    from types import SimpleNamespace  # noqa: PLC0415

    from minidnn.primitives import _cuda  # noqa: PLC0415

    asked = []

    def occupancy(function, threads, dynamic_shared_bytes):
        asked.append((function, threads, dynamic_shared_bytes))
        return {1111: 3, 2222: 2, 3333: 0}[function]

    cupy = SimpleNamespace(cuda=SimpleNamespace(driver=SimpleNamespace(
        occupancyMaxActiveBlocksPerMultiprocessor=occupancy)))
    monkeypatch.setattr(_cuda.backend, "cupy", lambda: cupy)
    monkeypatch.setattr(_cuda, "current_device", lambda: 7)
    monkeypatch.setattr(_cuda, "_sm_count_of", lambda device: {7: 132}[device])
    monkeypatch.setattr(_cuda, "_resident_blocks_of", _cuda._resident_blocks_of.__wrapped__)  # no cache across tests
    assert _cuda.resident_blocks(SimpleNamespace(ptr=1111), 256) == 396
    assert _cuda.resident_blocks(SimpleNamespace(kernel=SimpleNamespace(ptr=2222)), 128) == 264
    assert _cuda.resident_blocks(SimpleNamespace(ptr=3333), 1024) == 132  # none fits: counted as one an SM
    assert asked == [(1111, 256, 0), (2222, 128, 0), (3333, 1024, 0)]


def _check_half_training(xp, rng, name, shape, relu):
    x, weight, bias, running_mean, running_var, exact_x = _half_arrays(xp, rng, shape, name, relu)
    start_mean, start_var = to_numpy(running_mean).copy(), to_numpy(running_var).copy()
    y, mean, invstd = batch_norm_forward_training(x, weight, bias, running_mean, running_var, 0.1, EPS, relu=relu)
    assert y.dtype == x.dtype and mean.dtype == invstd.dtype == np.float32
    means, variances, count = reference_statistics(exact_x)
    exact_y = reference_normalise(exact_x, to_numpy(weight), to_numpy(bias), means, variances)
    terms = np.abs(exact_y) + np.abs(to_numpy(bias)).reshape((1, -1) + (1,) * (len(shape) - 2))
    _assert_half_close(y, np.maximum(exact_y, 0) if relu else exact_y, terms, name, "y")
    np.testing.assert_allclose(to_numpy(mean), means, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(to_numpy(invstd), 1 / np.sqrt(np.array(variances) + EPS), rtol=1e-6)
    np.testing.assert_allclose(to_numpy(running_mean), 0.9 * start_mean + 0.1 * np.array(means), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(to_numpy(running_var), 0.9 * start_var + 0.1 * np.array(variances) * count / (count - 1),
                               rtol=1e-6)

    from minidnn.primitives import convert  # noqa: PLC0415

    dy = convert.float_to_half(xp.asarray(rng.standard_normal(shape).astype(np.float32)), name)
    exact_dy = to_numpy(convert.half_to_float(dy, name)).astype(np.float64)
    if relu:  # the fused ReLU's gradient mask is the rounded y's, as the backward sees it
        exact_dy = exact_dy * (to_numpy(convert.half_to_float(y, name)) > 0)
    dx, dweight, dbias = batch_norm_backward_training(dy, x, weight, mean, invstd, relu_output=y if relu else None)
    assert dx.dtype == x.dtype and dweight.dtype == dbias.dtype == np.float32
    exact_dx, exact_dweight, exact_dbias = reference_backward_training(exact_dy, exact_x, to_numpy(weight))
    sigma = np.sqrt(np.array(variances) + EPS).reshape((1, -1) + (1,) * (len(shape) - 2))
    # dx subtracts two per-channel terms from dy·w/σ: the arithmetic's error scales with their sizes
    scale = to_numpy(weight).reshape(sigma.shape) / sigma * (np.abs(exact_dy) + np.abs(exact_dbias).reshape(sigma.shape)
                                                             / count + np.abs(exact_dweight).reshape(sigma.shape) / count
                                                             * np.abs(reference_normalise(exact_x, None, None, means,
                                                                                          variances)))
    _assert_half_close(dx, exact_dx, scale, name, "dx")
    np.testing.assert_allclose(to_numpy(dbias), exact_dbias, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(dweight), exact_dweight, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("relu", [False, True])
def test_half_precision_inference_against_float64(xp, rng, name, relu):
    from minidnn.primitives import convert  # noqa: PLC0415

    shape = (3, 4, 5, 7)
    x, weight, bias, running_mean, running_var, exact_x = _half_arrays(xp, rng, shape, name, relu)
    y = batch_norm_forward_inference(x, weight, bias, running_mean, running_var, EPS, relu=relu)
    rm, rv = to_numpy(running_mean), to_numpy(running_var)
    exact_y = reference_normalise(exact_x, to_numpy(weight), to_numpy(bias), list(rm), list(rv))
    _assert_half_close(y, np.maximum(exact_y, 0) if relu else exact_y, np.abs(exact_y) + 1, name, "y")
    dy = convert.float_to_half(xp.asarray(rng.standard_normal(shape).astype(np.float32)), name)
    exact_dy = to_numpy(convert.half_to_float(dy, name)).astype(np.float64)
    if relu:
        exact_dy = exact_dy * (to_numpy(convert.half_to_float(y, name)) > 0)
    dx, dweight, dbias = batch_norm_backward_inference(dy, x, weight, running_mean, running_var, EPS,
                                                       relu_output=y if relu else None)
    exact_dx, exact_dweight, exact_dbias = reference_backward_inference(exact_dy, exact_x, to_numpy(weight), rm, rv)
    _assert_half_close(dx, exact_dx, np.abs(exact_dx), name, "dx")
    np.testing.assert_allclose(to_numpy(dweight), exact_dweight, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(dbias), exact_dbias, rtol=1e-5, atol=1e-5)


def test_half_precision_needs_float32_vectors_and_the_naive_engine_refuses_it(xp, rng):
    from minidnn.naive import plain  # noqa: PLC0415
    from minidnn.primitives import convert  # noqa: PLC0415

    x = convert.float_to_half(xp.asarray(rng.standard_normal((4, 3, 2)).astype(np.float32)), "bfloat16")
    with pytest.raises(TypeError, match="weight must have dtype float32 for .* x"):
        batch_norm_forward_training(x, xp.ones(3, dtype=np.float64), None, None, None)
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        plain.batch_norm_forward_training(x, None, None, None, None)


def test_a_kept_launch_packs_one_pair_per_set_of_scalars(monkeypatch):
    """Layers of one shape share a kept launch, and a ResNet block's two batch norms differ in relu: each set of
    scalars gets its own packed pair on its first kept call, later calls reuse it, and each call hands its arrays over
    in the kernels' order. Run on the CPU with stand-ins for CuPy's allocation and for PackedLaunch."""
    from types import SimpleNamespace  # noqa: PLC0415

    from minidnn import backend  # noqa: PLC0415
    from minidnn.primitives import _cuda, batchnorm  # noqa: PLC0415

    made, launched = [], []

    class Recorded:
        def __init__(self, kernel, grid, block, arguments, shared_bytes=0):
            self.kernel, self.arguments = kernel, arguments
            made.append(self)

        def __call__(self, *arrays):
            launched.append((self, arrays))

    monkeypatch.setattr(backend, "cupy", lambda: SimpleNamespace(empty=np.empty))
    monkeypatch.setattr(_cuda, "PackedLaunch", Recorded)
    monkeypatch.setattr(_cuda, "grid_stride_blocks", lambda count, threads=_cuda.THREADS: 1)
    i32 = _cuda.i32
    launch = batchnorm._Launch("reduce", "elementwise", (3, 2), i32(4), (i32(2), i32(3), i32(5)), (), 30, False, 3,
                               np.dtype(np.float32), (i32(3), i32(5), i32(30)), "counters", 21, 18,
                               scratch="scratch", coef="coef", packed={})
    x, weight, bias, mean_stat, var_stat, count = (np.zeros(s, np.float32) for s in ((2, 3, 5), 3, 3, 3, 3, 1))
    pairs = []
    for relu in (False, True, False, True):
        launched.clear()
        y, mean, invstd = batchnorm._run_forward_training(launch, x, weight, bias, mean_stat, var_stat, 0.1, 1e-5,
                                                          relu, count)
        (reduce, reduce_arrays), (elementwise, elementwise_arrays) = launched
        assert reduce.kernel == "reduce" and elementwise.kernel == "elementwise"
        assert [a is b for a, b in zip(reduce_arrays, (x, weight, mean_stat, var_stat, mean, invstd, count))] == [True] * 7
        assert elementwise_arrays[1] is y and elementwise_arrays[2] is bias
        assert elementwise.arguments[4] == i32(relu)  # the packed relu is the call's
        pairs.append((reduce, elementwise))
    assert len(made) == 4 and pairs[0] == pairs[2] and pairs[1] == pairs[3] and pairs[0] != pairs[1]
    assert set(launch.packed) == {(1e-5, 0.1, False), (1e-5, 0.1, True)}

    dy = np.zeros_like(x)
    for _ in range(2):
        launched.clear()
        dx, dweight, dbias = batchnorm._run_backward_training(launch, dy, x, weight, mean, invstd, None, bias)
        (reduce, reduce_arrays), (elementwise, elementwise_arrays) = launched
        expected = (dy, x, None, bias, mean, invstd, weight, dweight, dbias)
        assert [a is b for a, b in zip(reduce_arrays, expected)] == [True] * 9
        assert elementwise_arrays[3] is bias and elementwise_arrays[5] is dx
    assert len(made) == 6  # one backward pair, reused
