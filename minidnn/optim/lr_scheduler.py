"""Learning-rate schedules with PyTorch's names and step semantics.

Call ``scheduler.step()`` after ``optimizer.step()`` (per epoch or per iteration, as you choose).
Each schedule is written in closed form: the learning rate at step t is a function of t and the
group's base rate, so a scheduler's whole state is ``last_epoch`` and resuming is exact.
"""
from __future__ import annotations

import bisect
import math
from typing import Any, Sequence

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

    def step(self) -> None:
        self.last_epoch += 1
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(self.last_epoch, base_lr)
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


class StepLR(LRScheduler):
    """lr = base · gamma^⌊t / step_size⌋."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        _check_positive(step_size, "step_size")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr * self.gamma ** (step // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base · gamma^(number of milestones ≤ t)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1) -> None:
        if list(milestones) != sorted(milestones) or any(not isinstance(m, int) for m in milestones):
            raise ValueError(f"milestones must be increasing ints, got {milestones!r}")
        self.milestones, self.gamma = list(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, step)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base − eta_min)·(1 + cos(π·t / T_max))/2 (one half cosine; no restarts)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        _check_positive(T_max, "T_max")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * step / self.T_max)) / 2


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


class SequentialLR(LRScheduler):
    """Run ``schedulers[i]`` from ``milestones[i-1]`` on, each counting its own steps from 0 (warm-up, then decay)."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        if len(milestones) != len(schedulers) - 1 or list(milestones) != sorted(milestones):
            raise ValueError("SequentialLR needs one increasing milestone fewer than schedulers")
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR: every scheduler must drive the same optimizer")
        self.schedulers, self.milestones = list(schedulers), list(milestones)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int, base_lr: float) -> float:
        index = bisect.bisect_right(self.milestones, step)
        start = self.milestones[index - 1] if index else 0
        return self.schedulers[index].lr_at(step - start, base_lr)
