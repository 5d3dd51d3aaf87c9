"""Half-precision tensors and autocast: bfloat16 storage bit for bit as ml_dtypes, casts and their gradients,
the float32 widening of operations without half kernels, conv2d/linear/matmul under autocast held to a
float64 reference by the half-precision bound (tests/helpers.py), gradients reaching float32 master weights
against PyTorch in float64, the region's rules, and float16 loss scaling that recovers and skips."""
from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
from minidnn import nn
from tests.helpers import assert_within_half_bound, to_numpy

HALF_DTYPES = {"bfloat16": minidnn.bfloat16, "float16": minidnn.float16}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=sorted(HALF_DTYPES))
def half(request):
    return request.param


def _reference_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(np.float16)


def _rounded(values: np.ndarray, name: str) -> np.ndarray:
    """float32 ``values`` rounded to the half type by ml_dtypes / NumPy (the independent rounding), as float64."""
    return values.astype(np.float32).astype(_reference_dtype(name)).astype(np.float64)


def _values(tensor: minidnn.Tensor) -> np.ndarray:
    return tensor.float().numpy().astype(np.float64)


# ----------------------------------------------------------------------------------------------
# Storage and casts
# ----------------------------------------------------------------------------------------------
def test_bfloat16_is_ml_dtypes_and_a_tensor_dtype():
    assert minidnn.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    t = minidnn.zeros(2, 3, dtype=minidnn.bfloat16)
    assert t.dtype == minidnn.bfloat16 and t.is_floating_point() and "bfloat16" in repr(t)
    with pytest.raises(TypeError, match="not supported"):
        minidnn.tensor([1, 2], dtype=np.uint16)


def test_half_tensors_round_as_the_reference_and_keep_their_bits_across_devices(device, half, rng):
    specials = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 65504.0, 65520.0, 3.4e38, -np.inf, np.nan, 1e-40,
                         2.0 ** -25], dtype=np.float32)  # ties of bfloat16, float16's largest, overflow, subnormals
    values = np.concatenate([specials, rng.standard_normal(37).astype(np.float32)])
    with np.errstate(over="ignore"):  # float16's overflow to infinity is the rounding under test
        expected = values.astype(_reference_dtype(half))
    t = minidnn.tensor(values, device=device).to(HALF_DTYPES[half])
    assert t.dtype == HALF_DTYPES[half] and t.device.type == device
    np.testing.assert_array_equal(t.numpy().view(np.uint16), expected.view(np.uint16))
    made_here = minidnn.tensor(values, dtype=HALF_DTYPES[half], device=device)
    np.testing.assert_array_equal(made_here.numpy().view(np.uint16), expected.view(np.uint16))
    back = t.cpu().to(device)
    np.testing.assert_array_equal(back.numpy().view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(t.float().numpy(), expected.astype(np.float32))  # widening is exact
    full = minidnn.full((3,), 1.01171875, dtype=HALF_DTYPES[half], device=device)
    np.testing.assert_array_equal(full.numpy().view(np.uint16),
                                  np.full(3, 1.01171875, np.float32).astype(_reference_dtype(half)).view(np.uint16))


def test_a_cast_carries_the_gradient_back_in_the_source_type(device, half, rng):
    weights = rng.standard_normal(23).astype(np.float32)
    x = minidnn.tensor(rng.standard_normal(23).astype(np.float32), device=device, requires_grad=True)
    h = x.to(HALF_DTYPES[half])
    (h.float() * minidnn.tensor(weights, device=device)).sum().backward()
    assert x.grad.dtype == np.float32
    # d/dh of h.float()·w is w, rounded to the half type on its way through h, then widened exactly.
    np.testing.assert_array_equal(x.grad.numpy(), _rounded(weights, half).astype(np.float32))


def test_operations_without_half_kernels_widen_to_float32(device, half, rng):
    values = rng.standard_normal((4, 5)).astype(np.float32)
    h = minidnn.tensor(values, device=device).to(HALF_DTYPES[half])
    exact = _rounded(values, half).astype(np.float32)
    result = h.relu() + 1.0
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result.numpy(), np.maximum(exact, 0) + 1.0)
    np.testing.assert_array_equal((h > 0).numpy(), exact > 0)
    np.testing.assert_array_equal(h.argmax(dim=1).numpy(), exact.argmax(axis=1))
    np.testing.assert_array_equal(h.max(dim=0).indices.numpy(), exact.argmax(axis=0))
    with pytest.raises(TypeError, match="out-of-place"):
        h.mul_(2.0)
    h.fill_(1.01171875)
    np.testing.assert_array_equal(h.numpy().view(np.uint16),
                                  np.full((4, 5), 1.01171875, np.float32).astype(_reference_dtype(half)).view(np.uint16))


