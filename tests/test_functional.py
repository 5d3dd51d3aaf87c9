"""minidnn.functional: finite-difference gradients of every differentiable function (float64),
PyTorch semantics where torch is installed, and argument errors."""
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
from tests.helpers import gradcheck


def test_conv2d_gradients(rng):
    x, w, b = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((6, 2, 3, 2)), rng.standard_normal(6)
    gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), x, w, b)


def test_conv2d_without_bias_and_same_padding(rng):
    x, w = rng.standard_normal((1, 3, 5, 6)), rng.standard_normal((2, 3, 3, 5))
    y = F.conv2d(minidnn.tensor(x), minidnn.tensor(w), padding="same")
    assert y.shape == (1, 2, 5, 6)
    gradcheck(lambda x, w: F.conv2d(x, w, padding="valid"), x, w)


def test_linear_gradients(rng):
    gradcheck(F.linear, rng.standard_normal((3, 2, 5)), rng.standard_normal((4, 5)), rng.standard_normal(4))


@pytest.mark.parametrize("function", [
    lambda x: F.max_pool2d(x, 3, 2, 1),
    lambda x: F.max_pool2d(x, (2, 3), ceil_mode=True),
    lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
    F.relu, F.sigmoid, F.tanh,
    lambda x: F.softmax(x, 1), lambda x: F.log_softmax(x, -1),
    lambda x: F.local_response_norm(x, 3, alpha=0.3, beta=0.75, k=2.0),
    lambda x: F.flatten(x, 1) * 2.0,
])
def test_gradients_of_pointwise_pooling_and_normalisation(function, rng):
    gradcheck(function, rng.standard_normal((2, 4, 7, 6)))


def test_batch_norm_training_and_inference_gradients(rng):
    x, weight, bias = rng.standard_normal((3, 4, 5, 2)), rng.random(4) + 0.5, rng.standard_normal(4)
    gradcheck(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, weight, bias)
    mean, var = minidnn.tensor(rng.standard_normal(4)), minidnn.tensor(rng.random(4) + 0.5)
    gradcheck(lambda x, w, b: F.batch_norm(x, mean, var, w, b, training=False), x, weight, bias)


