"""Learning-rate schedules with PyTorch's names and step semantics.

Call ``scheduler.step()`` after ``optimizer.step()`` (per epoch or per iteration, as you choose).
Each schedule is written in closed form: the learning rate at step t is a function of t and the
group's base rate, so a scheduler's whole state is ``last_epoch`` and resuming is exact. Two are
not, by nature: ``ReduceLROnPlateau`` follows a metric, and ``ChainedScheduler`` composes its
schedules step by step from the current rate, with the recursive forms PyTorch steps them by
(``_chained``), so that its rates are PyTorch's.

One optimizer, one scheduler: each step *sets* the rate, so two schedulers stepped side by side on
one optimizer do not compose as PyTorch's do (the last one stepped wins). Combine them with
``SequentialLR`` (one after the other) or ``ChainedScheduler`` (at once).
"""
from __future__ import annotations

import bisect
import math
import numbers
from typing import Any, Callable, Sequence

from .optimizer import Optimizer


class LRScheduler:
    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a minidnn Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, step: int, base_lr: float) -> float:
        """The learning rate after ``step`` calls of :meth:`step` (0: the initial one)."""
        raise NotImplementedError

    def lrs_at(self, step: int) -> list[float]:
        """Every group's learning rate after ``step`` calls of :meth:`step`."""
        return [self.lr_at(step, base_lr) for base_lr in self.base_lrs]

    def _apply(self, step: int) -> None:
        """Set the optimizer's groups to the schedule at ``step`` (OneCycleLR sets momentum too)."""
        for group, lr in zip(self.optimizer.param_groups, self.lrs_at(step)):
            group["lr"] = lr

    # The rate after ``step`` from the current ``lr``, as PyTorch's recursive (chainable) form computes
    # it: ``_chained(lr, step, base_lr) -> float``. A schedule without one leaves it None and, inside a
    # ChainedScheduler, sets its own values, as PyTorch's LambdaLR and OneCycleLR do there.
    _chained: Callable[[float, int, float], float] | None = None

    def _chain_step(self, step: int) -> None:
        """Step ``step`` inside a :class:`ChainedScheduler`, from the groups' current rates."""
        if self._chained is None:
            self._apply(step)
            return
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self._chained(group["lr"], step, base_lr)

    def step(self) -> None:
        self.last_epoch += 1
        self._apply(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {key: value for key, value in vars(self).items() if key != "optimizer" and not isinstance(value, LRScheduler)
                and not (isinstance(value, list) and value and isinstance(value[0], LRScheduler))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or "last_epoch" not in state_dict:
            raise ValueError("scheduler state_dict must be a dict from state_dict() with a 'last_epoch' entry")
        self.__dict__.update(state_dict)


def _check_positive(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_non_negative(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise ValueError(f"{name} must be a real number, got {value!r}")
    return float(value)


class StepLR(LRScheduler):
    """lr = base · gamma^⌊t / step_size⌋."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        _check_positive(step_size, "step_size")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr * self.gamma ** (step // self.step_size)

    def _chained(self, lr: float, step: int, base_lr: float) -> float:
        return lr if step == 0 or step % self.step_size else lr * self.gamma


class MultiStepLR(LRScheduler):
    """lr = base · gamma^(number of milestones ≤ t)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1) -> None:
        if list(milestones) != sorted(milestones) or any(not isinstance(m, int) for m in milestones):
            raise ValueError(f"milestones must be increasing ints, got {milestones!r}")
        self.milestones, self.gamma = list(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, step)

    def _chained(self, lr: float, step: int, base_lr: float) -> float:
        return lr * self.gamma ** self.milestones.count(step)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base − eta_min)·(1 + cos(π·t / T_max))/2 (one half cosine; no restarts)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        _check_positive(T_max, "T_max")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * step / self.T_max)) / 2

    def _chained(self, lr: float, step: int, base_lr: float) -> float:
        if step == 0:
            return lr
        if (step - 1 - self.T_max) % (2 * self.T_max) == 0:  # climbing out of the trough: PyTorch's special case
            return lr + (base_lr - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
        ratio = (1 + math.cos(math.pi * step / self.T_max)) / (1 + math.cos(math.pi * (step - 1) / self.T_max))
        return ratio * (lr - self.eta_min) + self.eta_min


class LinearLR(LRScheduler):
    """Linear warm-up: lr = base · factor, factor going from start_factor to end_factor over total_iters steps."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError(f"start_factor must be in (0, 1] and end_factor in [0, 1], got {start_factor}, {end_factor}")
        _check_positive(total_iters, "total_iters")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        progress = min(step, self.total_iters) / self.total_iters
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress)

    def _chained(self, lr: float, step: int, base_lr: float) -> float:
        if step == 0:
            return lr * self.start_factor
        if step > self.total_iters:
            return lr
        change = self.end_factor - self.start_factor
        return lr * (1.0 + change / (self.total_iters * self.start_factor + (step - 1) * change))


class SequentialLR(LRScheduler):
    """Run ``schedulers[i]`` from ``milestones[i-1]`` on, each counting its own steps from 0 (warm-up, then decay)."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        if len(milestones) != len(schedulers) - 1 or list(milestones) != sorted(milestones):
            raise ValueError("SequentialLR needs one increasing milestone fewer than schedulers")
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR: every scheduler must drive the same optimizer")
        if any(isinstance(s, (ReduceLROnPlateau, ChainedScheduler)) for s in schedulers):
            raise ValueError("SequentialLR does not support ReduceLROnPlateau or ChainedScheduler among its schedulers")
        self.schedulers, self.milestones = list(schedulers), list(milestones)
        super().__init__(optimizer, last_epoch)

    def _current(self, step: int) -> tuple[LRScheduler, int]:
        """The scheduler in charge at ``step`` and its own step count."""
        index = bisect.bisect_right(self.milestones, step)
        start = self.milestones[index - 1] if index else 0
        return self.schedulers[index], step - start

    def lrs_at(self, step: int) -> list[float]:
        scheduler, own_step = self._current(step)
        return scheduler.lrs_at(own_step)

    def _apply(self, step: int) -> None:
        scheduler, own_step = self._current(step)
        scheduler._apply(own_step)


class ConstantLR(LRScheduler):
    """lr = base · factor for the first ``total_iters`` steps, then base."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0 <= factor <= 1:
            raise ValueError(f"factor must be in [0, 1], got {factor!r}")
        _check_non_negative(total_iters, "total_iters")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr * (self.factor if step < self.total_iters else 1.0)

    def _chained(self, lr: float, step: int, base_lr: float) -> float:
        if step == 0:
            return lr * self.factor
        return lr / self.factor if step == self.total_iters else lr


class ExponentialLR(LRScheduler):
    """lr = base · gamma^t."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = _real(gamma, "gamma")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr * self.gamma ** step

    def _chained(self, lr: float, step: int, base_lr: float) -> float:
        return lr if step == 0 else lr * self.gamma


class LambdaLR(LRScheduler):
    """lr = base · lr_lambda(t): one function for every group, or a list of one per group.

    The functions are not part of the state dict (a checkpoint holds no code); build the scheduler
    with the same functions before loading its state, as in PyTorch.
    """

    def __init__(self, optimizer: Optimizer, lr_lambda: "Callable[[int], float] | Sequence[Callable[[int], float]]",
                 last_epoch: int = -1) -> None:
        groups = len(optimizer.param_groups) if isinstance(optimizer, Optimizer) else 0
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * groups
        if len(lambdas) != groups:
            raise ValueError(f"Expected {groups} lr_lambdas, but got {len(lambdas)}")
        if not all(callable(f) for f in lambdas):
            raise TypeError("lr_lambda must be a function of the step (or a list of them, one per group)")
        self.lr_lambdas = lambdas
        super().__init__(optimizer, last_epoch)

    def lrs_at(self, step: int) -> list[float]:
        return [base_lr * function(step) for function, base_lr in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict[str, Any]:
        return {key: value for key, value in super().state_dict().items() if key != "lr_lambdas"}


def _per_group(value: Any, name: str, optimizer: Optimizer) -> list[float]:
    """One number per parameter group, from a number or a list of them (PyTorch's ``_format_param``)."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * len(optimizer.param_groups)
    if len(values) != len(optimizer.param_groups):
        raise ValueError(f"{name} must have the same length as optimizer.param_groups: {name} has {len(values)} values, "
                         f"param_groups has {len(optimizer.param_groups)}")
    return [_real(v, name) for v in values]


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin 2018) as PyTorch's ``OneCycleLR``: the rate rises from
    max_lr/div_factor to max_lr over the first pct_start of ``total_steps`` (or epochs ·
    steps_per_epoch), then anneals to initial_lr/final_div_factor; ``three_phase`` goes back to the
    initial rate first and then down. Momentum (SGD's ``momentum``, Adam's first beta) cycles
    inversely between max_momentum and base_momentum when ``cycle_momentum``. Annealing is 'cos' or
    'linear'. Stepping past total_steps is a ``ValueError``, as in PyTorch.
    """

    def __init__(self, optimizer: Optimizer, max_lr: "float | Sequence[float]", total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: "float | Sequence[float]" = 0.85, max_momentum: "float | Sequence[float]" = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a minidnn Optimizer, got {type(optimizer).__name__}")
        if total_steps is not None:
            _check_positive(total_steps, "total_steps")
        elif epochs is not None and steps_per_epoch is not None:
            _check_positive(epochs, "epochs")
            _check_positive(steps_per_epoch, "steps_per_epoch")
            total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        if isinstance(pct_start, bool) or not isinstance(pct_start, numbers.Real) or not 0 <= pct_start <= 1:
            raise ValueError(f"pct_start must be a number in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', got {anneal_strategy!r}")
        self.total_steps, self.anneal_strategy, self.cycle_momentum = total_steps, anneal_strategy, bool(cycle_momentum)
        rise = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(rise, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (float(2 * pct_start * total_steps) - 2, "max_lr", "initial_lr", "base_momentum",
                            "max_momentum"),
                           (total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self.phases = [(rise, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        max_lrs = _per_group(max_lr, "max_lr", optimizer)
        if last_epoch == -1:
            for group, top in zip(optimizer.param_groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            pairs = zip(_per_group(max_momentum, "max_momentum", optimizer),
                        _per_group(base_momentum, "base_momentum", optimizer), optimizer.param_groups)
            if last_epoch == -1:
                for top, bottom, group in pairs:
                    group["max_momentum"], group["base_momentum"] = top, bottom
                    self._set_momentum(group, top)
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, fraction: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * fraction) + 1)
        return (end - start) * fraction + start

    def _values_at(self, step: int, group: dict[str, Any]) -> tuple[float, float | None]:
        """(lr, momentum or None) of ``group`` after ``step`` steps, PyTorch's phase arithmetic."""
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
        start = 0.0
        for index, (end, lr_from, lr_to, momentum_from, momentum_to) in enumerate(self.phases):
            if step <= end or index == len(self.phases) - 1:
                fraction = (step - start) / (end - start)
                lr = self._anneal(group[lr_from], group[lr_to], fraction)
                momentum = (self._anneal(group[momentum_from], group[momentum_to], fraction)
                            if self.cycle_momentum else None)
                return lr, momentum
            start = end
        raise AssertionError("unreachable: the last phase always matches")

    def lrs_at(self, step: int) -> list[float]:
        return [self._values_at(step, group)[0] for group in self.optimizer.param_groups]

    def _apply(self, step: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"], momentum = self._values_at(step, group)
            if momentum is not None:
                self._set_momentum(group, momentum)


class ChainedScheduler(LRScheduler):
    """Several schedules at once: each step applies every one in turn to the current rate, as
    PyTorch's ``ChainedScheduler`` does, so that e.g. ``[LinearLR(warm-up), ExponentialLR(decay)]``
    multiplies their effects. Each schedule takes its PyTorch recursive form here (``_chained``), which
    is how PyTorch chains them: its rates, step by step. ReduceLROnPlateau, SequentialLR and nested
    chains are refused (the first takes a metric; the others would need their own recursive forms).
    """

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None) -> None:
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler expects at least one scheduler to be chained, but got no scheduler")
        optimizer = optimizer if optimizer is not None else getattr(schedulers[0], "optimizer", None)
        for index, scheduler in enumerate(schedulers):
            if not isinstance(scheduler, LRScheduler):
                raise TypeError(f"ChainedScheduler: scheduler {index} is not an LRScheduler, got "
                                f"{type(scheduler).__name__}")
            if isinstance(scheduler, (ReduceLROnPlateau, SequentialLR, ChainedScheduler)):
                raise ValueError(f"ChainedScheduler does not support {type(scheduler).__name__} (scheduler {index})")
            if scheduler.optimizer is not optimizer:
                raise ValueError(f"ChainedScheduler expects all schedulers to belong to the same optimizer, but "
                                 f"scheduler {index} ({type(scheduler).__name__}) drives another one")
        self.schedulers = schedulers
        super().__init__(optimizer)

    def _apply(self, step: int) -> None:
        if step == 0:  # each schedule's first step from the base rates, in order, as PyTorch's constructors apply them
            for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = base_lr
        for scheduler in self.schedulers:
            scheduler._chain_step(step)
            scheduler.last_epoch, scheduler._last_lr = step, [group["lr"] for group in self.optimizer.param_groups]

    def lrs_at(self, step: int) -> list[float]:
        raise NotImplementedError("ChainedScheduler composes step by step: its rate is in optimizer.param_groups")


class ReduceLROnPlateau(LRScheduler):
    """Multiply the rate by ``factor`` once a metric has stopped improving for ``patience`` steps,
    PyTorch's rule: ``step(metric)`` (lower is better in mode 'min', higher in 'max'); an improvement
    must beat the best by ``threshold`` (relative in 'rel' mode, absolute in 'abs'); after a reduction,
    ``cooldown`` steps pass before counting again; rates never go below ``min_lr`` (a number, or one per
    group), and a reduction smaller than ``eps`` is skipped.
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: "float | Sequence[float]" = 0, eps: float = 1e-8) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a minidnn Optimizer, got {type(optimizer).__name__}")
        if _real(factor, "factor") >= 1.0:
            raise ValueError(f"factor should be < 1.0, got {factor!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        _check_non_negative(patience, "patience")
        _check_non_negative(cooldown, "cooldown")
        self.optimizer, self.factor, self.patience, self.cooldown = optimizer, float(factor), patience, cooldown
        self.mode, self.threshold, self.threshold_mode = mode, _real(threshold, "threshold"), threshold_mode
        self.min_lrs = _per_group(min_lr, "min_lr", optimizer)
        self.eps = _real(eps, "eps")
        self.last_epoch = 0
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def _is_better(self, value: float) -> bool:
        if self.mode == "min":
            return value < (self.best * (1.0 - self.threshold) if self.threshold_mode == "rel"
                            else self.best - self.threshold)
        return value > (self.best * (1.0 + self.threshold) if self.threshold_mode == "rel"
                        else self.best + self.threshold)

    def step(self, metrics: Any) -> None:  # type: ignore[override] - PyTorch's signature
        """Count one epoch with this value of the monitored metric (a number or a one-element tensor)."""
        current = float(metrics)
        self.last_epoch += 1
        if self._is_better(current):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs in cooldown do not count
        if self.num_bad_epochs > self.patience:
            for group, floor in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(group["lr"])
                new = max(old * self.factor, floor)
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def lrs_at(self, step: int) -> list[float]:
        raise NotImplementedError("ReduceLROnPlateau follows a metric: its rate is in optimizer.param_groups")
