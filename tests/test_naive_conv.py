"""The naive engine's convolution and biases, as Caffe ran them: against the loop references of
test_primitives_conv.py and test_primitives_linear.py, finite differences, and the structure itself
(im2col per image except for the 1x1 shortcut, a one-image column buffer kept per layer shape, one
GEMM per image and group, the bias added in place)."""
import math

import numpy as np
import pytest

from minidnn import naive
from minidnn.naive import conv as naive_conv
from minidnn.primitives import blas
from minidnn.primitives.conv import im2col as lowering
from test_primitives_conv import CASES, loop_reference
from test_primitives_linear import reference_bias_add, reference_bias_backward
from tests.helpers import assert_close, numerical_gradient, to_numpy


def shapes(case):
    N, C, H, W, K, R, S, stride, padding, dilation, groups = case
    return (N, C, H, W), (K, C // groups, R, S), (stride, padding, dilation, groups)


def counting(monkeypatch, module, name):
    """Replace module.name by a wrapper that records each call, and return the record."""
    calls, original = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def run_all(xp, x, w, dy, args):
    return (naive.conv2d_forward(xp.asarray(x), xp.asarray(w), *args),
            naive.conv2d_backward_data(xp.asarray(dy), xp.asarray(w), x.shape, *args),
            naive.conv2d_backward_filter(xp.asarray(x), xp.asarray(dy), w.shape, *args))


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_all_directions_match_the_loop_reference(poisoned, rng, case):
    x_shape, w_shape, args = shapes(case)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y_ref, backward_data, backward_filter = loop_reference(x, w, *args)
    dy = rng.standard_normal(y_ref.shape)
    y, dx, dw = run_all(poisoned, x, w, dy, args)
    assert_close(y, y_ref, rtol=1e-9, atol=1e-9, name="forward")
    assert_close(dx, backward_data(dy), rtol=1e-9, atol=1e-9, name="backward-data")
    assert_close(dw, backward_filter(dy), rtol=1e-9, atol=1e-9, name="backward-filter")


@pytest.mark.parametrize("case", CASES[1::4])
def test_float32_matches_the_float64_reference(poisoned, rng, case):
    x_shape, w_shape, args = shapes(case)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y_ref, backward_data, backward_filter = loop_reference(x, w, *args)
    dy = rng.standard_normal(y_ref.shape)
    results = run_all(poisoned, x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32), args)
    for got, want in zip(results, (y_ref, backward_data(dy), backward_filter(dy))):
        assert got.dtype == np.float32
        assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, args", [
    ((2, 4, 5, 6), (4, 2, 2, 3), ((2, 1), (1, 0), 1, 2)),
    ((2, 3, 4, 3), (5, 3, 1, 1), (1, 0, 1, 1)),  # the 1x1 shortcut
])
def test_gradients_match_finite_differences(xp, rng, x_shape, w_shape, args):
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    dy = rng.standard_normal(naive.conv2d_forward(x, w, *args).shape)
    dx = naive.conv2d_backward_data(xp.asarray(dy), xp.asarray(w), x_shape, *args)
    dw = naive.conv2d_backward_filter(xp.asarray(x), xp.asarray(dy), w_shape, *args)
    forward = lambda a, b: naive.conv2d_forward(a, b, *args)  # noqa: E731
    assert_close(dx, numerical_gradient(forward, [x, w], 0, dy), rtol=1e-6, atol=1e-7)
    assert_close(dw, numerical_gradient(forward, [x, w], 1, dy), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case, lowered", [
    ((3, 6, 5, 7, 4, 1, 1, 1, 0, 1, 2), False),   # 1x1, stride 1, no padding, grouped: x[n] is the column matrix
    ((2, 3, 4, 5, 4, 1, 1, 1, 0, 3, 1), False),   # a 1x1 filter's dilation changes nothing
    ((2, 3, 4, 5, 2, 1, 1, 1, 1, 1, 1), True),    # 1x1 with padding
    ((2, 4, 5, 5, 3, 1, 1, 2, 0, 1, 1), True),    # 1x1 with stride 2
    ((3, 4, 6, 5, 6, 3, 3, 1, 1, 1, 2), True),
])
def test_im2col_runs_per_image_except_for_the_1x1_shortcut(xp, rng, monkeypatch, case, lowered):
    x_shape, w_shape, args = shapes(case)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y_ref, backward_data, backward_filter = loop_reference(x, w, *args)
    dy = rng.standard_normal(y_ref.shape)
    im2col, col2im = counting(monkeypatch, lowering, "im2col"), counting(monkeypatch, lowering, "col2im")
    gemms = counting(monkeypatch, blas, "gemm")
    y, dx, dw = run_all(xp, x, w, dy, args)
    N, groups = x_shape[0], args[3]
    # im2col in the forward pass and again in backward-filter, col2im in backward-data; none for 1x1.
    assert (len(im2col), len(col2im)) == ((2 * N, N) if lowered else (0, 0))
    assert len(gemms) == 3 * N * groups  # one GEMM per image and group, in each direction
    assert_close(y, y_ref, rtol=1e-9, atol=1e-9)
    assert_close(dx, backward_data(dy), rtol=1e-9, atol=1e-9)
    assert_close(dw, backward_filter(dy), rtol=1e-9, atol=1e-9)