def test_two_gradients_of_one_half_tensor_are_summed_in_its_type(device, half, rng):
    a, b = (rng.standard_normal(31).astype(np.float32) for _ in range(2))
    x = minidnn.tensor(rng.standard_normal(31).astype(np.float32), device=device, requires_grad=True)
    h = x.to(HALF_DTYPES[half])
    ((h * minidnn.tensor(a, device=device)).sum() + (h * minidnn.tensor(b, device=device)).sum()).backward()
    # Each use widens h (its own cast node), whose backward rounds a and b; h's node sums the two in float32
    # and rounds once; x's cast widens the sum exactly.
    expected = _rounded((_rounded(a, half) + _rounded(b, half)).astype(np.float32), half)
    np.testing.assert_array_equal(x.grad.numpy(), expected.astype(np.float32))


# ----------------------------------------------------------------------------------------------
# The half-precision list under autocast, against float64
# ----------------------------------------------------------------------------------------------
def _conv_float64(x: np.ndarray, w: np.ndarray, padding: int) -> np.ndarray:
    """Direct cross-correlation in float64 (stride 1): an independent reference."""
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, w.shape[2:], axis=(2, 3))  # N, C, P, Q, R, S
    return np.einsum("ncpqrs,kcrs->nkpq", windows, w)


def _conv_weight_gradient_float64(x: np.ndarray, dy: np.ndarray, padding: int) -> np.ndarray:
    """The weight gradient of :func:`_conv_float64` for the output gradient dy (stride 1), in float64."""
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    R, S = padded.shape[2] - dy.shape[2] + 1, padded.shape[3] - dy.shape[3] + 1
    windows = np.lib.stride_tricks.sliding_window_view(padded, (R, S), axis=(2, 3))  # N, C, P, Q, R, S
    return np.einsum("ncpqrs,nkpq->kcrs", windows, dy)


def test_autocast_conv2d_runs_in_the_half_type_within_its_bound(device, half, rng):
    x = minidnn.tensor(rng.standard_normal((3, 5, 9, 7)).astype(np.float32), device=device)
    w = minidnn.tensor(rng.standard_normal((6, 5, 3, 3)).astype(np.float32), device=device)
    b = minidnn.tensor(rng.standard_normal(6).astype(np.float32), device=device)
    with minidnn.autocast(device, dtype=HALF_DTYPES[half]):
        y = F.conv2d(x, w, padding=1)
        y_bias = F.conv2d(x, w, b, padding=1)
    assert y.dtype == HALF_DTYPES[half] and y_bias.dtype == HALF_DTYPES[half]
    xs, ws = _rounded(x.numpy(), half), _rounded(w.numpy(), half)
    exact = _conv_float64(xs, ws, 1)
    magnitude = _conv_float64(np.abs(xs), np.abs(ws), 1)
    assert_within_half_bound(y.data, exact, magnitude, half, 5 * 3 * 3, "conv2d under autocast")
    # The bias is added to the rounded product in float32 and rounded once more.
    with_bias = _values(y) + _rounded(b.numpy(), half)[None, :, None, None]
    np.testing.assert_array_equal(_values(y_bias), _rounded(with_bias.astype(np.float32), half))


