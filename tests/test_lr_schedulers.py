"""Learning-rate schedules step by step against torch.optim.lr_scheduler for the same settings: LambdaLR,
OneCycleLR (with momentum and Adam's beta1), ReduceLROnPlateau, ConstantLR, ExponentialLR, warm-up by SequentialLR
and ChainedScheduler; resuming from state dicts; the arguments refused."""
import json
import math
import warnings

import numpy as np
import pytest

import minidnn
from minidnn import optim
from minidnn.optim import lr_scheduler

torch = pytest.importorskip("torch")


def make_optimizer(lib, kind, lrs):
    """An optimizer of ``kind`` with one parameter group per learning rate."""
    if lib is torch:
        groups = [{"params": [torch.zeros(2, requires_grad=True)], "lr": lr} for lr in lrs]
        return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9) if kind == "sgd" else torch.optim.Adam(groups)
    groups = [{"params": [minidnn.zeros(2, requires_grad=True)], "lr": lr} for lr in lrs]
    return optim.SGD(groups, lr=lrs[0], momentum=0.9) if kind == "sgd" else optim.Adam(groups)


def trajectory(lib, make, steps, kind="sgd", lrs=(0.1, 0.02), metrics=None):
    """[(lrs, momenta)] before each of ``steps`` steps, the schedule made by ``make(schedulers, optimizer)``."""
    optimizer = make_optimizer(lib, kind, lrs)
    schedules = torch.optim.lr_scheduler if lib is torch else lr_scheduler
    scheduler = make(schedules, optimizer)
    values = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's reminders about the step order
        for step in range(steps):
            momenta = [g["betas"][0] if "betas" in g else g["momentum"] for g in optimizer.param_groups]
            values.append(([g["lr"] for g in optimizer.param_groups], momenta))
            optimizer.step()
            scheduler.step(metrics[step]) if metrics is not None else scheduler.step()
    return values, scheduler, optimizer


def assert_same_trajectory(make, steps, **options):
    ours, our_scheduler, _ = trajectory(minidnn, make, steps, **options)
    theirs, their_scheduler, _ = trajectory(torch, make, steps, **options)
    for step, ((lrs, momenta), (their_lrs, their_momenta)) in enumerate(zip(ours, theirs)):
        assert lrs == pytest.approx(their_lrs, rel=1e-12, abs=1e-15), f"lr at step {step}"
        assert momenta == pytest.approx(their_momenta, rel=1e-12), f"momentum at step {step}"
    assert our_scheduler.get_last_lr() == pytest.approx(their_scheduler.get_last_lr(), rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# Closed-form schedules
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda s, o: s.LambdaLR(o, lambda t: 0.95 ** t + (t % 3) * 0.1),
    lambda s, o: s.LambdaLR(o, [lambda t: 1 / (t + 1), lambda t: min(1.0, (t + 1) / 4)]),
    lambda s, o: s.ConstantLR(o, factor=0.25, total_iters=4),
    lambda s, o: s.ExponentialLR(o, gamma=0.8),
    lambda s, o: s.SequentialLR(o, [s.LinearLR(o, start_factor=0.1, total_iters=4),
                                    s.CosineAnnealingLR(o, T_max=9, eta_min=1e-3)], milestones=[4]),
    lambda s, o: s.SequentialLR(o, [s.ConstantLR(o, factor=0.5, total_iters=3), s.ExponentialLR(o, gamma=0.7),
                                    s.StepLR(o, 2, gamma=0.5)], milestones=[3, 7]),
], ids=["lambda", "lambdas per group", "constant", "exponential", "warm-up then cosine", "three in sequence"])
def test_closed_form_schedules_match_torch(make):
    assert_same_trajectory(make, 15)


# ----------------------------------------------------------------------------------------------
# OneCycleLR
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, options", [
    ("sgd", {"max_lr": 0.5, "total_steps": 17}),
    ("sgd", {"max_lr": [0.5, 0.05], "epochs": 3, "steps_per_epoch": 6, "anneal_strategy": "linear"}),
    ("sgd", {"max_lr": 1.0, "total_steps": 20, "three_phase": True, "pct_start": 0.25, "div_factor": 10.0,
             "final_div_factor": 100.0}),
    ("adam", {"max_lr": 3e-3, "total_steps": 12, "base_momentum": [0.8, 0.7], "max_momentum": 0.9}),
    ("sgd", {"max_lr": 0.2, "total_steps": 9, "cycle_momentum": False}),
], ids=["cos", "linear per group", "three phases", "adam beta1", "no momentum"])
def test_one_cycle_matches_torch_rates_and_momenta(kind, options):
    steps = options.get("total_steps") or options["epochs"] * options["steps_per_epoch"]
    assert_same_trajectory(lambda s, o: s.OneCycleLR(o, **options), steps, kind=kind)


