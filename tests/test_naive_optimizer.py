"""The naive engine's optimizer updates (Caffe's solvers with PyTorch's arithmetic) against the hand-written
PyTorch rules of test_optim.py, one parameter and lists of them, and, on the GPU, Caffe's passes per
parameter: Regularize (when needed), SGDUpdate or AdamUpdate, Update."""
import numpy as np
import pytest

from minidnn import naive
from test_optim import adam_reference, sgd_reference
from tests.helpers import assert_close

SGD_CASES = [dict(lr=0.1), dict(lr=0.1, momentum=0.9), dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
             dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-3), dict(lr=0.1, weight_decay=0.1),
             dict(lr=0.07, momentum=0.5, weight_decay=0.02, maximize=True)]
ADAM_CASES = [dict(lr=0.01), dict(lr=0.02, weight_decay=0.1), dict(lr=0.01, amsgrad=True),
              dict(lr=0.01, betas=(0.5, 0.9), eps=1e-3, maximize=True),
              dict(lr=0.02, weight_decay=0.05, decoupled=True, amsgrad=True)]


def sgd_expected(grads, start, options):
    """The PyTorch rule; maximize is the rule on the negated gradients."""
    options = dict(options)
    if options.pop("maximize", False):
        grads = [-g for g in grads]
    return sgd_reference(grads, start, **options)


def adam_expected(grads, start, options):
    options = dict(options)
    if options.pop("maximize", False):
        grads = [-g for g in grads]
    return adam_reference(grads, start, **options)


def sgd_keywords(options):
    return dict(dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False), **options)


def adam_keywords(options):
    options = dict(options)
    beta1, beta2 = options.pop("betas", (0.9, 0.999))
    return dict(dict(eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False), beta1=beta1, beta2=beta2,
                decoupled_weight_decay=options.pop("decoupled", False), **options)