def test_the_column_buffer_holds_one_image_and_is_kept_per_layer_shape(xp, rng):
    naive_conv._column_buffers.clear()
    w = xp.asarray(rng.standard_normal((5, 4, 3, 2)))
    args = ((2, 1), 1, 1, 1)
    y = naive.conv2d_forward(xp.asarray(rng.standard_normal((3, 4, 9, 8))), w, *args)  # P, Q = 5, 9
    (buffer,) = naive_conv._column_buffers.values()
    assert buffer.shape == (4 * 3 * 2, 5 * 9) and buffer.dtype == np.float64  # C·R·S × P·Q: one image
    assert y.shape == (3, 5, 5, 9)
    # The same layer with another batch size, and its backward passes, reuse it.
    x = xp.asarray(rng.standard_normal((6, 4, 9, 8)))
    dy = xp.asarray(rng.standard_normal((6, 5, 5, 9)))
    naive.conv2d_backward_data(dy, w, x.shape, *args)
    naive.conv2d_backward_filter(x, dy, w.shape, *args)
    (kept,) = naive_conv._column_buffers.values()
    assert kept is buffer
    # Another layer shape gets its own; a 1x1 layer needs none.
    naive.conv2d_forward(x, xp.asarray(rng.standard_normal((2, 4, 1, 1))))
    assert len(naive_conv._column_buffers) == 1
    naive.conv2d_forward(x, xp.asarray(rng.standard_normal((2, 4, 3, 3))))
    assert sorted(b.shape for b in naive_conv._column_buffers.values()) == [(24, 45), (36, 42)]


def test_out_and_accumulate(poisoned, rng):
    xp = poisoned
    x, w = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((6, 2, 3, 3))
    args = (2, 1, 1, 2)
    y_ref, backward_data, backward_filter = loop_reference(x, w, *args)
    dy = rng.standard_normal(y_ref.shape)
    out = xp.full(y_ref.shape, np.nan)
    assert naive.conv2d_forward(xp.asarray(x), xp.asarray(w), *args, out=out) is out
    assert_close(out, y_ref, rtol=1e-9, atol=1e-9)
    out = xp.full(x.shape, np.nan)
    assert naive.conv2d_backward_data(xp.asarray(dy), xp.asarray(w), x.shape, *args, out=out) is out
    assert_close(out, backward_data(dy), rtol=1e-9, atol=1e-9)
    out = xp.ones(w.shape)
    assert naive.conv2d_backward_filter(xp.asarray(x), xp.asarray(dy), w.shape, *args, out=out, accumulate=True) is out
    assert_close(out, 1 + backward_filter(dy), rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------------------
# Biases: GEMMs with a vector of ones
# ----------------------------------------------------------------------------------------------
BIAS_CASES = [((3, 4, 5, 2), 1), ((2, 3, 4), -1), ((5, 3), 1), ((2, 3, 4), 0), ((7,), 0)]


@pytest.mark.parametrize("shape, axis", BIAS_CASES)
def test_bias_add_adds_in_place_with_one_gemm_per_image(xp, rng, monkeypatch, shape, axis):
    y_host, bias = rng.standard_normal(shape), rng.standard_normal(shape[axis])
    y = xp.array(y_host)
    gemms = counting(monkeypatch, blas, "gemm")
    assert naive.bias_add(y, xp.asarray(bias), axis) is y  # the GEMM's output: no copy
    assert_close(y, reference_bias_add(y_host, bias, axis % len(shape)))
    outer, inner = math.prod(shape[:axis % len(shape)]), math.prod(shape[axis % len(shape) + 1:])
    assert len(gemms) == (1 if inner == 1 else outer)


@pytest.mark.parametrize("shape, axis", BIAS_CASES)
def test_bias_backward_is_a_gemv_per_image(xp, rng, monkeypatch, shape, axis):
    dy = rng.standard_normal(shape)
    gemms = counting(monkeypatch, blas, "gemm")
    db = naive.bias_backward(xp.asarray(dy), axis)
    assert_close(db, reference_bias_backward(dy, axis % len(shape)))
    outer, inner = math.prod(shape[:axis % len(shape)]), math.prod(shape[axis % len(shape) + 1:])
    assert len(gemms) == (1 if inner == 1 else outer)
    expected = numerical_gradient(lambda b: naive.bias_add(np.zeros(shape), b, axis), [np.zeros(shape[axis])], 0, dy)
    assert_close(db, expected, rtol=1e-6, atol=1e-7)


def test_bias_add_of_a_strided_array_leaves_it_unchanged(xp, rng):
    y_host = rng.standard_normal((3, 8))
    y, bias = xp.asarray(y_host)[:, ::2], rng.standard_normal(4)
    out = naive.bias_add(y, xp.asarray(bias), -1)
    assert_close(out, reference_bias_add(y_host[:, ::2], bias, 1))
    assert_close(y, y_host[:, ::2])
    assert to_numpy(out).shape == (3, 4)


def test_the_naive_engine_refuses_half_precision_convolutions():
    x, w = np.zeros((1, 2, 5, 5), np.float16), np.zeros((3, 2, 3, 3), np.float16)
    with pytest.raises(TypeError, match="naive engine convolves float32 and float64 arrays only, got float16"):
        naive_conv.conv2d_forward(x, w)
    with pytest.raises(TypeError, match="only, got float16"):
        naive_conv.conv2d_backward_data(np.zeros((1, 3, 3, 3), np.float16), w, x.shape)
    with pytest.raises(TypeError, match="only, got float16"):
        naive_conv.conv2d_backward_filter(x, np.zeros((1, 3, 3, 3), np.float16), w.shape)