def test_one_cycle_refuses_stepping_past_the_end_and_bad_settings():
    optimizer = make_optimizer(minidnn, "sgd", (0.1,))
    scheduler = lr_scheduler.OneCycleLR(optimizer, 1.0, total_steps=3)
    for _ in range(3):
        scheduler.step()
    with pytest.raises(ValueError, match="Tried to step 4 times. The specified number of total steps is 3"):
        scheduler.step()
    with pytest.raises(ValueError, match="either total_steps OR"):
        lr_scheduler.OneCycleLR(optimizer, 1.0)
    with pytest.raises(ValueError, match="anneal_strategy"):
        lr_scheduler.OneCycleLR(optimizer, 1.0, total_steps=5, anneal_strategy="cosine")
    with pytest.raises(ValueError, match="max_lr must have the same length as optimizer.param_groups"):
        lr_scheduler.OneCycleLR(optimizer, [1.0, 2.0], total_steps=5)

    class Plain(optim.Optimizer):
        def step(self):
            pass

    with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
        lr_scheduler.OneCycleLR(Plain([minidnn.zeros(1, requires_grad=True)], {"lr": 0.1}), 1.0, total_steps=5)


# ----------------------------------------------------------------------------------------------
# ReduceLROnPlateau
# ----------------------------------------------------------------------------------------------
PLATEAUS = [1.0, 0.9, 0.9, 0.91, 0.9, 0.95, 0.89, 0.9, 0.9, 0.9, 0.9, 0.5, 0.5, 0.5, 0.5, 0.5, 0.49999, 0.5, 0.5,
            0.5]


@pytest.mark.parametrize("options, metrics", [
    ({"patience": 2}, PLATEAUS),
    ({"mode": "max", "factor": 0.5, "patience": 1, "threshold": 0.05, "threshold_mode": "abs"}, [-m for m in PLATEAUS]),
    ({"patience": 0, "cooldown": 2, "factor": 0.3, "min_lr": [0.01, 0.001]}, PLATEAUS),
    ({"patience": 1, "factor": 0.999, "eps": 1e-3}, PLATEAUS),
], ids=["min rel", "max abs", "cooldown and floors", "eps skips tiny cuts"])
def test_reduce_on_plateau_matches_torch(options, metrics):
    assert_same_trajectory(lambda s, o: s.ReduceLROnPlateau(o, **options), len(metrics), metrics=metrics)


def test_reduce_on_plateau_takes_a_tensor_metric_and_refuses_bad_settings():
    optimizer = make_optimizer(minidnn, "sgd", (0.1,))
    scheduler = lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    scheduler.step(minidnn.tensor(1.0))
    scheduler.step(minidnn.tensor(2.0))
    assert scheduler.get_last_lr() == pytest.approx([0.01])
    with pytest.raises(ValueError, match="factor should be < 1.0"):
        lr_scheduler.ReduceLROnPlateau(optimizer, factor=1.0)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        lr_scheduler.ReduceLROnPlateau(optimizer, mode="lowest")
    with pytest.raises(ValueError, match="min_lr must have the same length"):
        lr_scheduler.ReduceLROnPlateau(optimizer, min_lr=[0.1, 0.2])
    with pytest.raises(ValueError, match="does not support ReduceLROnPlateau"):
        lr_scheduler.SequentialLR(optimizer, [scheduler, lr_scheduler.StepLR(optimizer, 2)], milestones=[2])


