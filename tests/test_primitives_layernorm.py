"""Layer-norm primitives against an independent float64 loop reference, finite differences and PyTorch; the GPU
kernels against the NumPy twin (every row, every column, more rows than one grid pass)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from minidnn.primitives.layernorm import layer_norm_backward, layer_norm_forward
from tests.helpers import FD_TOLERANCE, assert_close, float32_tolerance, numerical_gradient, to_numpy

# (x shape, normalized_shape)
CASES = [((3, 7), 7), ((2, 3, 5), (5,)), ((2, 3, 4, 5), (4, 5)), ((5,), [5]), ((4, 1, 3), (1, 3))]


def reference(x: np.ndarray, shape: tuple, weight, bias, eps: float):
    """y, mean, invstd row by row with Python floats (math.fsum)."""
    size = math.prod(shape)
    rows = x.reshape(-1, size)
    y, means, invstds = np.empty_like(rows), [], []
    for r, row in enumerate(rows):
        mean = math.fsum(row) / size
        invstd = 1 / math.sqrt(math.fsum((v - mean) ** 2 for v in row) / size + eps)
        w = np.ones(size) if weight is None else weight.reshape(-1)
        b = np.zeros(size) if bias is None else bias.reshape(-1)
        y[r] = [(v - mean) * invstd * w[d] + b[d] for d, v in enumerate(row)]
        means.append(mean)
        invstds.append(invstd)
    return y.reshape(x.shape), np.array(means), np.array(invstds)


def normalized(shape_argument) -> tuple:
    return (shape_argument,) if isinstance(shape_argument, int) else tuple(shape_argument)


def draw(rng, x_shape, shape_argument, affine=True):
    shape = normalized(shape_argument)
    x = rng.standard_normal(x_shape) * 3 + rng.standard_normal()
    weight = rng.standard_normal(shape) if affine else None
    bias = rng.standard_normal(shape) if affine else None
    return x, weight, bias


def put(xp, *arrays):
    return tuple(None if a is None else xp.asarray(a) for a in arrays)


@pytest.mark.parametrize("x_shape, shape_argument", CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_forward_matches_loop_reference(xp, rng, x_shape, shape_argument, affine):
    x, weight, bias = draw(rng, x_shape, shape_argument, affine)
    y, mean, invstd = layer_norm_forward(*put(xp, x), shape_argument, *put(xp, weight, bias), eps=1e-3)
    expected = reference(x, normalized(shape_argument), weight, bias, 1e-3)
    for name, actual, wanted in zip(("y", "mean", "invstd"), (y, mean, invstd), expected):
        assert actual.dtype == xp.float64
        assert_close(actual, wanted, rtol=1e-12, atol=1e-13, name=name)


@pytest.mark.parametrize("x_shape, shape_argument", CASES)
def test_backward_matches_finite_differences(xp, rng, x_shape, shape_argument):
    x, weight, bias = draw(rng, x_shape, shape_argument)
    dy = rng.standard_normal(x_shape)
    _, mean, invstd = layer_norm_forward(*put(xp, x), shape_argument, *put(xp, weight, bias))
    dx, dweight, dbias = layer_norm_backward(*put(xp, dy, x), shape_argument, *put(xp, weight, mean, invstd))

    def forward(x, weight, bias):
        return layer_norm_forward(x, shape_argument, weight, bias)[0]

    for index, actual in enumerate((dx, dweight, dbias)):
        expected = numerical_gradient(forward, [x, weight, bias], index, dy)
        assert_close(actual, expected, **FD_TOLERANCE, name=("dx", "dweight", "dbias")[index])


def test_backward_without_weight_matches_finite_differences(xp, rng):
    x, dy = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    _, mean, invstd = layer_norm_forward(xp.asarray(x), 6)
    dx, _, _ = layer_norm_backward(*put(xp, dy, x), 6, None, mean, invstd)
    expected = numerical_gradient(lambda x: layer_norm_forward(x, 6)[0], [x], 0, dy)
    assert_close(dx, expected, **FD_TOLERANCE, name="dx")


def test_float32_matches_float64_even_with_a_large_mean(xp, rng):
    x = (rng.standard_normal((6, 40)) + 1000.0).astype(np.float32)  # |mean| >> std: E[x²] − E[x]² would cancel
    weight, bias = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y, mean, invstd = layer_norm_forward(*put(xp, x), 40, *put(xp, weight, bias))
    assert y.dtype == mean.dtype == invstd.dtype == xp.float32
    y64, mean64, invstd64 = layer_norm_forward(x.astype(np.float64), 40, weight.astype(np.float64),
                                               bias.astype(np.float64))
    tolerance = float32_tolerance(xp, rtol=1e-4, atol=2e-4)
    assert_close(y, y64, **tolerance, name="y")
    grads = layer_norm_backward(*put(xp, dy, x), 40, *put(xp, weight), mean, invstd)
    grads64 = layer_norm_backward(dy.astype(np.float64), x.astype(np.float64), 40, weight.astype(np.float64),
                                  mean64, invstd64)
    for name, actual, expected in zip(("dx", "dweight", "dbias"), grads, grads64):
        assert actual.dtype == xp.float32
        assert_close(actual, expected, **float32_tolerance(xp, rtol=1e-3, atol=2e-3), name=name)


@pytest.mark.parametrize("affine", [True, False])
def test_matches_torch(xp, rng, affine):
    torch = pytest.importorskip("torch")
    x, weight, bias = draw(rng, (3, 2, 4, 5), (4, 5), affine)
    dy = rng.standard_normal(x.shape)
    tx = torch.tensor(x, requires_grad=True)
    tw = None if weight is None else torch.tensor(weight, requires_grad=True)
    tb = None if bias is None else torch.tensor(bias, requires_grad=True)
    ty = torch.nn.functional.layer_norm(tx, (4, 5), tw, tb, eps=1e-4)
    ty.backward(torch.tensor(dy))
    y, mean, invstd = layer_norm_forward(*put(xp, x), (4, 5), *put(xp, weight, bias), eps=1e-4)
    assert_close(y, ty.detach().numpy(), rtol=1e-12, atol=1e-13, name="y")
    dx, dweight, dbias = layer_norm_backward(*put(xp, dy, x), (4, 5), *put(xp, weight, mean, invstd))
    assert_close(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12, name="dx")
    if affine:
        assert_close(dweight, tw.grad.numpy(), rtol=1e-10, atol=1e-12, name="dweight")
        assert_close(dbias, tb.grad.numpy(), rtol=1e-10, atol=1e-12, name="dbias")


def test_strided_input_and_an_empty_batch(xp, rng):
    x = rng.standard_normal((5, 8))
    strided = xp.asarray(x.T.copy()).T  # (5, 8) view of a transposed buffer: not contiguous
    y, _, _ = layer_norm_forward(strided, 8)
    assert_close(y, reference(x, (8,), None, None, 1e-5)[0], rtol=1e-12, atol=1e-13, name="strided")
    empty = xp.zeros((0, 3, 4))
    y, mean, invstd = layer_norm_forward(empty, 4)
    assert y.shape == (0, 3, 4) and mean.shape == invstd.shape == (0,)
    dx, dweight, dbias = layer_norm_backward(empty, empty, 4, xp.ones(4), mean, invstd)
    assert dx.shape == (0, 3, 4)
    assert_close(dweight, np.zeros(4), name="dweight of no rows")
    assert_close(dbias, np.zeros(4), name="dbias of no rows")


def test_errors_name_the_argument(xp):
    x = xp.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"normalized_shape=\[3\], expected x of shape \[\*, 3\], got \[2, 3, 4\]"):
        layer_norm_forward(x, 3)
    with pytest.raises(ValueError, match="expected x of shape"):
        layer_norm_forward(xp.ones(4), (2, 4))
    with pytest.raises(TypeError, match="normalized_shape must be an int or a sequence of ints"):
        layer_norm_forward(x, 4.0)
    with pytest.raises(ValueError, match="at least one dimension"):
        layer_norm_forward(x, ())
    with pytest.raises(ValueError, match="has no elements"):
        layer_norm_forward(xp.ones((2, 0)), 0)
    with pytest.raises(ValueError, match=r"weight must have normalized_shape \(4,\), got \(3,\)"):
        layer_norm_forward(x, 4, xp.ones(3))
    with pytest.raises(TypeError, match="bias must have x's dtype float64, got float32"):
        layer_norm_forward(x, 4, None, xp.ones(4, dtype=xp.float32))
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        layer_norm_forward(x, 4, eps=-1e-5)
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        layer_norm_forward(xp.ones((2, 4), dtype=xp.int32), 4)
    with pytest.raises(ValueError, match=r"mean must have shape \(M,\) = \(6,\)"):
        layer_norm_backward(x, x, 4, None, xp.ones(5), xp.ones(6))
    with pytest.raises(ValueError, match="dy must have x's shape"):
        layer_norm_backward(xp.ones((2, 4)), x, 4, None, xp.ones(6), xp.ones(6))


def test_gpu_many_rows_and_wide_rows_match_the_numpy_twin(xp, rng):
    """More rows than one grid pass, rows wider than a block, a column count no multiple of 32, float32."""
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    for x_shape, size in (((4500, 2, 37), 37), ((3, 1029), 1029)):
        x = rng.standard_normal(x_shape).astype(np.float32)
        weight, bias = rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)
        dy = rng.standard_normal(x_shape).astype(np.float32)
        twin = layer_norm_forward(x, size, weight, bias)
        ours = layer_norm_forward(*put(xp, x), size, *put(xp, weight, bias))
        for name, actual, expected in zip(("y", "mean", "invstd"), ours, twin):
            assert_close(actual, expected, rtol=1e-5, atol=1e-5, name=name)
        twin_grads = layer_norm_backward(dy, x, size, weight, twin[1], twin[2])
        grads = layer_norm_backward(*put(xp, dy, x), size, xp.asarray(weight), ours[1], ours[2])
        for name, actual, expected in zip(("dx", "dweight", "dbias"), grads, twin_grads):
            assert_close(actual, expected, rtol=1e-4, atol=1e-3, name=name)
        repeat = layer_norm_backward(*put(xp, dy, x), size, xp.asarray(weight), ours[1], ours[2])
        for first, second in zip(grads, repeat):  # no atomics: bitwise the same every run
            np.testing.assert_array_equal(to_numpy(first), to_numpy(second))