def test_autocast_linear_and_matmul_run_in_the_half_type_within_their_bound(device, half, rng):
    x = minidnn.tensor(rng.standard_normal((7, 19)).astype(np.float32), device=device)
    w = minidnn.tensor(rng.standard_normal((5, 19)).astype(np.float32), device=device)
    a3 = minidnn.tensor(rng.standard_normal((3, 7, 19)).astype(np.float32), device=device)
    b3 = minidnn.tensor(rng.standard_normal((3, 19, 4)).astype(np.float32), device=device)
    with minidnn.autocast(device, dtype=HALF_DTYPES[half]):
        y = F.linear(x, w)
        product = x @ w.T
        batched = a3 @ b3
    xs, ws = _rounded(x.numpy(), half), _rounded(w.numpy(), half)
    for got in (y, product):
        assert got.dtype == HALF_DTYPES[half]
        assert_within_half_bound(got.data, xs @ ws.T, np.abs(xs) @ np.abs(ws).T, half, 19, "linear / matmul")
    a3s, b3s = _rounded(a3.numpy(), half), _rounded(b3.numpy(), half)
    assert_within_half_bound(batched.data, a3s @ b3s, np.abs(a3s) @ np.abs(b3s), half, 19, "batched matmul")


def test_autocast_gradients_reach_float32_master_weights_as_pytorch_float64(device, half, rng):
    """conv -> batch norm -> ReLU -> linear -> cross-entropy under autocast, against PyTorch in float64 with
    the half type's roundings where autocast puts them: each operand of a half-precision operation, its
    output, and (since a half operation's gradients are half too) each gradient crossing those casts, but the
    bfloat16 convolution's weight gradient, which reaches the float32 weight unrounded. The
    parameters' gradients are float32 and within 4 units of the half type's roundoff of the largest.

    (Against plain float64 the gradients differ far more, up to a quarter of the largest in bfloat16: batch
    norm's backward cancels, and what is left is dominated by the roundings.)"""
    torch = pytest.importorskip("torch")
    half_torch = getattr(torch, half)

    class RoundTrip(torch.autograd.Function):  # a cast to the half type and back: forward and gradient rounded
        @staticmethod
        def forward(ctx, x):
            return x.to(half_torch).to(torch.float64)

        @staticmethod
        def backward(ctx, grad):
            return grad.to(half_torch).to(torch.float64)

    class RoundForward(torch.autograd.Function):  # the cast alone: the gradient as it comes
        @staticmethod
        def forward(ctx, x):
            return x.to(half_torch).to(torch.float64)

        @staticmethod
        def backward(ctx, grad):
            return grad

    rounded = RoundTrip.apply
    # A bfloat16 convolution's weight gradient reaches the float32 weight unrounded (its float32 sum).
    weight_cast = RoundForward.apply if half == "bfloat16" else rounded
    minidnn.manual_seed(int(rng.integers(2**31)))  # the weights, reproducibly (not the suite's RNG state)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 5)).to(device)
    images = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
    labels = rng.integers(0, 5, 4)
    with minidnn.autocast(device, dtype=HALF_DTYPES[half]):
        loss = F.cross_entropy(model(minidnn.tensor(images, device=device)), minidnn.tensor(labels, device=device))
    assert loss.dtype == np.float32
    loss.backward()
    params = [to_numpy(p.data).astype(np.float64) for p in model.parameters()]
    conv_w, gamma, beta, fc_w, fc_b = [torch.tensor(p, requires_grad=True) for p in params]
    h = rounded(torch.nn.functional.conv2d(rounded(torch.tensor(images, dtype=torch.float64)), weight_cast(conv_w),
                                           padding=1))
    h = torch.relu(torch.nn.functional.batch_norm(h, None, None, gamma, beta, training=True))
    logits = rounded(torch.nn.functional.linear(rounded(h.flatten(1)), rounded(fc_w), rounded(fc_b)))
    reference = torch.nn.functional.cross_entropy(logits, torch.tensor(labels))
    reference.backward()
    u = 2.0 ** -8 if half == "bfloat16" else 2.0 ** -11
    assert abs(loss.item() - reference.item()) < 4 * u * abs(reference.item())
    for p, exact in zip(model.parameters(), (conv_w, gamma, beta, fc_w, fc_b)):
        assert p.grad.dtype == np.float32
        expected = exact.grad.numpy()
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=0, atol=4 * u * np.abs(expected).max())