# ----------------------------------------------------------------------------------------------
# ChainedScheduler
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda s, o: s.ChainedScheduler([s.LinearLR(o, start_factor=0.2, total_iters=5), s.ExponentialLR(o, gamma=0.9)]),
    lambda s, o: s.ChainedScheduler([s.ConstantLR(o, factor=0.1, total_iters=3), s.StepLR(o, 4, gamma=0.5)]),
    lambda s, o: s.ChainedScheduler([s.LinearLR(o, start_factor=0.5, total_iters=3),
                                     s.CosineAnnealingLR(o, T_max=6, eta_min=0.005)]),
    lambda s, o: s.ChainedScheduler([s.LambdaLR(o, lambda t: 1 / (1 + t)), s.MultiStepLR(o, [2, 5, 5], gamma=0.5)]),
    lambda s, o: s.ChainedScheduler([s.StepLR(o, 3, gamma=0.5), s.LambdaLR(o, lambda t: 0.9 ** t)], optimizer=o),
    lambda s, o: s.ChainedScheduler([s.ExponentialLR(o, gamma=0.9), s.LinearLR(o, start_factor=0.5, total_iters=3)]),
], ids=["warm-up and exponential decay", "constant warm-up and steps", "warm-up and cosine past T_max",
        "lambda then milestones", "steps then lambda", "warm-up last"])
def test_chained_schedules_match_torch(make):
    assert_same_trajectory(make, 16)


def test_chained_scheduler_refuses_what_it_cannot_chain():
    optimizer, other = make_optimizer(minidnn, "sgd", (0.1,)), make_optimizer(minidnn, "sgd", (0.1,))
    plateau = lr_scheduler.ReduceLROnPlateau(optimizer)
    with pytest.raises(ValueError, match="does not support ReduceLROnPlateau"):
        lr_scheduler.ChainedScheduler([lr_scheduler.StepLR(optimizer, 2), plateau])
    with pytest.raises(ValueError, match="same optimizer"):
        lr_scheduler.ChainedScheduler([lr_scheduler.StepLR(optimizer, 2), lr_scheduler.StepLR(other, 2)])
    with pytest.raises(ValueError, match="at least one scheduler"):
        lr_scheduler.ChainedScheduler([])


# ----------------------------------------------------------------------------------------------
# Resuming
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, metrics", [
    (lambda s, o: s.OneCycleLR(o, 0.4, total_steps=14), None),
    (lambda s, o: s.ChainedScheduler([s.LinearLR(o, start_factor=0.25, total_iters=4), s.ExponentialLR(o, 0.8)]),
     None),
    (lambda s, o: s.ReduceLROnPlateau(o, patience=1, cooldown=1), PLATEAUS[:14]),
    (lambda s, o: s.LambdaLR(o, lambda t: 0.9 ** t), None),
], ids=["one cycle", "chained", "plateau", "lambda"])
def test_resuming_from_state_dicts_continues_the_same_schedule(make, metrics):
    whole, _, _ = trajectory(minidnn, make, 14, metrics=metrics)
    first, scheduler, optimizer = trajectory(minidnn, make, 6, metrics=metrics)
    scheduler_state, optimizer_state = scheduler.state_dict(), optimizer.state_dict()
    json.dumps(scheduler_state)  # nothing a checkpoint's JSON could not hold (no functions)
    restored_optimizer = make_optimizer(minidnn, "sgd", (0.1, 0.02))
    restored = make(lr_scheduler, restored_optimizer)
    restored_optimizer.load_state_dict(optimizer_state)
    restored.load_state_dict(scheduler_state)
    rest = []
    for step in range(6, 14):
        rest.append([g["lr"] for g in restored_optimizer.param_groups])
        restored_optimizer.step()
        restored.step(metrics[step]) if metrics is not None else restored.step()
    np.testing.assert_allclose([lrs for lrs, _ in first] + rest, [lrs for lrs, _ in whole], rtol=1e-15)


def test_lambda_lr_checks_its_functions():
    optimizer = make_optimizer(minidnn, "sgd", (0.1, 0.2))
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        lr_scheduler.LambdaLR(optimizer, [lambda t: 1.0])
    with pytest.raises(TypeError, match="lr_lambda must be a function"):
        lr_scheduler.LambdaLR(optimizer, 0.5)
    with pytest.raises(ValueError, match="factor must be in"):
        lr_scheduler.ConstantLR(optimizer, factor=1.5)
    assert math.isclose(lr_scheduler.ExponentialLR(optimizer, 0.5).get_last_lr()[1], 0.2)
    assert np.isfinite(lr_scheduler.ConstantLR(optimizer, factor=0.5).get_last_lr()).all()
