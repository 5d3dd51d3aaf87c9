"""Optimizers and schedules against hand-written update rules (and PyTorch when installed)."""
import math

import numpy as np
import pytest

import minidnn
from minidnn import optim
from minidnn.optim import lr_scheduler


def run(optimizer_class, grads, start, **options):
    p = minidnn.tensor(start.copy(), requires_grad=True)
    optimizer = optimizer_class([p], **options)
    for g in grads:
        p.grad = minidnn.tensor(g)
        optimizer.step()
    return p.numpy()


def sgd_reference(grads, p, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    p, buffer = p.copy(), None
    for g in grads:
        g = g + weight_decay * p
        if momentum:
            buffer = g.copy() if buffer is None else momentum * buffer + (1 - dampening) * g
            g = g + momentum * buffer if nesterov else buffer
        p = p - lr * g
    return p


def adam_reference(grads, p, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False, amsgrad=False):
    p, m, v, v_max = p.copy(), 0.0, 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        v_max = np.maximum(v_max, v) if amsgrad else v
        m_hat, v_hat = m / (1 - betas[0] ** t), v_max / (1 - betas[1] ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


@pytest.fixture
def grads(rng):
    return [rng.standard_normal((3, 4)) for _ in range(6)]


@pytest.mark.parametrize("options", [
    dict(lr=0.1), dict(lr=0.1, momentum=0.9), dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
    dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-3),
])
def test_sgd_matches_the_pytorch_rule(grads, rng, options):
    start = rng.standard_normal((3, 4))
    np.testing.assert_allclose(run(optim.SGD, grads, start, **options), sgd_reference(grads, start, **options),
                               rtol=1e-12)


@pytest.mark.parametrize("options", [dict(lr=0.01), dict(lr=0.02, weight_decay=0.1), dict(lr=0.01, amsgrad=True),
                                     dict(lr=0.01, betas=(0.5, 0.9), eps=1e-3)])
def test_adam_and_adamw(grads, rng, options):
    start = rng.standard_normal((3, 4))
    np.testing.assert_allclose(run(optim.Adam, grads, start, **options), adam_reference(grads, start, **options),
                               rtol=1e-12)
    adamw = dict(options, weight_decay=options.get("weight_decay", 0.05))
    np.testing.assert_allclose(run(optim.AdamW, grads, start, **adamw),
                               adam_reference(grads, start, decoupled=True, **adamw), rtol=1e-12)


def test_against_pytorch(grads, rng):
    torch = pytest.importorskip("torch")
    start = rng.standard_normal((3, 4))
    for ours, theirs, options in [(optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
                                  (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, amsgrad=True))]:
        p = torch.tensor(start.copy(), requires_grad=True)
        optimizer = theirs([p], **options)
        for g in grads:
            p.grad = torch.tensor(g)
            optimizer.step()
        np.testing.assert_allclose(run(ours, grads, start, **options), p.detach().numpy(), rtol=1e-10)


def test_parameters_without_grad_are_skipped_and_groups_have_own_lr():
    a = minidnn.tensor([1.0], requires_grad=True)
    b = minidnn.tensor([1.0], requires_grad=True)
    optimizer = optim.SGD([{"params": [a]}, {"params": [b], "lr": 1.0}], lr=0.1)
    a.grad, b.grad = minidnn.tensor([1.0]), None
    optimizer.step()
    assert a.item() == pytest.approx(0.9) and b.item() == 1.0
    b.grad = minidnn.tensor([1.0])
    optimizer.step()
    assert b.item() == pytest.approx(0.0)
    optimizer.zero_grad()
    assert a.grad is None


def test_optimizer_state_dict_round_trip(grads, rng):
    start = rng.standard_normal((3, 4))
    p = minidnn.tensor(start.copy(), requires_grad=True)
    first = optim.Adam([p], lr=0.01)
    for g in grads[:3]:
        p.grad = minidnn.tensor(g)
        first.step()
    state = first.state_dict()
    assert state["state"][0]["step"] == 3 and state["param_groups"][0]["params"] == [0]
    second = optim.Adam([p], lr=0.5)
    second.load_state_dict(state)
    assert second.param_groups[0]["lr"] == 0.01
    for g in grads[3:]:
        p.grad = minidnn.tensor(g)
        second.step()
    np.testing.assert_allclose(p.numpy(), adam_reference(grads, start, lr=0.01), rtol=1e-12)


@pytest.mark.parametrize("make, error", [
    (lambda p: optim.SGD(p, lr=-0.1), "lr must be a finite number >= 0, got -0.1"),
    (lambda p: optim.SGD(p, lr=0.1, nesterov=True), "nesterov"),
    (lambda p: optim.Adam(p, betas=(0.9, 1.0)), "betas"),
    (lambda p: optim.SGD([], lr=0.1), "empty parameter list"),
    (lambda p: optim.SGD(p[0], lr=0.1), "not a single tensor"),
])
def test_optimizer_errors(make, error):
    with pytest.raises((ValueError, TypeError), match=error):
        make([minidnn.tensor([1.0], requires_grad=True)])


@pytest.mark.parametrize("make, message", [
    (lambda p: optim.SGD(p, lr=float("nan")), "lr must be a finite number >= 0, got nan"),
    (lambda p: optim.SGD(p, lr=float("inf")), "lr must be a finite number >= 0, got inf"),
    (lambda p: optim.SGD(p, lr=0.1, momentum=float("nan")), "momentum must be a finite number"),
    (lambda p: optim.SGD(p, lr=0.1, dampening=-0.5), "dampening must be a finite number >= 0"),
    (lambda p: optim.SGD(p, lr=0.1, weight_decay=float("-inf")), "weight_decay must be a finite number"),
    (lambda p: optim.SGD(p, lr="0.1"), "lr must be a finite number >= 0, got '0.1'"),
    (lambda p: optim.SGD(p, lr=True), "lr must be a finite number"),
    (lambda p: optim.Adam(p, lr=float("nan")), "lr must be a finite number"),
    (lambda p: optim.Adam(p, eps=float("nan")), "eps must be a finite number"),
    (lambda p: optim.AdamW(p, weight_decay=-1e-2), "weight_decay must be a finite number >= 0"),
    (lambda p: optim.Adam(p, betas=(float("nan"), 0.999)), r"betas\[0\] must be a finite number >= 0 and < 1"),
    (lambda p: optim.Adam(p, betas=(0.9, 1.0)), r"betas\[1\] must be a finite number >= 0 and < 1, got 1.0"),
    (lambda p: optim.SGD([{"params": p, "lr": float("nan")}], lr=0.1), "lr must be a finite number >= 0, got nan"),
    (lambda p: optim.Adam([{"params": p, "weight_decay": -1.0}]), "weight_decay must be a finite number"),
])
def test_optimizers_refuse_non_finite_and_negative_hyperparameters(make, message):
    # NaN passes a plain `value < 0` test; an optimizer built with it trains on NaN without a word.
    with pytest.raises(ValueError, match=message):
        make([minidnn.tensor([1.0], requires_grad=True)])


def test_optimizers_refuse_a_parameter_listed_twice():
    p, q = minidnn.tensor([1.0], requires_grad=True), minidnn.tensor([2.0], requires_grad=True)
    with pytest.raises(ValueError, match="appears more than once in a parameter group"):
        optim.SGD([p, q, p], lr=0.1)  # would be stepped twice per step()
    with pytest.raises(ValueError, match="appears more than once"):
        optim.Adam([{"params": [q, q]}])
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [p]}, {"params": [q, p]}], lr=0.1)
    optimizer = optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optimizer.add_param_group({"params": [p]})