def test_a_bfloat16_convolution_hands_its_weight_gradient_to_the_float32_weight_unrounded(device, half, rng):
    """Under autocast the weight reaches the convolution as a cast of the float32 weight. In bfloat16 the
    convolution's float32 sum goes to the float32 weight as it is (one rounding and one conversion fewer); in
    float16 it is rounded to float16 as the cast's gradient, so that a loss scaler sees its overflows."""
    x = minidnn.tensor(rng.standard_normal((3, 8, 9, 7)).astype(np.float32), device=device)
    w = minidnn.tensor(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), device=device, requires_grad=True)
    dy = rng.standard_normal((3, 16, 9, 7)).astype(np.float32)
    with minidnn.autocast(device, dtype=HALF_DTYPES[half]):
        y = F.conv2d(x, w, padding=1)
    (y.float() * minidnn.tensor(dy, device=device)).sum().backward()
    assert w.grad.dtype == np.float32
    # y.float()'s gradient is rounded to the half type on its way back
    exact = _conv_weight_gradient_float64(_rounded(x.numpy(), half), _rounded(dy, half), 1)
    got = w.grad.numpy().astype(np.float64)
    if half == "bfloat16":  # float32 sums of 189 exact products: far inside a hundredth of one bfloat16 rounding
        assert np.max(np.abs(got - exact)) < 2.0 ** -8 / 100 * np.max(np.abs(exact))
    else:
        np.testing.assert_array_equal(got, _rounded(got, half))  # every element a float16 value
        assert np.max(np.abs(got - exact)) <= 2.0 ** -11 * np.max(np.abs(exact))


def test_a_cast_weight_used_twice_sums_a_float32_gradient_and_a_half_one(device, rng):
    """One bfloat16 cast feeding a convolution (whose weight gradient comes back float32) and an element-wise
    use (whose gradient comes back bfloat16): the cast's node sums the two in float32."""
    x = minidnn.tensor(rng.standard_normal((2, 8, 6, 5)).astype(np.float32), device=device).to(minidnn.bfloat16)
    w = minidnn.tensor(rng.standard_normal((4, 8, 3, 3)).astype(np.float32), device=device, requires_grad=True)
    c = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
    h = w.to(minidnn.bfloat16)
    loss = F.conv2d(x, h).float().sum() + (h.float() * minidnn.tensor(c, device=device)).sum()
    loss.backward()
    ones = np.ones((2, 4, 4, 3))  # the gradient F.conv2d(x, h).float().sum() sends back
    exact = _conv_weight_gradient_float64(_values(x), ones, 0) + _rounded(c, "bfloat16")  # the conv's, the rounded c
    assert w.grad.dtype == np.float32
    assert np.max(np.abs(w.grad.numpy() - exact)) < 2.0 ** -8 / 100 * np.max(np.abs(exact))


# ----------------------------------------------------------------------------------------------
# The region's rules
# ----------------------------------------------------------------------------------------------
def test_autocast_casts_only_its_own_device_and_only_float32_or_half(rng):
    x, w = minidnn.randn(2, 4), minidnn.randn(3, 4)
    with minidnn.autocast("cuda", dtype=minidnn.bfloat16):  # CPU tensors are not its business
        assert minidnn.is_autocast_enabled("cuda") and not minidnn.is_autocast_enabled("cpu")
        assert F.linear(x, w).dtype == np.float32
    with minidnn.autocast("cpu"):  # PyTorch's default on the CPU: bfloat16
        assert minidnn.get_autocast_dtype("cpu") == minidnn.bfloat16
        assert F.linear(x, w).dtype == minidnn.bfloat16
        assert F.linear(x.double(), w.double()).dtype == np.float64
        assert F.linear(x.half(), w).dtype == minidnn.bfloat16  # the other half type is cast too
        assert F.softmax(F.linear(x, w), dim=1).dtype == np.float32  # off the list: float32
    assert minidnn.get_autocast_dtype("cpu") is None


def test_autocast_regions_nest_switch_off_and_decorate():
    x, w = minidnn.randn(2, 4), minidnn.randn(3, 4)
    with minidnn.autocast("cpu", dtype=minidnn.float16):
        with minidnn.autocast("cpu", enabled=False):
            assert F.linear(x, w).dtype == np.float32
        with minidnn.autocast("cpu", dtype=minidnn.bfloat16):
            assert F.linear(x, w).dtype == minidnn.bfloat16
        assert F.linear(x, w).dtype == np.float16

    @minidnn.amp.autocast("cpu", dtype=minidnn.float16)
    def forward():
        return F.linear(x, w)

    assert forward().dtype == np.float16 and not minidnn.is_autocast_enabled("cpu")


