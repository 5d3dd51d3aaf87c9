"""The naive engine's layers against the float64 references of the primitives' tests (imported from those
modules), finite differences, and, on the GPU, one kernel launch per layer direction where Caffe had one.

GPU runs (the ``xp`` fixture's CuPy half) poison every array the engine allocates with NaN, so an element
a kernel leaves unwritten fails the comparison."""
import itertools

import numpy as np
import pytest

from minidnn import naive
from test_primitives_activation import REFERENCES, draw_input, elementwise
from test_primitives_batchnorm import (EPS, random_inputs, reference_backward_inference, reference_backward_training,
                                       reference_normalise, reference_statistics)
from test_primitives_dropout import random_seed, reference_dropout
from test_primitives_linear import reference_backward_data, reference_backward_weight, reference_linear
from test_primitives_lrn import CASES as LRN_CASES
from test_primitives_lrn import PARAMS as LRN_PARAMS
from test_primitives_lrn import reference_lrn, reference_lrn_backward
from test_primitives_pooling import (ADAPTIVE_CASES, AVG_CASES, MAX_CASES, ref_adaptive_output, ref_adaptive_pool,
                                     ref_adaptive_pool_backward, ref_avg_pool, ref_avg_pool_backward, ref_max_pool,
                                     ref_max_pool_backward)
from test_primitives_softmax import (AXIS_CASES, LOSS_CASES, LOSS_IDS, draw_loss_problem, reference_cross_entropy,
                                     reference_cross_entropy_backward, reference_log_softmax,
                                     reference_log_softmax_backward, reference_nll, reference_nll_backward,
                                     reference_softmax, reference_softmax_backward)
from tests.helpers import FD_TOLERANCE, assert_close, numerical_gradient, to_numpy

F32 = dict(rtol=1e-5, atol=1e-5)


def on(xp, *arrays):
    return [None if a is None else xp.array(a, copy=True) for a in arrays]


# ----------------------------------------------------------------------------------------------
# Pooling
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, shape", MAX_CASES)
def test_max_pool_matches_reference(poisoned, rng, kernel, stride, padding, dilation, ceil_mode, shape):
    xp, x = poisoned, rng.standard_normal(shape)
    window = (kernel, stride, padding, dilation, ceil_mode)
    y, indices = naive.max_pool2d_forward(xp.asarray(x), *window)
    y_ref, indices_ref = ref_max_pool(x, *window)
    assert_close(y, y_ref)
    assert to_numpy(indices).dtype == np.int32  # Caffe's mask: Blob<int> max_idx_
    np.testing.assert_array_equal(to_numpy(indices), indices_ref)
    _, positions = naive.max_pool2d_forward(xp.asarray(x), *window, return_indices=True)
    assert to_numpy(positions).dtype == np.int64
    np.testing.assert_array_equal(to_numpy(positions), indices_ref)
    dy = rng.standard_normal(y_ref.shape)
    dx_ref = ref_max_pool_backward(dy, indices_ref, shape)
    assert_close(naive.max_pool2d_backward(xp.asarray(dy), indices, shape, *window), dx_ref, name="gather")
    assert_close(naive.max_pool2d_backward(xp.asarray(dy), indices, shape), dx_ref, name="scatter")


def test_max_pool_ties_nan_and_windows_of_minus_inf(poisoned):
    xp = poisoned
    ties = np.random.default_rng(5).integers(0, 3, (2, 3, 7, 6)).astype(np.float64)
    for window in [(3, 1, 1, 1, False), (2, 2, 1, 1, True), ((2, 3), (1, 2), (1, 1), (2, 1), True)]:
        y, indices = naive.max_pool2d_forward(xp.asarray(ties), *window)
        y_ref, indices_ref = ref_max_pool(ties, *window)
        assert_close(y, y_ref)
        np.testing.assert_array_equal(to_numpy(indices), indices_ref)  # the first maximum wins
    x = np.array([[[[1.0, np.nan, np.nan, 2.0], [0.0, 1.0, 2.0, 3.0]]]])
    y, indices = naive.max_pool2d_forward(xp.asarray(x), (1, 4))
    assert np.isnan(to_numpy(y)[0, 0, 0, 0]) and to_numpy(y)[0, 0, 1, 0] == 3.0
    np.testing.assert_array_equal(to_numpy(indices)[0, 0, :, 0], [2, 7])  # the last NaN, as PyTorch
    y, indices = naive.max_pool2d_forward(xp.asarray(np.full((1, 1, 3, 3), -np.inf)), 2, 1, 1)
    assert np.all(to_numpy(y) == -np.inf)  # each window reports its first input pixel
    np.testing.assert_array_equal(to_numpy(indices)[0, 0], [[0, 0, 1, 2], [0, 0, 1, 2], [3, 3, 4, 5], [6, 6, 7, 8]])


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape", AVG_CASES)
def test_avg_pool_matches_reference(poisoned, rng, kernel, stride, padding, ceil_mode, count_include_pad,
                                    divisor_override, shape):
    xp, x = poisoned, rng.standard_normal(shape)
    args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    y = naive.avg_pool2d_forward(xp.asarray(x), *args)
    assert_close(y, ref_avg_pool(x, *args))
    dy = rng.standard_normal(y.shape)
    assert_close(naive.avg_pool2d_backward(xp.asarray(dy), shape, *args), ref_avg_pool_backward(dy, shape, *args))