def lrs(scheduler, optimizer, steps):
    values = []
    for _ in range(steps):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


@pytest.fixture
def sgd():
    return optim.SGD([minidnn.tensor([1.0], requires_grad=True)], lr=0.5)


def test_step_and_multistep(sgd):
    assert lrs(lr_scheduler.StepLR(sgd, 2, gamma=0.5), sgd, 6) == [0.5, 0.5, 0.25, 0.25, 0.125, 0.125]


def test_multistep(sgd):
    assert lrs(lr_scheduler.MultiStepLR(sgd, [1, 3], gamma=0.1), sgd, 4) == pytest.approx([0.5, 0.05, 0.05, 0.005])


def test_cosine_and_warmup_then_cosine(sgd):
    values = lrs(lr_scheduler.CosineAnnealingLR(sgd, T_max=4, eta_min=0.1), sgd, 5)
    assert values == pytest.approx([0.1 + 0.4 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(5)])
    optimizer = optim.SGD([minidnn.tensor([1.0], requires_grad=True)], lr=1.0)
    warmup = lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=3)
    cosine = lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
    schedule = lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[3])
    assert lrs(schedule, optimizer, 7) == pytest.approx([0.25, 0.5, 0.75, 1.0, 0.8535533905932737, 0.5,
                                                          0.14644660940672627])


def test_schedules_match_pytorch():
    torch = pytest.importorskip("torch")
    p = torch.zeros(1, requires_grad=True)
    theirs = torch.optim.SGD([p], lr=0.5)
    their_schedule = torch.optim.lr_scheduler.MultiStepLR(theirs, [2, 5], gamma=0.3)
    ours = optim.SGD([minidnn.tensor([0.0], requires_grad=True)], lr=0.5)
    values = lrs(lr_scheduler.MultiStepLR(ours, [2, 5], gamma=0.3), ours, 7)
    expected = []
    for _ in range(7):
        expected.append(theirs.param_groups[0]["lr"])
        theirs.step()
        their_schedule.step()
    assert values == pytest.approx(expected)