@pytest.mark.parametrize("options", SGD_CASES)
def test_sgd_matches_the_pytorch_rule(poisoned, rng, options):
    xp = poisoned
    grads, start = [rng.standard_normal((3, 5)) for _ in range(5)], rng.standard_normal((3, 5))
    param = xp.array(start)
    buffer = xp.zeros_like(param) if options.get("momentum") else None
    for step, grad in enumerate(grads):
        device_grad = xp.array(grad)
        naive.sgd_update(param, device_grad, buffer, first_step=step == 0, **sgd_keywords(options))
        assert_close(device_grad, grad, rtol=0, atol=0, name="the gradient is left alone")
    assert_close(param, sgd_expected(grads, start, options), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("options", ADAM_CASES)
def test_adam_matches_the_pytorch_rule(poisoned, rng, options):
    xp = poisoned
    grads, start = [rng.standard_normal((4, 3)) for _ in range(6)], rng.standard_normal((4, 3))
    param, exp_avg, exp_avg_sq, maximum = xp.array(start), xp.zeros((4, 3)), xp.zeros((4, 3)), xp.zeros((4, 3))
    for step, grad in enumerate(grads, start=1):
        device_grad = xp.array(grad)
        naive.adam_update(param, device_grad, exp_avg, exp_avg_sq, step=step, max_exp_avg_sq=maximum,
                          **adam_keywords(options))
        assert_close(device_grad, grad, rtol=0, atol=0, name="the gradient is left alone")
    assert_close(param, adam_expected(grads, start, options), rtol=1e-12, atol=1e-14)


def test_float32_updates_match_the_float64_rules(poisoned, rng):
    xp = poisoned
    grads, start = [rng.standard_normal(37).astype(np.float32) for _ in range(4)], rng.standard_normal(37)
    start = start.astype(np.float32)
    param, buffer = xp.array(start), xp.zeros(37, dtype=np.float32)
    options = dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    for step, grad in enumerate(grads):
        naive.sgd_update(param, xp.asarray(grad), buffer, first_step=step == 0, **sgd_keywords(options))
    assert param.dtype == np.float32
    assert_close(param, sgd_expected([g.astype(np.float64) for g in grads], start.astype(np.float64), options),
                 rtol=1e-5, atol=1e-6)
    param, m, v = xp.array(start), xp.zeros(37, dtype=np.float32), xp.zeros(37, dtype=np.float32)
    options = dict(lr=0.01, weight_decay=0.05, decoupled=True)
    for step, grad in enumerate(grads, start=1):
        naive.adam_update(param, xp.asarray(grad), m, v, step=step, **adam_keywords(options))
    assert_close(param, adam_expected([g.astype(np.float64) for g in grads], start.astype(np.float64), options),
                 rtol=1e-5, atol=1e-6)


SIZES = [(1,), (0,), (7, 3), (5,), (2, 3, 4), (1, 1)]


@pytest.mark.parametrize("options", SGD_CASES[1::2])
def test_sgd_over_a_list_updates_each_parameter_by_the_rule(poisoned, rng, options):
    xp = poisoned
    starts = [rng.standard_normal(shape) for shape in SIZES]
    grads = [[rng.standard_normal(shape) for shape in SIZES] for _ in range(4)]
    params, buffers = [xp.array(s) for s in starts], [xp.zeros(shape) for shape in SIZES]
    for step, step_grads in enumerate(grads):
        lr = xp.asarray([options["lr"]]) if step % 2 else options["lr"]  # a rate kept on the device, or a float
        naive.sgd_update_multi(params, [xp.asarray(g) for g in step_grads], buffers, first_step=step == 0,
                               **dict(sgd_keywords(options), lr=lr))
    for index, (param, start) in enumerate(zip(params, starts)):
        assert_close(param, sgd_expected([g[index] for g in grads], start, options), rtol=1e-12, atol=1e-14)


def test_sgd_over_a_list_without_momentum_needs_no_buffers(poisoned, rng):
    xp = poisoned
    starts, grad = [rng.standard_normal(shape) for shape in SIZES], [rng.standard_normal(shape) for shape in SIZES]
    params = [xp.array(s) for s in starts]
    naive.sgd_update_multi(params, [xp.asarray(g) for g in grad], None, lr=0.5, momentum=0.0, dampening=0.0,
                           weight_decay=0.0, nesterov=False, maximize=False, first_step=True)
    for param, start, g in zip(params, starts, grad):
        assert_close(param, start - 0.5 * g)


@pytest.mark.parametrize("options", ADAM_CASES)
def test_adam_over_a_list_updates_each_parameter_by_the_rule(poisoned, rng, options):
    xp = poisoned
    starts = [rng.standard_normal(shape) for shape in SIZES]
    grads = [[rng.standard_normal(shape) for shape in SIZES] for _ in range(3)]
    params = [xp.array(s) for s in starts]
    state = [[xp.zeros(shape) for shape in SIZES] for _ in range(3)]
    amsgrad = options.get("amsgrad", False)
    for step, step_grads in enumerate(grads, start=1):
        # the step count and the rate as device arrays (int64, float64) on alternate steps
        counter = xp.asarray([step], dtype=np.int64 if step % 2 else np.float64) if step > 1 else step
        lr = xp.asarray([options["lr"]]) if step % 2 else options["lr"]
        naive.adam_update_multi(params, [xp.asarray(g) for g in step_grads], state[0], state[1],
                                state[2] if amsgrad else None, step=counter, **dict(adam_keywords(options), lr=lr))
    for index, (param, start) in enumerate(zip(params, starts)):
        assert_close(param, adam_expected([g[index] for g in grads], start, options), rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------------------------
# GPU: Caffe's passes per parameter
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("options, passes", [
    (dict(lr=0.1), ["sgd_update", "axpy"]),
    (dict(lr=0.1, momentum=0.9), ["sgd_update", "axpy"]),
    (dict(lr=0.1, momentum=0.9, weight_decay=1e-4), ["regularize", "sgd_update", "axpy"]),
    (dict(lr=0.1, maximize=True), ["regularize", "sgd_update", "axpy"]),
])
def test_sgd_runs_caffes_passes_per_parameter(naive_launches, options, passes):
    from minidnn import backend  # noqa: PLC0415

    cupy = backend.cupy()
    params = [cupy.ones(shape) for shape in SIZES]
    naive.sgd_update_multi(params, [cupy.ones(shape) for shape in SIZES], [cupy.zeros(shape) for shape in SIZES],
                           first_step=False, **sgd_keywords(options))
    assert naive_launches == passes * len(SIZES)


@pytest.mark.gpu
@pytest.mark.parametrize("options, passes", [
    (dict(lr=0.1), ["adam_update", "axpy"]),
    (dict(lr=0.1, weight_decay=0.1), ["regularize", "adam_update", "axpy"]),
    (dict(lr=0.1, weight_decay=0.1, decoupled=True), ["scal", "adam_update", "axpy"]),
    (dict(lr=0.1, weight_decay=0.1, decoupled=True, maximize=True), ["scal", "regularize", "adam_update", "axpy"]),
])
def test_adam_runs_caffes_passes_per_parameter(naive_launches, options, passes):
    from minidnn import backend  # noqa: PLC0415

    cupy = backend.cupy()
    params = [cupy.ones(shape) for shape in SIZES]
    zeros = [[cupy.zeros(shape) for shape in SIZES] for _ in range(3)]
    naive.adam_update_multi(params, [cupy.ones(shape) for shape in SIZES], *zeros, step=3, **adam_keywords(options))
    assert naive_launches == passes * len(SIZES)
