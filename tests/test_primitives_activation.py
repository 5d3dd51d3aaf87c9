"""ReLU, sigmoid, tanh, leaky ReLU, SiLU and GELU primitives against math-module references, finite
differences and PyTorch."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from minidnn.primitives.activation import (add_relu_forward, gelu_backward, gelu_forward, leaky_relu_backward,
                                           leaky_relu_forward, relu_backward, relu_forward, sigmoid_backward,
                                           sigmoid_forward, silu_backward, silu_forward, tanh_backward, tanh_forward)
from tests.helpers import FD_TOLERANCE, float32_tolerance, assert_close, numerical_gradient, to_numpy


SHAPES = [(1,), (7,), (1, 3, 5, 7), (2, 3, 5)]


def elementwise(function, array: np.ndarray) -> np.ndarray:
    """Apply a float -> float function to every element, in float64, with a plain loop."""
    return np.array([function(float(v)) for v in array.ravel()], dtype=np.float64).reshape(array.shape)


# Independent float64 references: the value and the derivative as functions of x (not of y).
def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


REFERENCES = {
    "relu": (lambda v: v if v > 0 else 0.0, lambda v: 1.0 if v > 0 else 0.0),
    "sigmoid": (_sigmoid, lambda v: math.exp(-abs(v)) / (1.0 + math.exp(-abs(v))) ** 2),
    "tanh": (math.tanh, lambda v: 1.0 / math.cosh(v) ** 2),
}
PRIMITIVES = {
    "relu": (relu_forward, relu_backward),
    "sigmoid": (sigmoid_forward, sigmoid_backward),
    "tanh": (tanh_forward, tanh_backward),
}
NAMES = list(PRIMITIVES)


def draw_input(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Normal draws kept at least 0.05 away from 0, so ReLU's kink never lies within a finite-difference step."""
    x = rng.standard_normal(shape) * 2
    return np.where(np.abs(x) < 0.05, np.copysign(0.05, x) + x, x)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward_match_reference_float64(xp, rng, name, shape):
    forward, backward = PRIMITIVES[name]
    value, derivative = REFERENCES[name]
    x, dy = draw_input(rng, shape), rng.standard_normal(shape)
    y = forward(xp.asarray(x))
    assert y.dtype == xp.float64
    assert_close(y, elementwise(value, x), rtol=1e-13, atol=1e-15, name=f"{name} forward")
    dx = backward(xp.asarray(dy), y)
    assert dx.dtype == xp.float64
    assert_close(dx, dy * elementwise(derivative, x), rtol=1e-12, atol=1e-15, name=f"{name} backward")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(1, 3, 2), (2, 5)])
def test_backward_matches_finite_differences(xp, rng, name, shape):
    forward, backward = PRIMITIVES[name]
    x, dy = draw_input(rng, shape), rng.standard_normal(shape)
    expected = numerical_gradient(forward, [x], 0, dy)
    dx = backward(xp.asarray(dy), forward(xp.asarray(x)))
    assert_close(dx, expected, **FD_TOLERANCE, name=f"{name} finite differences")