@pytest.mark.parametrize("shape, output_size", ADAPTIVE_CASES)
def test_adaptive_avg_pool_matches_reference(xp, rng, shape, output_size):
    x = rng.standard_normal(shape)
    y = naive.adaptive_avg_pool2d_forward(xp.asarray(x), output_size)
    assert_close(y, ref_adaptive_pool(x, output_size))
    dy = rng.standard_normal(y.shape)
    assert_close(naive.adaptive_avg_pool2d_backward(xp.asarray(dy), shape), ref_adaptive_pool_backward(dy, shape))


def test_pooling_float32(poisoned, rng):
    xp, x = poisoned, rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    y, indices = naive.max_pool2d_forward(xp.asarray(x), 3, 2, 1, 1, True)
    y_ref, indices_ref = ref_max_pool(x.astype(np.float64), 3, 2, 1, 1, True)
    assert y.dtype == np.float32
    assert_close(y, y_ref, **F32)
    np.testing.assert_array_equal(to_numpy(indices), indices_ref)
    args = ((3, 2), (2, 1), 1, True, False, None)
    y = naive.avg_pool2d_forward(xp.asarray(x), *args)
    assert y.dtype == np.float32
    assert_close(y, ref_avg_pool(x.astype(np.float64), *args), **F32)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = naive.avg_pool2d_backward(xp.asarray(dy), x.shape, *args)
    assert dx.dtype == np.float32
    assert_close(dx, ref_avg_pool_backward(dy.astype(np.float64), x.shape, *args), **F32)


def test_pooling_gradients_match_finite_differences(xp, rng):
    x = rng.standard_normal((1, 2, 5, 6))
    for window in [(3, 2, 1, 1, True), ((2, 3), 1, (1, 1), 1, False)]:
        y, indices = naive.max_pool2d_forward(x, *window)
        dy = rng.standard_normal(y.shape)
        expected = numerical_gradient(lambda a: naive.max_pool2d_forward(a, *window)[0], [x], 0, dy)
        assert_close(naive.max_pool2d_backward(xp.asarray(dy), xp.asarray(indices), x.shape, *window), expected,
                     **FD_TOLERANCE)
    args = (3, 2, 1, True, False, None)
    dy = rng.standard_normal(naive.avg_pool2d_forward(x, *args).shape)
    expected = numerical_gradient(lambda a: naive.avg_pool2d_forward(a, *args), [x], 0, dy)
    assert_close(naive.avg_pool2d_backward(xp.asarray(dy), x.shape, *args), expected, **FD_TOLERANCE)


# ----------------------------------------------------------------------------------------------
# Activations
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh"])
@pytest.mark.parametrize("shape", [(7,), (2, 3, 5), (1, 3, 5, 7)])
def test_activations_match_reference(poisoned, rng, name, shape):
    xp = poisoned
    forward, backward = getattr(naive, f"{name}_forward"), getattr(naive, f"{name}_backward")
    value, derivative = REFERENCES[name]
    x, dy = draw_input(rng, shape), rng.standard_normal(shape)
    y = forward(xp.asarray(x))
    assert_close(y, elementwise(value, x), rtol=1e-13, atol=1e-15)
    assert_close(backward(xp.asarray(dy), y), dy * elementwise(derivative, x), rtol=1e-12, atol=1e-15)
    assert_close(backward(xp.asarray(dy), y), numerical_gradient(forward, [x], 0, dy), **FD_TOLERANCE)