def test_batch_norm_updates_running_statistics(rng):
    x = rng.standard_normal((6, 3, 4, 4)) * 2 + 1
    mean, var = minidnn.zeros(3, dtype=minidnn.float64), minidnn.ones(3, dtype=minidnn.float64)
    F.batch_norm(minidnn.tensor(x), mean, var, training=True, momentum=0.25)
    np.testing.assert_allclose(mean.numpy(), 0.25 * x.mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(var.numpy(), 0.75 + 0.25 * x.var(axis=(0, 2, 3), ddof=1))


def test_losses_gradients(rng):
    logits = rng.standard_normal((5, 4))
    target = minidnn.tensor(np.array([0, 3, 1, 1, 2]))
    weight = minidnn.tensor(rng.random(4) + 0.5)
    gradcheck(lambda x: F.cross_entropy(x, target), logits)
    gradcheck(lambda x: F.cross_entropy(x, target, weight=weight, label_smoothing=0.2, reduction="sum"), logits)
    gradcheck(lambda x: F.nll_loss(F.log_softmax(x, 1), target, reduction="none"), logits)
    gradcheck(lambda x, y: F.mse_loss(x, y), logits, rng.standard_normal((5, 4)))


def test_cross_entropy_on_spatial_inputs(rng):
    logits = rng.standard_normal((2, 3, 4, 5))
    target = minidnn.tensor(rng.integers(0, 3, (2, 4, 5)))
    gradcheck(lambda x: F.cross_entropy(x, target), logits)
    per_pixel = F.cross_entropy(minidnn.tensor(logits), target, reduction="none")
    assert per_pixel.shape == (2, 4, 5)


def test_dropout_is_reproducible_and_differentiable(rng):
    x = rng.standard_normal((4, 6))

    def fixed_mask_dropout(t):
        minidnn.manual_seed(11)
        return F.dropout(t, 0.4)

    gradcheck(fixed_mask_dropout, x)
    t = minidnn.tensor(x)
    assert F.dropout(t, 0.4, training=False) is t
    minidnn.manual_seed(5)
    first, second = F.dropout(t, 0.5), F.dropout(t, 0.5)
    assert not np.array_equal(first.numpy(), second.numpy())  # the counter advanced
    minidnn.manual_seed(5)
    np.testing.assert_array_equal(F.dropout(t, 0.5).numpy(), first.numpy())


def test_functional_errors():
    x = minidnn.zeros(1, 3, 5, 5)
    with pytest.raises(TypeError, match="input must be a minidnn Tensor"):
        F.conv2d(np.zeros((1, 3, 5, 5)), minidnn.zeros(2, 3, 3, 3))
    with pytest.raises(ValueError, match="bias must have shape"):
        F.conv2d(x, minidnn.zeros(2, 3, 3, 3), minidnn.zeros(3))
    with pytest.raises(ValueError, match="padding must be"):
        F.conv2d(x, minidnn.zeros(2, 3, 3, 3), padding="full")
    with pytest.raises(TypeError, match="class indices"):
        F.cross_entropy(minidnn.zeros(2, 3), minidnn.zeros(2))
    with pytest.raises(ValueError, match="target shape"):
        F.cross_entropy(minidnn.zeros(2, 3), minidnn.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="dropout: probability p must be in"):
        F.dropout(x, 1.5)
    with pytest.raises(ValueError, match="running_mean must have shape"):
        F.batch_norm(x, minidnn.zeros(2), minidnn.ones(2), training=True)
    with pytest.raises(TypeError, match="dim must be an int"):
        F.softmax(x, None)


def test_matches_pytorch_forward_and_backward(rng):
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x = rng.standard_normal((2, 6, 9, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    target = rng.integers(0, 4, 2)

    def pipeline(lib, f, x, w):
        y = f.conv2d(x, w, None, 2, 1, 1, 2)
        y = f.local_response_norm(f.relu(y), 3, 1e-2, 0.75, 2.0)
        y = f.max_pool2d(y, 3, 2, 1, ceil_mode=True)
        y = f.adaptive_avg_pool2d(y, 1).flatten(1)
        return f.cross_entropy(y, lib(target), label_smoothing=0.1)

    ours_x, ours_w = minidnn.tensor(x, requires_grad=True), minidnn.tensor(w, requires_grad=True)
    theirs_x, theirs_w = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ours = pipeline(minidnn.tensor, F, ours_x, ours_w)
    theirs = pipeline(torch.tensor, tf, theirs_x, theirs_w)
    ours.backward()
    theirs.backward()
    np.testing.assert_allclose(ours.item(), theirs.item(), rtol=1e-12)
    np.testing.assert_allclose(ours_x.grad.numpy(), theirs_x.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours_w.grad.numpy(), theirs_w.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_fused_batch_norm_relu_and_add_relu_equal_their_compositions_and_gradients(rng):
    x, weight, bias = rng.standard_normal((3, 4, 5, 2)), rng.standard_normal(4), rng.standard_normal(4)
    mean, var = minidnn.tensor(rng.standard_normal(4)), minidnn.tensor(rng.random(4) + 0.5)
    for training in (True, False):
        stats = (None, None) if training else (mean, var)
        fused = F.batch_norm(minidnn.tensor(x), *stats, minidnn.tensor(weight), minidnn.tensor(bias), training=training,
                             relu=True)
        plain = F.relu(F.batch_norm(minidnn.tensor(x), *stats, minidnn.tensor(weight), minidnn.tensor(bias),
                                    training=training))
        np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=1e-12, atol=1e-12)
        gradcheck(lambda x, w, b: F.batch_norm(x, *stats, w, b, training=training, relu=True), x, weight, bias)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    np.testing.assert_array_equal(F.add_relu(minidnn.tensor(a), minidnn.tensor(b)).numpy(), np.maximum(a + b, 0))
    gradcheck(F.add_relu, a, b)


@pytest.mark.parametrize("pad", [(1, 2), (0, 0, 2, 1, 3, 0), (-1, 2, 0, -2), (2, -3, 1, 1, 0, 1, 1, 0)])
def test_pad_gradients_and_pytorch_semantics(pad, rng):
    """F.pad's constant mode: finite-difference gradients (float64), PyTorch's values (widths from the last axis
    back, negative widths cropping, the fill value) when torch is installed."""
    x = rng.standard_normal((2, 3, 5, 4))
    gradcheck(lambda x: F.pad(x, pad) * 1.5, x)
    torch = pytest.importorskip("torch")
    for value in (None, -2.5):
        ours = F.pad(minidnn.tensor(x), pad, value=value).numpy()
        theirs = torch.nn.functional.pad(torch.tensor(x), pad, value=0.0 if value is None else value).numpy()
        np.testing.assert_array_equal(ours, theirs)


def test_pad_on_the_device_matches_numpy(xp, rng):
    """The GPU's F.pad and its gradient equal NumPy's bit for bit (float32, a zero-channel pad as CIFAR ResNets'
    option-A shortcut makes it, after a strided subsampling)."""
    x = rng.standard_normal((3, 4, 7, 6)).astype(np.float32)
    g = rng.standard_normal((3, 10, 4, 3)).astype(np.float32)
    results = []
    for device in ("cpu", "cpu" if xp is np else "cuda"):
        t = minidnn.tensor(x, device=device, requires_grad=True)
        y = F.pad(t[:, :, ::2, ::2], (0, 0, 0, 0, 3, 3))
        y.backward(minidnn.tensor(g, device=device))
        results.append((y.numpy(), t.grad.numpy()))
    expected = np.zeros((3, 4, 7, 6), np.float32)
    expected[:, :, ::2, ::2] = g[:, 3:7]
    np.testing.assert_array_equal(results[0][1], expected)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_pad_errors():
    x = minidnn.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="mode must be 'constant'"):
        F.pad(x, (1, 1), mode="reflect")
    with pytest.raises(ValueError, match="pad must be a tuple of ints"):
        F.pad(x, (1, 1, 1))
    with pytest.raises(ValueError, match="pad must be a tuple of ints"):
        F.pad(x, (1, 1) * 4)
    with pytest.raises(ValueError, match="pad must be a tuple of ints"):
        F.pad(x, (1.0, 1))
    with pytest.raises(ValueError, match="negative size"):
        F.pad(x, (-3, -2))
    with pytest.raises(TypeError, match="value must be a number"):
        F.pad(x, (1, 1), value="0")
    with pytest.raises(TypeError, match="input must be a minidnn Tensor"):
        F.pad(np.zeros(3), (1, 1))


def test_basic_indexing_gradient_keeps_the_sign_of_zero_and_advanced_indexing_adds_repeats():
    """A basic index's gradient is copied into place (each element reached once; -0.0 stays -0.0, as PyTorch's
    slice backward keeps it), an advanced index's repeated positions add up."""
    x = minidnn.tensor(np.zeros((3, 4)), requires_grad=True)
    x[1:, ::2].backward(minidnn.tensor(np.full((2, 2), -0.0)))
    assert np.signbit(x.grad.numpy()[1:, ::2]).all() and not np.signbit(x.grad.numpy()[0]).any()
    x = minidnn.tensor(np.zeros(4), requires_grad=True)
    x[np.array([1, 1, 3])].backward(minidnn.tensor(np.array([1.0, 2.0, 4.0])))
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 3.0, 0.0, 4.0])