@pytest.mark.parametrize("arguments, error, match", [
    (dict(device_type="tpu"), ValueError, "device_type must be 'cuda' or 'cpu'"),
    (dict(device_type="cpu", dtype=np.float32), TypeError, "dtype must be minidnn.bfloat16 or minidnn.float16"),
    (dict(device_type="cpu", enabled=1), TypeError, "enabled must be a bool"),
])
def test_bad_autocast_arguments_are_clear_errors(arguments, error, match):
    with pytest.raises(error, match=match):
        minidnn.autocast(**arguments)


# ----------------------------------------------------------------------------------------------
# float16 with loss scaling
# ----------------------------------------------------------------------------------------------
def _float16_run(device: str, init_scale: float, steps: int, rng) -> tuple[list[float], minidnn.amp.GradScaler, nn.Module]:
    minidnn.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    optimizer = minidnn.optim.SGD(model.parameters(), lr=0.1)
    scaler = minidnn.amp.GradScaler(device, init_scale=init_scale, growth_interval=1)
    inputs = minidnn.tensor(rng.standard_normal((32, 8)).astype(np.float32), device=device)
    labels = minidnn.tensor(rng.integers(0, 3, 32), device=device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        with minidnn.autocast(device, dtype=minidnn.float16):
            loss = F.cross_entropy(model(inputs), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses, scaler, model


def test_float16_with_a_tiny_initial_scale_recovers(device, rng):
    # At 2^-30 every scaled gradient flushes to zero in float16: the steps run on zero gradients while the
    # scale doubles each step, until it is large enough for the gradients to show and the loss to fall.
    losses, scaler, _ = _float16_run(device, 2.0 ** -30, 60, rng)
    assert scaler.get_scale() >= 2.0 ** 20
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the overflow under test
def test_float16_with_an_overflowing_scale_skips_the_step(device, rng):
    # At 2^40 the scaled loss's gradients overflow float16: the step is skipped (the weights stay) and the
    # scale halves.
    minidnn.manual_seed(0)
    _, scaler, model = _float16_run(device, 2.0 ** 40, 1, rng)
    minidnn.manual_seed(0)
    untouched = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    for p, q in zip(model.parameters(), untouched.parameters()):
        np.testing.assert_array_equal(p.numpy() if device == "cpu" else p.cpu().numpy(), q.numpy())
    assert scaler.get_scale() == 2.0 ** 39


def test_a_residual_network_keeps_its_activations_in_the_half_type(rng):
    """Batch norm (with its fused ReLU), the residual add's ReLU, ReLU and max pooling take half tensors, so
    under autocast a ResNet's activations stay half from the first convolution to the last block; the
    parameters' gradients are float32."""
    import models  # noqa: PLC0415

    minidnn.manual_seed(int(rng.integers(2**31)))
    model = models.create("resnet18", num_classes=5)
    seen = {}
    for name in ("maxpool", "layer1", "layer2", "layer4", "avgpool"):
        getattr(model, name).register_forward_hook(lambda module, inputs, output, name=name: seen.update({name: output.dtype}))
    images = minidnn.tensor(rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
    with minidnn.autocast("cpu", dtype=minidnn.bfloat16):
        loss = F.cross_entropy(model(images), minidnn.tensor([1, 3]))
    assert seen == {name: minidnn.bfloat16 for name in ("maxpool", "layer1", "layer2", "layer4", "avgpool")}
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == np.float32 for p in model.parameters())


def test_an_in_place_relu_after_a_half_convolution(rng):
    """CaffeNet's pattern, conv then ReLU(inplace=True), under autocast: the ReLU writes the half tensor."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 2))
    with minidnn.autocast("cpu", dtype=minidnn.float16):
        out = model(minidnn.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32)))
    assert out.dtype == np.float16
    out.float().sum().backward()
    assert model[0].weight.grad.dtype == np.float32 and np.isfinite(model[0].weight.grad.numpy()).all()


def test_a_disabled_region_leaves_the_operations_fast_path(monkeypatch):
    """train.py enters a disabled region every step of a float32 run: the operations on the list must then
    not even look at their tensors' devices."""
    from minidnn import autocast_mode  # noqa: PLC0415

    x = minidnn.randn(2, 4)
    monkeypatch.setattr(minidnn.Tensor, "device", property(lambda self: pytest.fail("the device was asked for")))
    monkeypatch.setattr(autocast_mode.backend, "is_cuda_array", lambda array: pytest.fail("the device was asked for"))
    with minidnn.autocast("cpu", enabled=False):
        assert autocast_mode.lower_precision(x, None) == (x, None)


def test_max_pooling_hands_the_engine_half_arrays_and_its_gradient_back_half(monkeypatch, half, rng):
    """Max pooling has half kernels (pooling.cu's half build): the graph passes the half tensor itself, not a
    float32 widening, and its backward gets and returns the half type."""
    from minidnn import primitives  # noqa: PLC0415

    seen = []
    for name in ("max_pool2d_forward", "max_pool2d_backward"):
        real = getattr(primitives, name)
        monkeypatch.setattr(primitives, name, lambda first, *args, real=real, name=name, **kwargs: (
            seen.append((name, first.dtype)), real(first, *args, **kwargs))[1])
    x = minidnn.tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32), requires_grad=True)
    y = F.max_pool2d(x.to(HALF_DTYPES[half]), 3, 2, 1)
    assert y.dtype == HALF_DTYPES[half]
    y.float().sum().backward()
    dtype = np.dtype(HALF_DTYPES[half])
    assert seen == [("max_pool2d_forward", dtype), ("max_pool2d_backward", dtype)]
    assert x.grad.dtype == np.float32