def test_relu_in_place_and_into_a_buffer(poisoned, rng):
    xp = poisoned
    x = rng.standard_normal((3, 4, 5))
    x[0, 0, :2] = [0.0, np.nan]
    expected = np.where(np.isnan(x) | (x > 0), x, 0.0)
    buffer = xp.full(x.shape, 7.0)
    assert naive.relu_forward(xp.asarray(x), out=buffer) is buffer
    assert_close(buffer, expected)
    inplace = xp.array(x)
    assert naive.relu_forward(inplace, out=inplace) is inplace
    assert_close(inplace, expected)
    assert_close(naive.relu_forward(xp.asarray(x)[:, ::2]), expected[:, ::2])  # a strided input
    dy = rng.standard_normal(x.shape)
    dy[1, 1, 1] = np.inf  # blocked by the ReLU: its gradient is 0, not inf·0
    x[1, 1, 1] = -1.0
    assert_close(naive.relu_backward(xp.asarray(dy), naive.relu_forward(xp.asarray(x))), np.where(x > 0, dy, 0.0))


def test_add_relu_is_the_sum_then_relu(poisoned, rng):
    xp = poisoned
    a, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    expected = np.maximum(a + b, 0.0)
    assert_close(naive.add_relu_forward(xp.asarray(a), xp.asarray(b)), expected)
    target = xp.array(a)
    assert naive.add_relu_forward(target, xp.asarray(b), out=target) is target  # in place on a
    assert_close(target, expected)
    dy = rng.standard_normal(a.shape)
    grad = naive.relu_backward(xp.asarray(dy), xp.asarray(expected))  # the backward for both inputs
    for index in (0, 1):
        assert_close(grad, numerical_gradient(naive.add_relu_forward, [a, b], index, dy), **FD_TOLERANCE)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    y = naive.add_relu_forward(xp.asarray(a32), xp.asarray(b32))
    assert y.dtype == np.float32
    assert_close(y, expected, **F32)


