"""The naive (Caffe-style) engine computes what the primitives compute; the engine switch works."""
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import minidnn.nn as nn
from minidnn import naive
from minidnn import primitives as P
from tests.helpers import assert_close


def grads_on(engine, model, x, y):
    with minidnn.engine(engine):
        model.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
    return loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()}


def test_engines_agree_on_a_model_with_every_layer_type(rng):
    minidnn.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=2, padding=2), nn.ReLU(), nn.LocalResponseNorm(3, alpha=0.1, k=2.0),
        nn.MaxPool2d(3, 2, ceil_mode=True), nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.BatchNorm2d(8), nn.Tanh(),
        nn.AvgPool2d(2, padding=1, count_include_pad=False), nn.Conv2d(8, 6, 1, bias=False), nn.Sigmoid(),
        nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Dropout(0.3), nn.Linear(36, 5)).double()
    x = minidnn.tensor(rng.standard_normal((3, 3, 17, 15)))
    y = minidnn.tensor(np.array([0, 4, 2]))
    minidnn.manual_seed(1)
    loss, grads = grads_on("minidnn", model, x, y)
    minidnn.manual_seed(1)  # the same dropout mask: both engines draw from the counter-based generator
    naive_loss, naive_grads = grads_on("naive", model, x, y)
    assert naive_loss == pytest.approx(loss, rel=1e-12)
    for name in grads:
        np.testing.assert_allclose(naive_grads[name], grads[name], rtol=1e-9, atol=1e-12, err_msg=name)
    assert minidnn.get_engine() == "minidnn"


def test_set_engine_validates_and_switches_optimizers_too():
    with pytest.raises(ValueError, match="engine must be one of"):
        minidnn.set_engine("cudnn")
    p = minidnn.tensor([1.0, 2.0], requires_grad=True)
    optimizer = minidnn.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = minidnn.tensor([1.0, 1.0])
    with minidnn.engine("naive"):
        optimizer.step()
        optimizer.step()
    np.testing.assert_allclose(p.numpy(), [1.0 - 0.1 - 0.19, 2.0 - 0.1 - 0.19])


@pytest.mark.parametrize("case", [
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), ceil_mode=False, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=5),
])
def test_average_pooling_rules(xp, rng, case):
    x = xp.asarray(rng.standard_normal((2, 3, 9, 8)))
    y = P.avg_pool2d_forward(x, **case)
    assert_close(naive.avg_pool2d_forward(x, **case), y)
    dy = xp.asarray(rng.standard_normal(y.shape))
    assert_close(naive.avg_pool2d_backward(dy, x.shape, **case), P.avg_pool2d_backward(dy, x.shape, **case))


def test_max_pooling_indices_and_gradient(xp, rng):
    x = xp.asarray(rng.standard_normal((2, 3, 11, 9)))
    y, indices = P.max_pool2d_forward(x, 3, 2, 1, 2, True, return_indices=True)
    naive_y, naive_indices = naive.max_pool2d_forward(x, 3, 2, 1, 2, True)
    assert_close(naive_y, y)
    assert_close(naive_indices, indices)
    dy = xp.asarray(rng.standard_normal(y.shape))
    assert_close(naive.max_pool2d_backward(dy, indices, x.shape), P.max_pool2d_backward(dy, indices, x.shape))


def test_convolution_accumulates_filter_gradients(xp, rng):
    x, dy = xp.asarray(rng.standard_normal((3, 4, 7, 6))), xp.asarray(rng.standard_normal((3, 6, 4, 3)))
    args = ((6, 2, 3, 3), 2, 1, 1, 2)
    out = xp.ones((6, 2, 3, 3))
    naive.conv2d_backward_filter(x, dy, *args, out=out, accumulate=True)
    assert_close(out, 1 + P.conv2d_backward_filter(x, dy, *args, algo="reference"))
    w = xp.asarray(rng.standard_normal((6, 2, 3, 3)))
    assert_close(naive.conv2d_forward(x, w, 2, 1, 1, 2), P.conv2d_forward(x, w, 2, 1, 1, 2, algo="reference"))
    assert_close(naive.bias_backward(dy), P.bias_backward(dy))


def test_losses_with_weights_and_ignored_rows(xp, rng):
    logits = xp.asarray(rng.standard_normal((6, 4)))
    target = xp.asarray(np.array([0, 3, -100, 1, 1, 2]))
    weight = xp.asarray(rng.random(4) + 0.5)
    options = dict(weight=weight, ignore_index=-100, label_smoothing=0.2, reduction="mean")
    loss, log_probs = P.cross_entropy_forward(logits, target, **options)
    naive_loss, _ = naive.cross_entropy_forward(logits, target, **options)
    assert_close(naive_loss, loss)
    grad = xp.asarray(np.array(1.7))
    assert_close(naive.cross_entropy_backward(grad, log_probs, target, **options),
                 P.cross_entropy_backward(grad, log_probs, target, **options))
    assert_close(naive.nll_loss_forward(log_probs, target, weight, reduction="sum"),
                 P.nll_loss_forward(log_probs, target, weight, reduction="sum"))