def test_average_pooling_and_dropout_keep_half_tensors_half_with_one_rounding(device, half, rng):
    """Average pooling and dropout of a half tensor: the float32 result on its exact values, rounded once."""
    values = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    h = minidnn.tensor(values, device=device).to(HALF_DTYPES[half])
    exact = h.float()
    for name, call in (("avg_pool2d", lambda t: F.avg_pool2d(t, 2)),
                       ("adaptive_avg_pool2d", lambda t: F.adaptive_avg_pool2d(t, 1))):
        got = call(h)
        assert got.dtype == HALF_DTYPES[half], name
        np.testing.assert_array_equal(got.numpy().view(np.uint16),
                                      call(exact).numpy().astype(_reference_dtype(half)).view(np.uint16), err_msg=name)
    state = minidnn.get_rng_state()
    dropped = F.dropout(h, 0.3)
    minidnn.set_rng_state(state)
    reference = F.dropout(exact, 0.3)  # the same mask from the same counter stream
    assert dropped.dtype == HALF_DTYPES[half]
    np.testing.assert_array_equal(dropped.numpy().view(np.uint16),
                                  reference.numpy().astype(_reference_dtype(half)).view(np.uint16))


def test_add_relu_widens_a_half_tensor_beside_a_float32_one(rng):
    """A residual whose shortcut stayed float32 (a block entered from an operation that widened): the sum is
    taken in float32, as autocast's promotion does."""
    a32, b32 = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(2))
    half = minidnn.tensor(a32).bfloat16()
    out = F.add_relu(half, minidnn.tensor(b32))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.numpy(), np.maximum(half.float().numpy() + b32, 0))


def test_importing_minidnn_leaves_ml_dtypes_for_the_first_bfloat16():
    """ml_dtypes' import takes most of a second, which every process (train.py, a data-loader worker, a rank)
    would pay with ``import minidnn``: minidnn imports it when bfloat16 is first asked for (and builds
    F(7×7, 5×5)'s Winograd transforms when first read, another tenth of a second)."""
    code = ("import sys, minidnn; assert 'ml_dtypes' not in sys.modules, 'imported with minidnn'; "
            "from minidnn.primitives.conv import winograd; "
            "assert winograd.TRANSFORMS[7, 5]._matrices is None, 'F(7x7, 5x5) built at import'; "
            "t = minidnn.tensor([1.5]).to(minidnn.bfloat16); assert 'ml_dtypes' in sys.modules; print(t.dtype)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "bfloat16"