@pytest.mark.parametrize("name", NAMES)
def test_float32_matches_float64_reference(xp, rng, name):
    forward, backward = PRIMITIVES[name]
    value, derivative = REFERENCES[name]
    x = draw_input(rng, (3, 4, 5)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y = forward(xp.asarray(x))
    dx = backward(xp.asarray(dy), y)
    assert y.dtype == xp.float32 and dx.dtype == xp.float32
    x64 = x.astype(np.float64)
    assert_close(y, elementwise(value, x64), **float32_tolerance(xp, rtol=1e-6, atol=1e-7),
                 name=f"{name} float32 forward")
    assert_close(dx, dy.astype(np.float64) * elementwise(derivative, x64), rtol=1e-5, atol=1e-6,
                 name=f"{name} float32 backward")


def test_relu_gradient_at_zero_is_zero(xp):
    x = xp.asarray(np.array([-1.0, 0.0, -0.0, 2.0]))
    dx = relu_backward(xp.ones(4), relu_forward(x))
    assert_close(dx, np.array([0.0, 0.0, 0.0, 1.0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_and_tanh_saturate_without_overflow_warnings(xp, dtype):
    x = xp.asarray(np.array([-1e4, -800.0, -50.0, 0.0, 50.0, 800.0, 1e4], dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow RuntimeWarning would fail the test
        y = sigmoid_forward(x)
        t = tanh_forward(x)
    y, t = to_numpy(y), to_numpy(t)
    assert y.dtype == dtype and np.all(np.isfinite(y)) and np.all(np.isfinite(t))
    np.testing.assert_array_equal(y[[0, 1, 3, 5, 6]], np.array([0.0, 0.0, 0.5, 1.0, 1.0], dtype=dtype))
    assert 0 < y[2] < 1e-20  # e^-50 ≈ 2e-22: small but not flushed to 0 in either dtype
    np.testing.assert_array_equal(t[[0, 6]], np.array([-1.0, 1.0], dtype=dtype))


@pytest.mark.parametrize("name", NAMES)
def test_errors_name_the_argument(xp, name):
    forward, backward = PRIMITIVES[name]
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        forward(xp.arange(4))
    with pytest.raises(ValueError, match=r"dy and y must have the same shape, got \(2, 3\) and \(3, 2\)"):
        backward(xp.ones((2, 3)), xp.ones((3, 2)))
    with pytest.raises(TypeError, match="dy and y must have the same dtype"):
        backward(xp.ones(3, dtype=xp.float32), xp.ones(3))
    with pytest.raises(TypeError, match="dy must be a float32 or float64 array"):
        backward(xp.ones(3, dtype=xp.int32), xp.ones(3))


# ----------------------------------------------------------------------------------------------
# ReLU into a given out (in place), and the residual add fused with its ReLU
# ----------------------------------------------------------------------------------------------
def poisoned(xp, shape, dtype=np.float64):
    """An output buffer full of NaN, so that any element a kernel fails to write shows."""
    return xp.full(shape, np.nan, dtype=dtype)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (2, 3, 5)])
def test_relu_forward_into_out_and_in_place(xp, rng, shape):
    x = draw_input(rng, shape)
    expected = elementwise(REFERENCES["relu"][0], x)
    out = poisoned(xp, shape)
    assert relu_forward(xp.asarray(x), out=out) is out
    assert_close(out, expected, rtol=0, atol=0, name="out")
    x_dev = xp.array(x, copy=True)
    assert relu_forward(x_dev, out=x_dev) is x_dev
    assert_close(x_dev, expected, rtol=0, atol=0, name="in place")


def add_relu_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """max(a + b, 0) element by element in Python floats (a NaN sum stays NaN)."""
    return np.array([s if s > 0 or math.isnan(s) else 0.0 for s in (float(u) + float(v) for u, v in
                     zip(a.ravel(), b.ravel()))], dtype=np.float64).reshape(a.shape)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (1, 3, 5, 7), (2, 3, 5)])
@pytest.mark.parametrize("into", ["new", "out", "a", "b"])
def test_add_relu_forward_matches_reference(xp, rng, shape, into):
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    if a.size > 2:
        a.flat[0], b.flat[1] = np.nan, -a.flat[1]  # NaN propagates; a sum of exactly 0 stays 0
    a_dev, b_dev = xp.array(a, copy=True), xp.array(b, copy=True)
    out = {"new": None, "out": poisoned(xp, shape), "a": a_dev, "b": b_dev}[into]
    y = add_relu_forward(a_dev, b_dev, out=out)
    assert y.dtype == xp.float64 and y.shape == shape
    if out is not None:
        assert y is out
    assert_close(y, add_relu_reference(a, b), rtol=0, atol=0, name="add_relu")
    for name, array, original in (("a", a_dev, a), ("b", b_dev, b)):
        if into != name:
            assert_close(array, original, rtol=0, atol=0, name=f"{name} unchanged")


def test_add_relu_float32_and_strided_inputs(xp, rng):
    a = rng.standard_normal((6, 10)).astype(np.float32)
    b = rng.standard_normal((10, 6)).astype(np.float32).T  # a transposed view: not contiguous
    y = add_relu_forward(xp.asarray(a), xp.asarray(b))
    assert y.dtype == xp.float32
    # float32 + float32 is exact in float64, so rounding that to float32 is the correctly rounded float32 sum.
    rounded_sum = (a.astype(np.float64) + b).astype(np.float32)
    assert_close(y, add_relu_reference(rounded_sum, np.zeros_like(a)), rtol=0, atol=0, name="float32")


@pytest.mark.parametrize("shape", [(1, 3, 2), (2, 5)])
def test_add_relu_gradient_is_relu_backward_for_both_inputs(xp, rng, shape):
    """relu_backward(dy, y) with y = add_relu_forward(a, b) is the gradient with respect to a and to b."""
    a, b, dy = draw_input(rng, shape), rng.standard_normal(shape), rng.standard_normal(shape)
    b = np.where(np.abs(a + b) < 0.05, b + 0.1, b)  # keep the sum off ReLU's kink
    grad = relu_backward(xp.asarray(dy), add_relu_forward(xp.asarray(a), xp.asarray(b)))
    for index in (0, 1):
        expected = numerical_gradient(add_relu_forward, [a, b], index, dy)
        assert_close(grad, expected, **FD_TOLERANCE, name=f"input {index}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["contiguous", "channels-last"])
def test_relu_backward_of_two_parts_is_the_mask_of_their_rounded_sum(xp, rng, dtype, layout):
    """relu_backward(dy, y, dy_other): dy + dy_other rounded to the dtype (the float64 sum of two float32 values is
    exact, so rounding it is the correctly rounded float32 sum), then 0 where y <= 0; the naive engine alike."""
    from minidnn.naive import relu_backward as naive_relu_backward  # noqa: PLC0415
    from minidnn.primitives import layout as layouts  # noqa: PLC0415

    shape = (3, 5, 4, 7)
    x, dy, dy_other = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    x.flat[:2] = 0.0  # ReLU's gradient at exactly 0
    expected = np.where(x > 0, (dy.astype(np.float64) + dy_other).astype(dtype), 0)
    arrays = [xp.asarray(v) for v in (dy, np.maximum(x, 0), dy_other)]
    if layout == "channels-last":
        arrays = [layouts.to_channels_last(a) for a in arrays]
    for backward in (relu_backward, naive_relu_backward):
        dx = backward(*arrays)
        assert dx.dtype == dtype
        assert_close(dx, expected, rtol=0, atol=0, name=f"{backward.__module__} of two parts")
    assert layouts.is_channels_last(relu_backward(*arrays)) == (layout == "channels-last")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("first_last", [True, False], ids=["channels-last first", "C-contiguous first"])
def test_mixed_layouts_give_the_first_operands_layout(xp, rng, dtype, first_last):
    """An input of each layout: the ReLU kernels' result is laid out as their first operand (x, a or dy), PyTorch's
    rule for element-wise results, on the GPU's flat kernels as in NumPy; the values are those of C-contiguous
    copies, against a float64 reference."""
    from minidnn.primitives import convert, layout  # noqa: PLC0415

    shape = (3, 6, 5, 4)
    values = [rng.standard_normal(shape) for _ in range(3)]
    device = [xp.asarray(v.astype(np.float32)) for v in values]
    if dtype != "float32":
        device = [convert.float_to_half(a, dtype) for a in device]
    wide = [to_numpy(convert.half_to_float(a, dtype)) if dtype != "float32" else to_numpy(a) for a in device]
    wide = [w.astype(np.float64) for w in wide]
    first, second, third = device
    first = layout.to_channels_last(first) if first_last else first
    second, third = (a if first_last else layout.to_channels_last(a) for a in (second, third))

    def rounded(v):  # a float64 result in the operands' type (the kernels round their float32 sums once)
        v = v.astype(np.float32)
        return v if dtype == "float32" else to_numpy(convert.half_to_float(convert.float_to_half(v, dtype), dtype))

    relu = np.maximum(wide[0], 0)
    cases = {"relu_forward": (relu_forward(first), relu),
             "add_relu_forward": (add_relu_forward(first, second), np.maximum(rounded(wide[0] + wide[1]), 0)),
             "relu_backward": (relu_backward(first, second), np.where(wide[1] > 0, wide[0], 0)),
             "relu_backward of two parts": (relu_backward(first, second, third),
                                            np.where(wide[1] > 0, rounded(wide[0] + wide[2]), 0))}
    for name, (result, expected) in cases.items():
        assert layout.is_channels_last(result) == first_last, name
        assert result.dtype == first.dtype, name
        values = convert.half_to_float(layout.contiguous(result), dtype) if dtype != "float32" else result
        np.testing.assert_allclose(to_numpy(values), expected, rtol=1e-6, atol=0, err_msg=name)


def test_relu_backward_of_two_parts_errors_name_the_argument(xp):
    from minidnn.naive import relu_backward as naive_relu_backward  # noqa: PLC0415

    dy = xp.ones((2, 3))
    for backward in (relu_backward, naive_relu_backward):
        with pytest.raises(TypeError, match="dy_other and dy must have the same dtype, got float32 and float64"):
            backward(dy, dy, xp.ones((2, 3), dtype=xp.float32))
        with pytest.raises(ValueError, match=r"dy_other must have dy's shape \(2, 3\), got \(3,\)"):
            backward(dy, dy, xp.ones(3))
        with pytest.raises(TypeError, match="dy_other must be a float32 or float64 array"):
            backward(dy, dy, xp.ones((2, 3), dtype=xp.int32))


def test_out_and_add_relu_errors(xp):
    x = xp.ones((2, 3))
    with pytest.raises(ValueError, match=r"out must have x's shape \(2, 3\), got \(3, 2\)"):
        relu_forward(x, out=xp.empty((3, 2)))
    with pytest.raises(TypeError, match="out and x must have the same dtype, got float32 and float64"):
        relu_forward(x, out=xp.empty((2, 3), dtype=xp.float32))
    with pytest.raises(ValueError, match="out must be a C-contiguous or channels-last array"):
        relu_forward(x, out=xp.empty((3, 2)).T)
    with pytest.raises(TypeError, match="out must be a float32 or float64 array"):
        relu_forward(x, out=xp.empty((2, 3), dtype=xp.int32))
    with pytest.raises(ValueError, match=r"b must have a's shape \(2, 3\), got \(3,\)"):
        add_relu_forward(x, xp.ones(3))
    with pytest.raises(TypeError, match="a and b must have the same dtype, got float64 and float32"):
        add_relu_forward(x, xp.ones((2, 3), dtype=xp.float32))
    with pytest.raises(TypeError, match="b must be a float32 or float64 array"):
        add_relu_forward(x, xp.ones((2, 3), dtype=xp.int64))
    with pytest.raises(ValueError, match="out must be a C-contiguous or channels-last array"):
        add_relu_forward(x, x, out=xp.empty((3, 2)).T)


@pytest.mark.gpu
def test_gpu_devices_of_out_must_match(rng):
    cupy = __import__("cupy")
    with pytest.raises(ValueError, match="expected all arrays on one device"):
        relu_forward(cupy.ones(3), out=np.empty(3))
    with pytest.raises(ValueError, match="expected all arrays on one device"):
        add_relu_forward(np.ones(3), cupy.ones(3))


def test_gpu_large_add_relu_matches_reference(xp, rng):
    """More elements than one pass of the GPU grid, a strided input, in place into a: every element written."""
    if xp is np:
        pytest.skip("the GPU grid-stride loop")
    a = rng.standard_normal(1_100_003)
    b = rng.standard_normal((1_100_003, 2))[:, 1]
    a_dev = xp.asarray(a)
    y = add_relu_forward(a_dev, xp.asarray(b), out=a_dev)
    assert y is a_dev
    assert_close(y, np.maximum(a + b, 0), rtol=0, atol=0, name="add_relu")
    out = poisoned(xp, a.shape)
    relu_forward(xp.asarray(b), out=out)
    assert_close(out, np.maximum(b, 0), rtol=0, atol=0, name="relu into out")


@pytest.mark.parametrize("name", NAMES)
def test_gpu_large_input_matches_numpy_twin(xp, rng, name):
    """More elements than one pass of the GPU grid (132·32·256 threads), not contiguous: the grid-stride
    loop covers every element."""
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    forward, backward = PRIMITIVES[name]
    x = (rng.standard_normal((1_100_003, 2)) * 4).astype(np.float32)[:, 0]
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y = forward(xp.asarray(x))
    y_twin = forward(x)
    assert_close(y, y_twin, rtol=1e-5, atol=1e-6, name=f"{name} forward")
    assert_close(backward(xp.asarray(dy), y), backward(dy, to_numpy(y)), rtol=1e-5, atol=1e-6, name=f"{name} backward")


@pytest.mark.parametrize("name", NAMES)
def test_matches_torch(xp, rng, name):
    torch = pytest.importorskip("torch")
    forward, backward = PRIMITIVES[name]
    x, dy = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    x[0, 0, 0, :2] = 0.0  # ReLU's gradient at exactly 0
    tx = torch.tensor(x, requires_grad=True)
    ty = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[name](tx)
    ty.backward(torch.tensor(dy))
    y = forward(xp.asarray(x))
    assert_close(y, ty.detach().numpy(), rtol=1e-12, atol=1e-15, name=f"{name} vs torch")
    assert_close(backward(xp.asarray(dy), y), tx.grad.numpy(), rtol=1e-12, atol=1e-15, name=f"{name} grad vs torch")


# ----------------------------------------------------------------------------------------------
# Leaky ReLU, SiLU and GELU: backward from x (leaky ReLU also from y when its slope is >= 0)
# ----------------------------------------------------------------------------------------------
def _phi(v: float) -> float:
    return math.exp(-v * v / 2) / math.sqrt(2 * math.pi)


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def _gelu_tanh_derivative(v: float) -> float:
    t = math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * v * v)


# name -> (forward(x), backward(dy, x), value(v), derivative(v), torch function name, torch kwargs)
MODERN = {
    "leaky_relu": (lambda x: leaky_relu_forward(x, 0.2), lambda dy, x: leaky_relu_backward(dy, x, 0.2),
                   lambda v: v if v > 0 else 0.2 * v, lambda v: 1.0 if v > 0 else 0.2, "leaky_relu",
                   {"negative_slope": 0.2}),
    "leaky_relu negative": (lambda x: leaky_relu_forward(x, -1.5), lambda dy, x: leaky_relu_backward(dy, x, -1.5),
                            lambda v: v if v > 0 else -1.5 * v, lambda v: 1.0 if v > 0 else -1.5, "leaky_relu",
                            {"negative_slope": -1.5}),
    "silu": (silu_forward, silu_backward, lambda v: v * _sigmoid(v),
             lambda v: _sigmoid(v) * (1 + v * (1 - _sigmoid(v))), "silu", {}),
    "gelu": (gelu_forward, gelu_backward, lambda v: v * (1 + math.erf(v / math.sqrt(2))) / 2,
             lambda v: (1 + math.erf(v / math.sqrt(2))) / 2 + v * _phi(v), "gelu", {}),
    "gelu tanh": (lambda x: gelu_forward(x, "tanh"), lambda dy, x: gelu_backward(dy, x, "tanh"), _gelu_tanh,
                  _gelu_tanh_derivative, "gelu", {"approximate": "tanh"}),
}
MODERN_NAMES = list(MODERN)


@pytest.mark.parametrize("name", MODERN_NAMES)
@pytest.mark.parametrize("shape", [(1,), (2, 3, 5), (1, 3, 5, 7)])
def test_modern_activations_match_reference_float64(xp, rng, name, shape):
    forward, backward, value, derivative, _, _ = MODERN[name]
    x, dy = draw_input(rng, shape), rng.standard_normal(shape)
    y = forward(xp.asarray(x))
    assert y.dtype == xp.float64 and y.shape == shape
    assert_close(y, elementwise(value, x), rtol=1e-13, atol=1e-15, name=f"{name} forward")
    dx = backward(xp.asarray(dy), xp.asarray(x))
    # Near a minimum of GELU or SiLU (x about -0.75 and -1.28) the derivative crosses zero: its relative error is
    # unbounded there, and its absolute error is a few ulps of the O(1) terms that cancel, times |dy|.
    cancelled = 16 * np.finfo(np.float64).eps * float(np.abs(dy).max())
    assert_close(dx, dy * elementwise(derivative, x), rtol=1e-12, atol=cancelled, name=f"{name} backward")


@pytest.mark.parametrize("name", MODERN_NAMES)
def test_modern_activations_backward_matches_finite_differences(xp, rng, name):
    forward, backward, *_ = MODERN[name]
    x, dy = draw_input(rng, (2, 5)), rng.standard_normal((2, 5))
    expected = numerical_gradient(forward, [x], 0, dy)
    assert_close(backward(xp.asarray(dy), xp.asarray(x)), expected, **FD_TOLERANCE, name=name)


@pytest.mark.parametrize("name", MODERN_NAMES)
def test_modern_activations_float32(xp, rng, name):
    forward, backward, value, derivative, _, _ = MODERN[name]
    x = draw_input(rng, (3, 4, 5)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y, dx = forward(xp.asarray(x)), backward(xp.asarray(dy), xp.asarray(x))
    assert y.dtype == xp.float32 and dx.dtype == xp.float32
    x64 = x.astype(np.float64)
    assert_close(y, elementwise(value, x64), **float32_tolerance(xp, rtol=2e-6, atol=1e-6), name=f"{name} forward")
    assert_close(dx, dy * elementwise(derivative, x64), **float32_tolerance(xp, rtol=2e-5, atol=2e-6),
                 name=f"{name} backward")


@pytest.mark.parametrize("name", MODERN_NAMES)
def test_modern_activations_match_torch(xp, rng, name):
    torch = pytest.importorskip("torch")
    forward, backward, _, _, function, kwargs = MODERN[name]
    x, dy = rng.standard_normal((2, 3, 4, 5)) * 3, rng.standard_normal((2, 3, 4, 5))
    x[0, 0, 0, :2] = 0.0  # leaky ReLU's gradient at exactly 0 is its slope
    tx = torch.tensor(x, requires_grad=True)
    getattr(torch.nn.functional, function)(tx, **kwargs).backward(torch.tensor(dy))
    y = forward(xp.asarray(x))
    ty = getattr(torch.nn.functional, function)(torch.tensor(x), **kwargs)
    assert_close(y, ty.numpy(), rtol=1e-12, atol=1e-15, name=f"{name} vs torch")
    assert_close(backward(xp.asarray(dy), xp.asarray(x)), tx.grad.numpy(), rtol=1e-12, atol=1e-14,
                 name=f"{name} grad vs torch")


@pytest.mark.parametrize("shape", [(), (7,), (2, 3, 5)])
def test_leaky_relu_and_silu_into_out_and_in_place_and_leaky_backward_from_y(xp, rng, shape):
    x, dy = draw_input(rng, shape), rng.standard_normal(shape)
    for forward, value in ((lambda a, out: leaky_relu_forward(a, 0.1, out=out), lambda v: v if v > 0 else 0.1 * v),
                           (lambda a, out: silu_forward(a, out=out), lambda v: v * _sigmoid(v))):
        expected = elementwise(value, x)
        out = poisoned(xp, shape)
        assert forward(xp.asarray(x), out) is out
        assert_close(out, expected, rtol=1e-15, atol=0, name="out")
        in_place = xp.array(x, copy=True)
        assert forward(in_place, in_place) is in_place
        assert_close(in_place, expected, rtol=1e-15, atol=0, name="in place")
    y = leaky_relu_forward(xp.asarray(x), 0.1)
    assert_close(leaky_relu_backward(xp.asarray(dy), y, 0.1), leaky_relu_backward(xp.asarray(dy), xp.asarray(x), 0.1),
                 rtol=0, atol=0, name="leaky backward from y")


def test_silu_and_gelu_do_not_overflow(xp):
    x = xp.asarray(np.array([-1e4, -800.0, -40.0, 0.0, 40.0, 800.0, 1e4]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = [to_numpy(f(x)) for f in (silu_forward, gelu_forward, lambda a: gelu_forward(a, "tanh"))]
        grads = [to_numpy(f(xp.ones(7), x)) for f in (silu_backward, gelu_backward,
                                                      lambda dy, a: gelu_backward(dy, a, "tanh"))]
    for y in values:
        np.testing.assert_array_equal(y[[0, 1, 3, 5, 6]], [-0.0, -0.0, 0.0, 800.0, 1e4])
    for dx in grads:
        np.testing.assert_array_equal(dx[[0, 1, 5, 6]], [0.0, 0.0, 1.0, 1.0])


def test_modern_activation_errors_name_the_argument(xp):
    x = xp.ones((2, 3))
    with pytest.raises(TypeError, match="negative_slope must be a real number"):
        leaky_relu_forward(x, "0.1")
    with pytest.raises(ValueError, match="negative_slope must be a finite number"):
        leaky_relu_backward(x, x, float("nan"))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        gelu_forward(x, "erf")
    with pytest.raises(ValueError, match=r"dy and x must have the same shape, got \(2, 3\) and \(3, 2\)"):
        silu_backward(x, xp.ones((3, 2)))
    with pytest.raises(TypeError, match="dy and x must have the same dtype"):
        gelu_backward(x, x.astype(xp.float32))
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        silu_forward(xp.arange(3))
    with pytest.raises(ValueError, match="out must be a C-contiguous or channels-last array"):
        leaky_relu_forward(x, out=xp.empty((3, 2)).T)


@pytest.mark.parametrize("name", MODERN_NAMES)
def test_gpu_modern_activations_large_input_match_numpy_twin(xp, rng, name):
    """More elements than one pass of the GPU grid, not contiguous: every element computed as the twin does."""
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    forward, backward, *_ = MODERN[name]
    x = (rng.standard_normal((1_100_003, 2)) * 4).astype(np.float32)[:, 0]
    dy = rng.standard_normal(x.shape).astype(np.float32)
    assert_close(forward(xp.asarray(x)), forward(x), rtol=1e-5, atol=1e-6, name=f"{name} forward")
    assert_close(backward(xp.asarray(dy), xp.asarray(x)), backward(dy, x), rtol=1e-5, atol=1e-6,
                 name=f"{name} backward")


# ----------------------------------------------------------------------------------------------
# Half precision: ReLU, its backward and the residual add's ReLU on float16 / bfloat16 storage
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_half_precision_relu_and_add_relu_round_once_from_float32(xp, rng, name):
    """Against ml_dtypes / NumPy's own rounding of the float32 results: ReLU and its backward are exact,
    add_relu rounds the float32 sum once (after the ReLU, which commutes with the rounding)."""
    import ml_dtypes  # noqa: PLC0415

    from minidnn.primitives import convert  # noqa: PLC0415

    reference = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(np.float16)
    shape = (3, 5, 7, 2)
    a32, b32, dy32 = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    a32.flat[:4] = [0.0, -0.0, np.inf, np.nan]
    a, b, dy = (convert.float_to_half(xp.asarray(v), name) for v in (a32, b32, dy32))
    exact_a, exact_b, exact_dy = (to_numpy(convert.half_to_float(v, name)) for v in (a, b, dy))

    def words(array):
        return to_numpy(array).view(np.uint16)

    with np.errstate(invalid="ignore"):
        expected_relu = np.maximum(exact_a, np.float32(0)).astype(reference).view(np.uint16)
        expected_sum = np.maximum(exact_a + exact_b, np.float32(0)).astype(reference).view(np.uint16)
    np.testing.assert_array_equal(words(relu_forward(a)), expected_relu)
    y = add_relu_forward(a, b)
    # A NaN that went through an addition carries the hardware's payload (the GPU's is all ones, x86's the
    # operand's): NaNs are compared as NaNs, every other element bit for bit.
    nan = np.isnan(exact_a + exact_b)
    np.testing.assert_array_equal(np.isnan(to_numpy(convert.half_to_float(y, name))), nan)
    np.testing.assert_array_equal(words(y)[~nan], expected_sum[~nan])
    passed = to_numpy(convert.half_to_float(y, name)) > 0
    expected_dx = np.where(passed, exact_dy, np.float32(0)).astype(reference).view(np.uint16)
    np.testing.assert_array_equal(words(relu_backward(dy, y)), expected_dx)
    # Two parts: their float32 sum (exact values of the half words) rounded once, then masked.
    expected_of_sum = np.where(passed, exact_dy + exact_b, np.float32(0)).astype(reference).view(np.uint16)
    np.testing.assert_array_equal(words(relu_backward(dy, y, b)), expected_of_sum)
    in_place = a.copy()
    assert relu_forward(in_place, out=in_place) is in_place
    np.testing.assert_array_equal(words(in_place), expected_relu)
    with pytest.raises(TypeError, match="b and a must have the same dtype"):
        add_relu_forward(a, xp.asarray(b32))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("size", [1, 7, 37, 1000003])
@pytest.mark.parametrize("offset", [0, 1])
def test_gpu_relu_kernels_in_packs_and_single_elements_match_numpy(rng, name, size, offset):
    """ReLU, add_relu and relu_backward (of one gradient and of two parts) on arrays 16-byte aligned (activation.cu's pack builds, with a tail
    of single elements when the size is not a multiple of the pack) and one element in (the plain builds),
    in place too: bit for bit the NumPy twin (NaNs as NaNs after the addition)."""
    from minidnn.primitives import _cuda, convert  # noqa: PLC0415

    cupy = __import__("cupy")
    half = name in ("bfloat16", "float16")

    def stored(values, xp):
        return convert.float_to_half(xp.asarray(values.astype(np.float32)), name) if half else xp.asarray(
            values.astype(name))

    def bits(array):
        return to_numpy(array).view(np.uint16 if half else (np.uint32 if name == "float32" else np.uint64))

    a, b, dy = (rng.standard_normal(size + offset) for _ in range(3))
    a[:3] = [0.0, -0.0, np.nan][:min(3, size + offset)]
    on_cpu = [stored(v, np)[offset:] for v in (a, b, dy)]
    on_gpu = [stored(v, cupy)[offset:] for v in (a, b, dy)]
    assert _cuda.elements_per_access(on_gpu) == (1 if offset else 16 // on_gpu[0].itemsize)
    y_cpu, y_gpu = add_relu_forward(on_cpu[0], on_cpu[1]), add_relu_forward(on_gpu[0], on_gpu[1])
    nan = np.isnan(to_numpy(convert.half_to_float(y_cpu, name)) if half else y_cpu)
    np.testing.assert_array_equal(bits(y_gpu)[~nan], bits(y_cpu)[~nan])
    np.testing.assert_array_equal(bits(relu_forward(on_gpu[0])), bits(relu_forward(on_cpu[0])))
    np.testing.assert_array_equal(bits(relu_backward(on_gpu[2], y_gpu)), bits(relu_backward(on_cpu[2], y_cpu)))
    np.testing.assert_array_equal(bits(relu_backward(on_gpu[2], y_gpu, on_gpu[1])),
                                  bits(relu_backward(on_cpu[2], y_cpu, on_cpu[1])))
    in_place = on_gpu[0].copy()
    assert relu_forward(in_place, out=in_place) is in_place
    np.testing.assert_array_equal(bits(in_place), bits(relu_forward(on_cpu[0])))


def test_numpy_calls_keep_no_launch():
    """The ReLU kernels' steady state is the GPU's: NumPy arrays give no key and are checked every time."""
    from minidnn.primitives import activation  # noqa: PLC0415

    x = np.ones((2, 3), np.float32)
    assert activation._kept_call("relu_backward", x, x) == (None, None)
    relu_backward(x, x)
    add_relu_forward(x, x)
    assert not any(isinstance(key[1][0], type(x)) for key in activation._kept)


@pytest.mark.gpu
def test_gpu_repeated_relu_calls_skip_the_checks_and_keep_their_bits(rng, monkeypatch):
    """A ReLU call without out whose arrays match an earlier one's (type, shape, strides, dtype, GPU, address modulo
    16) skips the checks and the build's choice and gives the checked call's bits (float32, float64 and bfloat16
    words); a strided or 8-byte-misaligned array is checked again, and bad arguments still raise."""
    from minidnn.primitives import activation, convert, layout  # noqa: PLC0415

    cupy = __import__("cupy")
    monkeypatch.setattr(activation, "_kept", {})
    checked = []
    for name in ("_check_gradient_pair", "_check_add_relu_arguments", "_check_half_arrays"):
        original = getattr(activation, name)
        monkeypatch.setattr(activation, name, lambda *args, _original=original, **kwargs:
                            (checked.append(1), _original(*args, **kwargs))[1])
    for dtype in (np.float32, np.float64, "bfloat16"):
        a_host, b_host = rng.standard_normal((2, 5, 6, 7)), rng.standard_normal((2, 5, 6, 7))
        if dtype == "bfloat16":
            a, b = (convert.float_to_half(cupy.asarray(v, np.float32), "bfloat16") for v in (a_host, b_host))
        else:
            a, b = cupy.asarray(a_host, dtype), cupy.asarray(b_host, dtype)

        def calls(a, b):
            y = add_relu_forward(a, b)
            return [to_numpy(r) for r in (y, relu_backward(b, y), relu_forward(a), relu_backward(b, y, a))]

        checked.clear()
        first = calls(a, b)
        # add_relu, relu_backward of one gradient and of two parts (and relu_forward's half check)
        assert len(checked) == 3 + (dtype == "bfloat16")
        for one, two in zip(first, calls(a, b)):
            np.testing.assert_array_equal(one, two)
        assert len(checked) == 3 + (dtype == "bfloat16")  # the steady state: no checks
        off = cupy.empty(a.size + 1, a.dtype)[1:].reshape(a.shape)
        off[...] = a
        strided = cupy.asfortranarray(b)
        for one, two in zip(first, calls(off, strided)):
            np.testing.assert_array_equal(one, two)
        assert len(checked) > 3 + (dtype == "bfloat16")
        # Channels-last arrays are kept too, and their outputs stay channels-last.
        a_last, b_last = layout.to_channels_last(a), layout.to_channels_last(b)
        for _ in range(2):
            checked.clear()
            y = add_relu_forward(a_last, b_last)
            outputs = (y, relu_backward(b_last, y), relu_forward(a_last), relu_backward(b_last, y, a_last))
            assert all(layout.is_channels_last(result) for result in outputs)
            for one, two in zip(first, outputs):
                np.testing.assert_array_equal(one, to_numpy(layout.contiguous(two)))
        assert not checked  # the second round: the kept launches
    with pytest.raises(ValueError, match="shape"):
        add_relu_forward(a, b[:1])
    with pytest.raises(TypeError):
        relu_backward(a.astype(cupy.float32), b)
