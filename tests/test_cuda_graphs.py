"""The captured training step: the same training as eager, bit for bit, with new masks and rates per replay."""
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import minidnn.nn as nn
from minidnn import backend, optim
from minidnn.cuda import graphs
from minidnn.primitives import conv


def small_model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.ReLU(inplace=True),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(16, 5))


def make_run(seed=0):
    """A model, an optimizer, a schedule and a step function, all seeded alike."""
    minidnn.manual_seed(seed)
    model = small_model().to("cuda")
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4, nesterov=True)
    schedule = optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return model, optimizer, schedule, step


def batches(count, rng):
    return [(minidnn.tensor(rng.standard_normal((6, 3, 8, 8)).astype(np.float32), device="cuda"),
             minidnn.tensor(rng.integers(0, 5, 6), device="cuda")) for _ in range(count)]


@pytest.mark.gpu
def test_captured_training_equals_eager_bit_for_bit():
    data = batches(6, np.random.default_rng(1))
    with conv.settings(algo="gemm"):  # deterministic kernels: bitwise equality is the claim
        model, optimizer, schedule, step = make_run()
        eager_losses = [step(*data[0]).item(), step(*data[0]).item()]  # what capture's two warm-ups do
        for x, y in data[1:]:
            eager_losses.append(step(x, y).item())
            schedule.step()  # the rate changes between steps: replays must read the new one
        eager = {k: v.numpy() for k, v in model.state_dict().items()}

        model, optimizer, schedule, step = make_run()
        captured = graphs.capture(step, data[0], warmup=2)
        assert isinstance(captured, graphs.CapturedStep), getattr(captured, "reason", "")
        losses = []
        for x, y in data[1:]:
            losses.append(captured(x, y).item())
            schedule.step()
    assert losses == eager_losses[2:]
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), eager[key], err_msg=key)


@pytest.mark.gpu
def test_each_replay_draws_new_dropout_masks_and_reads_the_batch():
    x, y = batches(1, np.random.default_rng(2))[0]
    minidnn.manual_seed(0)
    layer = nn.Dropout(0.5).to("cuda")
    static = minidnn.tensor(np.ones((4, 64), np.float32), device="cuda")
    captured = graphs.capture(lambda t: layer(t) * 1.0, static, warmup=1)
    first = captured(static).numpy().copy()
    second = captured(static).numpy().copy()
    assert not np.array_equal(first, second)
    doubled = captured(minidnn.tensor(2 * np.ones((4, 64), np.float32), device="cuda")).numpy()
    assert set(np.unique(doubled)) <= {0.0, 4.0}


@pytest.mark.gpu
def test_a_new_shape_is_a_clear_error_and_an_uncapturable_step_runs_eagerly():
    model, optimizer, schedule, step = make_run()
    x, y = batches(1, np.random.default_rng(3))[0]
    captured = graphs.capture(step, (x, y))
    with pytest.raises(ValueError, match=r"recorded for a batch of shape \(6, 3, 8, 8\)"):
        captured(x[:3], y[:3])

    def reads_the_loss(x, y):
        loss = step(x, y)
        loss.item()  # a host read inside the step
        return loss

    with pytest.warns(RuntimeWarning, match="cannot be captured as a CUDA graph"):
        eager = graphs.capture(reads_the_loss, (x, y))
    assert isinstance(eager, graphs.EagerStep)
    assert np.isfinite(eager(x, y).item())


@pytest.mark.gpu
def test_the_graphs_private_pool_is_reported_and_the_default_pool_does_not_grow():
    x = minidnn.tensor(np.ones((64, 1024), np.float32), device="cuda")
    activations = 3 * x.data.nbytes  # three new (64, 1024) float32 arrays a step: x·2, +1, relu
    captured = graphs.capture(lambda t: ((t * 2.0) + 1.0).relu(), x, warmup=1)
    before = minidnn.cuda.memory_allocated()
    captured(x)
    minidnn.cuda.synchronize()
    assert minidnn.cuda.memory_allocated() == before  # a replay allocates nothing in the default pool
    assert captured.memory_bytes >= activations - x.data.nbytes  # at least the intermediates (the output too)
    assert graphs.EagerStep(lambda t: t, "test", None).memory_bytes == 0