def test_scheduler_state_dict_resumes(sgd):
    schedule = lr_scheduler.StepLR(sgd, 2, gamma=0.5)
    lrs(schedule, sgd, 3)
    state = schedule.state_dict()
    optimizer = optim.SGD([minidnn.tensor([1.0], requires_grad=True)], lr=0.5)
    restored = lr_scheduler.StepLR(optimizer, 2, gamma=0.5)
    restored.load_state_dict(state)
    restored.step()
    assert restored.get_last_lr() == [0.125] and restored.last_epoch == 4


def test_scheduler_errors(sgd):
    with pytest.raises(ValueError, match="step_size"):
        lr_scheduler.StepLR(sgd, 0)
    with pytest.raises(ValueError, match="milestones"):
        lr_scheduler.MultiStepLR(sgd, [3, 1])
    with pytest.raises(TypeError, match="Optimizer"):
        lr_scheduler.StepLR(object(), 1)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_update_primitives_on_each_device(xp, rng, dtype, rtol):
    """The primitives themselves: NumPy here, the fused CUDA kernels of optimizer.cu on a GPU."""
    from minidnn.primitives import adam_update, sgd_update

    start = rng.standard_normal((7, 33))
    grads = [rng.standard_normal((7, 33)) for _ in range(4)]
    p, buffer = xp.asarray(start.astype(dtype)), xp.zeros(start.shape, dtype)
    for i, g in enumerate(grads):
        sgd_update(p, xp.asarray(g.astype(dtype)), buffer, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True,
                   first_step=i == 0)
    expected = sgd_reference(grads, start, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    np.testing.assert_allclose(backend_to_numpy(p), expected, rtol=rtol, atol=rtol)
    for decoupled in (False, True):
        p = xp.asarray(start.astype(dtype))
        m, v, v_max = (xp.zeros(start.shape, dtype) for _ in range(3))
        for t, g in enumerate(grads, start=1):
            adam_update(p, xp.asarray(g.astype(dtype)), m, v, step=t, lr=0.01, weight_decay=0.1,
                        decoupled_weight_decay=decoupled, amsgrad=True, max_exp_avg_sq=v_max)
        expected = adam_reference(grads, start, lr=0.01, weight_decay=0.1, decoupled=decoupled, amsgrad=True)
        np.testing.assert_allclose(backend_to_numpy(p), expected, rtol=rtol * 10, atol=rtol * 10)


def backend_to_numpy(array):
    return minidnn.backend.to_device(array, "cpu")


# ----------------------------------------------------------------------------------------------
# step(): one multi-tensor update per batch of parameters, the learning rate on the device
# ----------------------------------------------------------------------------------------------
def device_of(xp):
    return "cpu" if xp is np else "cuda"


def count_calls(monkeypatch, name):
    """Record (number of params, dtype, first_step or step) of each call of the primitive ``name``."""
    from minidnn import primitives

    calls, original = [], getattr(primitives, name)

    def wrapper(params, *args, **kwargs):
        calls.append((len(params), str(params[0].dtype), kwargs.get("first_step", kwargs.get("step"))))
        return original(params, *args, **kwargs)

    monkeypatch.setattr(primitives, name, wrapper)
    return calls


def test_sgd_step_updates_each_dtype_and_first_step_batch_in_one_call(xp, rng, monkeypatch):
    """Parameters of two dtypes, one without a gradient, one whose gradients start a step late (its own first
    step), one with a strided gradient: each batch is one call, and every parameter follows the PyTorch rule."""
    calls = count_calls(monkeypatch, "sgd_update_multi")
    shapes = [(3, 4), (5,), (2, 3), (), (4, 2)]
    dtypes = [np.float64, np.float32, np.float64, np.float64, np.float64]
    starts = [rng.standard_normal(shape).astype(dtype) for shape, dtype in zip(shapes, dtypes)]
    params = [minidnn.tensor(s, device=device_of(xp), requires_grad=True) for s in starts]
    options = dict(lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.01)
    optimizer = optim.SGD(params, **options)
    grads = [[rng.standard_normal(shape).astype(dtype) for _ in range(3)] for shape, dtype in zip(shapes, dtypes)]
    for step in range(3):
        for i, p in enumerate(params):
            late = i == 2 and step == 0
            p.grad = None if i == 3 or late else minidnn.Tensor(xp.asarray(grads[i][step]))
        params[4].grad = minidnn.Tensor(xp.asarray(np.ascontiguousarray(grads[4][step].T)).T)  # a strided view
        optimizer.step()
    assert calls == [(2, "float64", True), (1, "float32", True),  # step 1
                     (2, "float64", False), (1, "float32", False), (1, "float64", True),  # param 2's first step
                     (3, "float64", False), (1, "float32", False)]
    for i, p in enumerate(params):
        used = [] if i == 3 else grads[i][1:] if i == 2 else grads[i]
        expected = sgd_reference([g.astype(np.float64) for g in used], starts[i].astype(np.float64), **options)
        tolerance = 1e-12 if dtypes[i] == np.float64 else 2e-6
        np.testing.assert_allclose(p.numpy(), expected, rtol=tolerance, atol=tolerance, err_msg=f"param {i}")
    assert set(optimizer.state_dict()["state"][0]) == {"momentum_buffer"}


def test_adam_step_batches_parameters_by_step_count(xp, rng, monkeypatch):
    calls = count_calls(monkeypatch, "adam_update_multi")
    starts = [rng.standard_normal((3, 2)), rng.standard_normal(4)]
    params = [minidnn.tensor(s, device=device_of(xp), requires_grad=True) for s in starts]
    optimizer = optim.AdamW(params, lr=0.01, amsgrad=True)
    grads = [[rng.standard_normal(s.shape) for _ in range(3)] for s in starts]
    for step in range(3):
        for i, p in enumerate(params):
            p.grad = None if i == 1 and step == 0 else minidnn.tensor(grads[i][step], device=device_of(xp))
        optimizer.step()
    assert calls == [(1, "float64", 1), (1, "float64", 2), (1, "float64", 1), (1, "float64", 3), (1, "float64", 2)]
    for i, p in enumerate(params):
        used = grads[i][1:] if i == 1 else grads[i]
        expected = adam_reference(used, starts[i], lr=0.01, weight_decay=1e-2, decoupled=True, amsgrad=True)
        np.testing.assert_allclose(p.numpy(), expected, rtol=1e-12, err_msg=f"param {i}")
    state = optimizer.state_dict()["state"]
    assert set(state[0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"} and state[1]["step"] == 2


def test_learning_rate_changes_follow_into_the_step(xp, rng):
    """A schedule changes lr between steps; on a GPU step() refreshes its device copy of lr each time."""
    start = rng.standard_normal((3, 5))
    p = minidnn.tensor(start, device=device_of(xp), requires_grad=True)
    optimizer = optim.SGD([p], lr=0.4, momentum=0.9)
    schedule = lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    expected, buffer = start.copy(), None
    for step in range(4):
        g = rng.standard_normal(start.shape)
        p.grad = minidnn.tensor(g, device=device_of(xp))
        optimizer.step()
        schedule.step()
        buffer = g if buffer is None else 0.9 * buffer + g
        expected -= 0.4 * 0.5 ** step * buffer
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-12)
    optimizer.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got -1.0"):
        optimizer.step()


@pytest.mark.gpu
def test_gpu_captured_step_follows_lr_refreshed_between_replays(rng):
    """The contract of refresh_device_hyperparameters(): refresh, capture step(), then after each schedule
    change refresh and replay. The replays use the new learning rates with no new capture."""
    cupy = minidnn.backend.cupy()
    starts = [rng.standard_normal((3, 5)), rng.standard_normal(7)]
    params = [minidnn.tensor(s, device="cuda", requires_grad=True) for s in starts]
    optimizer = optim.SGD(params, lr=0.4, momentum=0.9, nesterov=True)
    schedule = lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    grads = [rng.standard_normal(s.shape) for s in starts]
    for p, g in zip(params, grads):
        p.grad = minidnn.tensor(g, device="cuda")
    optimizer.step()  # the first step creates the momentum buffers; later steps are the same launches
    schedule.step()
    optimizer.refresh_device_hyperparameters()
    cupy.cuda.Device().synchronize()  # the work queued so far, on the default stream, is done
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # the refreshes too: a non-blocking stream does not wait for the default stream
        stream.begin_capture()
        optimizer.step()
        graph = stream.end_capture()
        rates = [0.4]
        for _ in range(3):
            rates.append(optimizer.param_groups[0]["lr"])
            graph.launch(stream=stream)
            schedule.step()
            optimizer.refresh_device_hyperparameters()
        stream.synchronize()
    for p, start, g in zip(params, starts, grads):
        expected, buffer = start.copy(), None
        for rate in rates:
            buffer = g if buffer is None else 0.9 * buffer + g
            expected -= rate * (g + 0.9 * buffer)
        np.testing.assert_allclose(p.numpy(), expected, rtol=1e-12)