# ----------------------------------------------------------------------------------------------
# Local response normalisation
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, size", LRN_CASES)
def test_lrn_matches_reference(poisoned, rng, shape, size):
    xp = poisoned
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    y, scale = naive.lrn_forward(xp.asarray(x), size, **LRN_PARAMS)
    y_ref, scale_ref = reference_lrn(x, size, **LRN_PARAMS)
    assert_close(y, y_ref, rtol=1e-12, atol=1e-14)
    assert_close(scale, scale_ref, rtol=1e-12, atol=1e-14)
    dx = naive.lrn_backward(xp.asarray(dy), xp.asarray(x), y, scale, size, **LRN_PARAMS)
    assert_close(dx, reference_lrn_backward(dy, x, size, **LRN_PARAMS), rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("size", [2, 5])
def test_lrn_float32_and_finite_differences(xp, rng, size):
    x, dy = rng.standard_normal((2, 7, 3, 4)), rng.standard_normal((2, 7, 3, 4))
    y, scale = naive.lrn_forward(xp.asarray(x.astype(np.float32)), size, **LRN_PARAMS)
    y_ref, scale_ref = reference_lrn(x.astype(np.float32).astype(np.float64), size, **LRN_PARAMS)
    assert y.dtype == np.float32
    assert_close(y, y_ref, **F32)
    assert_close(scale, scale_ref, **F32)
    _, scale64 = naive.lrn_forward(x, size, **LRN_PARAMS)
    y64 = naive.lrn_forward(x, size, **LRN_PARAMS)[0]
    expected = numerical_gradient(lambda a: naive.lrn_forward(a, size, **LRN_PARAMS)[0], [x], 0, dy)
    dx = naive.lrn_backward(*on(xp, dy, x, y64, scale64), size, **LRN_PARAMS)
    assert_close(dx, expected, **FD_TOLERANCE)


# ----------------------------------------------------------------------------------------------
# Batch normalisation, with and without the ReLU after it
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 3), (3, 2, 4, 5), (2, 3, 2, 1, 3)])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_batch_norm_training_matches_reference(xp, rng, shape, affine, relu):
    x, weight, bias, running_mean, running_var = random_inputs(rng, shape, affine)
    rm, rv = on(xp, running_mean, running_var)
    y, mean, invstd = naive.batch_norm_forward_training(*on(xp, x, weight, bias), rm, rv, momentum=0.3, relu=relu)
    means, variances, count = reference_statistics(x)
    normalised = reference_normalise(x, weight, bias, means, variances)
    expected_y = np.maximum(normalised, 0.0) if relu else normalised
    assert_close(y, expected_y)
    assert_close(mean, np.array(means))
    assert_close(invstd, 1 / np.sqrt(np.array(variances) + EPS))
    assert_close(rm, 0.7 * running_mean + 0.3 * np.array(means))
    assert_close(rv, 0.7 * running_var + 0.3 * np.array(variances) * count / (count - 1))
    dy = rng.standard_normal(shape)
    masked = np.where(normalised > 0, dy, 0.0) if relu else dy  # ReLU's backward, then the normalisation's
    dx, dweight, dbias = naive.batch_norm_backward_training(xp.asarray(dy), xp.asarray(x), on(xp, weight)[0], mean,
                                                            invstd, relu_output=y if relu else None)
    for got, want in zip((dx, dweight, dbias), reference_backward_training(masked, x, weight)):
        assert_close(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("relu", [False, True])
def test_batch_norm_inference_matches_reference(xp, rng, relu):
    x, weight, bias, running_mean, running_var = random_inputs(rng, (3, 4, 2, 3))
    y = naive.batch_norm_forward_inference(*on(xp, x, weight, bias, running_mean, running_var), relu=relu)
    normalised = reference_normalise(x, weight, bias, running_mean, running_var)
    assert_close(y, np.maximum(normalised, 0.0) if relu else normalised)
    dy = rng.standard_normal(x.shape)
    masked = np.where(normalised > 0, dy, 0.0) if relu else dy
    got = naive.batch_norm_backward_inference(*on(xp, dy, x, weight, running_mean, running_var),
                                              relu_output=y if relu else None)
    for got_one, want in zip(got, reference_backward_inference(masked, x, weight, running_mean, running_var)):
        assert_close(got_one, want)


def test_batch_norm_with_relu_matches_finite_differences(xp, rng):
    x, weight, bias, _, _ = random_inputs(rng, (2, 3, 3, 2))
    dy = rng.standard_normal(x.shape)

    def forward(x_, weight_, bias_):
        return naive.batch_norm_forward_training(x_, weight_, bias_, None, None, relu=True)[0]

    y, mean, invstd = naive.batch_norm_forward_training(*on(xp, x, weight, bias), None, None, relu=True)
    got = naive.batch_norm_backward_training(xp.asarray(dy), xp.asarray(x), xp.asarray(weight), mean, invstd,
                                             relu_output=y)
    for index, gradient in enumerate(got):
        assert_close(gradient, numerical_gradient(forward, [x, weight, bias], index, dy), **FD_TOLERANCE)


# ----------------------------------------------------------------------------------------------
# Softmax and the losses
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape, axis", AXIS_CASES)
def test_softmax_matches_reference(xp, rng, log, shape, axis):
    x, dy = rng.standard_normal(shape) * 3, rng.standard_normal(shape)
    forward = naive.log_softmax_forward if log else naive.softmax_forward
    backward = naive.log_softmax_backward if log else naive.softmax_backward
    y = forward(xp.asarray(x), axis)
    assert_close(y, (reference_log_softmax if log else reference_softmax)(x, axis), rtol=1e-12, atol=1e-14)
    want = (reference_log_softmax_backward if log else reference_softmax_backward)(dy, x, axis)
    assert_close(backward(xp.asarray(dy), y, axis), want, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("use_weight, ignore_some, label_smoothing, reduction", LOSS_CASES, ids=LOSS_IDS)
def test_cross_entropy_matches_reference_and_finite_differences(xp, rng, use_weight, ignore_some, label_smoothing,
                                                                reduction):
    logits, target, weight, grad_loss = draw_loss_problem(rng, 6, 4, use_weight, ignore_some, reduction)
    options = dict(weight=weight, label_smoothing=label_smoothing, reduction=reduction)
    device_options = dict(options, weight=None if weight is None else xp.asarray(weight))
    loss, log_probs = naive.cross_entropy_forward(xp.asarray(logits), xp.asarray(target), **device_options)
    assert_close(loss, reference_cross_entropy(logits, target, **options), rtol=1e-12, atol=1e-14)
    assert_close(log_probs, reference_log_softmax(logits, 1), rtol=1e-12, atol=1e-14)
    grad = naive.cross_entropy_backward(xp.asarray(grad_loss), log_probs, xp.asarray(target), **device_options)
    assert_close(grad, reference_cross_entropy_backward(grad_loss, logits, target, **options), rtol=1e-11, atol=1e-13)
    expected = numerical_gradient(lambda z: naive.cross_entropy_forward(z, target, **options)[0], [logits], 0,
                                  grad_loss)
    assert_close(grad, expected, **FD_TOLERANCE)


@pytest.mark.parametrize("use_weight, ignore_some, reduction",
                         list(itertools.product([False, True], [False, True], ["mean", "sum", "none"])))
def test_nll_loss_matches_reference(xp, rng, use_weight, ignore_some, reduction):
    _, target, weight, grad_loss = draw_loss_problem(rng, 6, 4, use_weight, ignore_some, reduction)
    log_probs = -rng.uniform(0.1, 4.0, size=(6, 4))
    log_probs[:, 0] = -np.inf  # ignored rows point at class 0: −inf must not turn into NaN there
    target[target == 0] = 1
    options = dict(weight=weight, reduction=reduction)
    device_options = dict(options, weight=None if weight is None else xp.asarray(weight))
    loss = naive.nll_loss_forward(xp.asarray(log_probs), xp.asarray(target), **device_options)
    assert_close(loss, reference_nll(log_probs, target, **options), rtol=1e-13, atol=1e-14)
    grad = naive.nll_loss_backward(xp.asarray(grad_loss), xp.asarray(target), log_probs.shape, **device_options)
    assert_close(grad, reference_nll_backward(grad_loss, target, log_probs.shape, **options), rtol=1e-13, atol=1e-14)


def test_a_mean_over_no_rows_is_nan_without_a_warning(xp, recwarn):
    loss, log_probs = naive.cross_entropy_forward(xp.ones((2, 3)), xp.asarray([-100, -100]))
    assert np.isnan(float(loss)) and not recwarn.list
    grad = naive.cross_entropy_backward(xp.asarray(1.0), log_probs, xp.asarray([-100, -100]))
    assert_close(grad, np.zeros((2, 3)))


# ----------------------------------------------------------------------------------------------
# Linear layers and dropout
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("leading", [(), (1,), (4,), (2, 3)])
def test_linear_matches_reference_and_finite_differences(xp, rng, leading):
    x, weight, bias = rng.standard_normal(leading + (5,)), rng.standard_normal((3, 5)), rng.standard_normal(3)
    dy = rng.standard_normal(leading + (3,))
    y = naive.linear_forward(*on(xp, x, weight, bias))
    assert_close(y, reference_linear(x, weight, bias))
    assert_close(naive.linear_forward(*on(xp, x, weight), None), reference_linear(x, weight, None))
    assert_close(naive.linear_backward_data(*on(xp, dy, weight)), reference_backward_data(dy, weight))
    assert_close(naive.linear_backward_weight(*on(xp, x, dy)), reference_backward_weight(x, dy))
    for index in range(3):
        expected = numerical_gradient(naive.linear_forward, [x, weight, bias], index, dy)
        got = [naive.linear_backward_data(*on(xp, dy, weight)), naive.linear_backward_weight(*on(xp, x, dy)),
               naive.bias_backward(xp.asarray(dy), -1)][index]
        assert_close(got, expected, **FD_TOLERANCE)


def test_linear_accepts_strided_and_float32_inputs(xp, rng):
    x, weight = rng.standard_normal((4, 10)), rng.standard_normal((5, 3)).T  # a strided x and a transposed weight
    assert_close(naive.linear_forward(xp.asarray(x)[:, ::2], xp.asarray(weight)),
                 reference_linear(x[:, ::2], weight, None))
    y = naive.linear_forward(*on(xp, x[:, ::2].astype(np.float32), weight.astype(np.float32)))
    assert y.dtype == np.float32
    assert_close(y, reference_linear(x[:, ::2], weight, None), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_matches_reference(xp, rng, p):
    x, dy = rng.standard_normal((3, 5, 7)), rng.standard_normal((3, 5, 7))
    seed, offset = random_seed(rng), int(rng.integers(0, 2**40))
    y, mask = naive.dropout_forward(xp.asarray(x), p, seed, offset)
    y_ref, mask_ref = reference_dropout(x, p, seed, offset) if p < 1 else (x * 0, np.zeros(x.shape, bool))
    np.testing.assert_array_equal(to_numpy(mask), mask_ref)
    assert_close(y, y_ref)
    assert_close(naive.dropout_backward(xp.asarray(dy), mask, p), dy * mask_ref / (1 - p) if p < 1 else dy * 0)


# ----------------------------------------------------------------------------------------------
# GPU: one kernel per layer direction, as Caffe
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_one_kernel_per_layer_direction(naive_launches, rng):
    from minidnn import backend  # noqa: PLC0415

    cupy = backend.cupy()
    x = cupy.asarray(rng.standard_normal((2, 3, 9, 8)))
    y, indices = naive.max_pool2d_forward(x, 3, 2, 1, 1, True)
    naive.max_pool2d_backward(cupy.ones_like(y), indices, x.shape, 3, 2, 1, 1, True)
    y = naive.avg_pool2d_forward(x, 3, 2, 1, True, False)
    naive.avg_pool2d_backward(cupy.ones_like(y), x.shape, 3, 2, 1, True, False)
    y = naive.relu_forward(x)
    naive.relu_backward(x, y)
    y, scale = naive.lrn_forward(x, 5)
    naive.lrn_backward(x, x, y, scale, 5)
    assert naive_launches == ["max_pool_forward", "max_pool_backward", "avg_pool_forward", "avg_pool_backward",
                              "relu_forward", "relu_backward", "lrn_fill_scale", "lrn_compute_output",
                              "lrn_compute_diff"]
    naive_launches.clear()
    naive.max_pool2d_forward(x, 3, 1, 1, 2)  # dilated: plain array code (Caffe had no dilated pooling)
    naive.adaptive_avg_pool2d_forward(x, 2)
    naive.max_pool2d_backward(cupy.ones((2, 3, 4, 4)), indices[:, :, :4, :4], x.shape)  # no window: plain
    assert naive_launches == []
    naive.add_relu_forward(x, x)
    naive.batch_norm_forward_inference(x, None, None, cupy.zeros(3), cupy.ones(3), relu=True)
    assert naive_launches == ["relu_forward", "relu_forward"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_large_shapes_match_the_numpy_twins(rng, dtype):
    """More threads than one pass of the grid: the grid-stride loops cover every element."""
    from minidnn import backend  # noqa: PLC0415

    cupy = backend.cupy()
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    x = rng.standard_normal((64, 32, 37, 41)).astype(dtype)
    for window in [(3, 2, 1, 1, True), (2, None, 0, 1, False)]:
        y, indices = naive.max_pool2d_forward(cupy.asarray(x), *window)
        y_twin, indices_twin = naive.max_pool2d_forward(x, *window)
        assert_close(y, y_twin, **tolerance)
        np.testing.assert_array_equal(to_numpy(indices), indices_twin)
        dy = rng.standard_normal(y.shape).astype(dtype)
        assert_close(naive.max_pool2d_backward(cupy.asarray(dy), indices, x.shape, *window),
                     naive.max_pool2d_backward(dy, indices_twin, x.shape, *window), **tolerance)
    args = (3, 2, 1, True, True, None)
    y = naive.avg_pool2d_forward(cupy.asarray(x), *args)
    assert_close(y, naive.avg_pool2d_forward(x, *args), **tolerance)
    dy = rng.standard_normal(y.shape).astype(dtype)
    assert_close(naive.avg_pool2d_backward(cupy.asarray(dy), x.shape, *args),
                 naive.avg_pool2d_backward(dy, x.shape, *args), **tolerance)
    y, scale = naive.lrn_forward(cupy.asarray(x), 5)
    y_twin, scale_twin = naive.lrn_forward(x, 5)
    assert_close(y, y_twin, **tolerance)
    assert_close(scale, scale_twin, **tolerance)
    dy = rng.standard_normal(x.shape).astype(dtype)
    dx_tolerance = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else tolerance  # two terms of similar size
    assert_close(naive.lrn_backward(cupy.asarray(dy), cupy.asarray(x), y, scale, 5),
                 naive.lrn_backward(dy, x, y_twin, scale_twin, 5), **dx_tolerance)
    relu = naive.relu_forward(cupy.asarray(x))
    assert_close(relu, naive.relu_forward(x))
    assert_close(naive.relu_backward(cupy.asarray(dy), relu), naive.relu_backward(dy, to_numpy(relu)))