@pytest.mark.gpu
def test_the_warm_up_steps_and_the_capture_plan_for_the_graph_and_eager_calls_after_do_not():
    """Convolutions planned inside capture weigh GPU time alone (no host between a graph's kernels); the step's
    calls after it plan as eager calls again."""
    data = batches(2, np.random.default_rng(3))
    _, _, _, step = make_run()
    planning = []

    def step_noting_the_mode(x, y):
        planning.append(conv.registry.planning_for_graph())
        return step(x, y)

    captured = graphs.capture(step_noting_the_mode, data[0], warmup=2)
    assert isinstance(captured, graphs.CapturedStep), getattr(captured, "reason", "")
    assert planning == [True, True, True]  # two warm-up steps and the capture
    assert not conv.registry.planning_for_graph()
    step_noting_the_mode(*data[1])
    assert planning[-1] is False


def test_capture_needs_the_gpu():
    if backend.cuda_is_available():
        with pytest.raises(ValueError, match="example batch must be on the GPU"):
            graphs.capture(lambda x: x, minidnn.zeros(2))
    else:
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            graphs.capture(lambda x: x, minidnn.zeros(2))


def test_a_changed_hyperparameter_other_than_lr_is_refused_before_a_replay():
    # On the CPU: the record and the check a captured step makes before each replay.
    weights = minidnn.zeros(3, requires_grad=True)
    optimizer = optim.SGD([weights], lr=0.1, momentum=0.9)
    recorded = graphs._fixed_hyperparameters([optimizer])
    optimizer.param_groups[0]["lr"] = 0.01  # lr is read from the device at every replay
    graphs._check_fixed_hyperparameters(recorded)
    optimizer.param_groups[0]["momentum"] = 0.85
    with pytest.raises(ValueError, match=r"SGD.param_groups\[0\]\['momentum'\] changed from 0.9 to 0.85"):
        graphs._check_fixed_hyperparameters(recorded)

    sgd = optim.SGD([minidnn.zeros(2, requires_grad=True)], lr=1e-3, momentum=0.9)
    recorded = graphs._fixed_hyperparameters([sgd])
    cycle = optim.lr_scheduler.OneCycleLR(sgd, max_lr=0.01, total_steps=10)  # starts momentum at max_momentum
    with pytest.raises(ValueError, match=r"\['momentum'\] changed from 0.9 to 0.95"):
        graphs._check_fixed_hyperparameters(recorded)
    recorded = graphs._fixed_hyperparameters([sgd])
    sgd.step()
    cycle.step()
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        graphs._check_fixed_hyperparameters(recorded)
    recorded = graphs._fixed_hyperparameters([sgd])
    sgd.add_param_group({"params": [minidnn.zeros(1, requires_grad=True)]})
    with pytest.raises(ValueError, match="2 parameter groups, the captured step was recorded with 1"):
        graphs._check_fixed_hyperparameters(recorded)


@pytest.mark.gpu
def test_a_captured_step_under_a_momentum_cycle_is_refused_and_without_it_follows_the_rates():
    model, optimizer, _, step = make_run()
    data = batches(3, np.random.default_rng(5))
    captured = graphs.capture(step, data[0])
    assert isinstance(captured, graphs.CapturedStep), getattr(captured, "reason", "")
    cycle = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    with pytest.raises(ValueError, match=r"\['momentum'\] changed"):
        captured(*data[1])

    model, optimizer, _, step = make_run()
    cycle = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10, cycle_momentum=False)
    captured = graphs.capture(step, data[0])
    for x, y in data[1:]:
        assert np.isfinite(captured(x, y).item())
        cycle.step()
