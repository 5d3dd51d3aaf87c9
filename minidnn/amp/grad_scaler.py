"""Dynamic loss scaling (PyTorch's ``torch.amp.GradScaler``): multiply the loss by a scale before backward so
that small float16 gradients do not flush to zero, divide the gradients by it before the optimizer's step,
and skip the step when a gradient overflowed.

    scaler = minidnn.amp.GradScaler()
    scaler.scale(loss).backward()
    scaler.step(optimizer)      # unscales (unless unscale_ ran), then optimizer.step() unless inf/NaN was found
    scaler.update()             # halve the scale after an overflow; double it after growth_interval clean steps

The scale lives on the host as a Python float: the step must read the overflow flag anyway to decide whether
to run, so keeping the scale on the device would save nothing here (and a step that reads a device flag cannot
be captured into a CUDA graph: a loop with a GradScaler runs eagerly). Scales are powers of two as long as
the factors are, so scaling and unscaling are exact.
"""
from __future__ import annotations

import enum
import math
import numbers
from typing import Any

import numpy as np

from .. import backend
from ..autograd import bump_version
from ..engine import library
from ..tensor import Tensor


class _Stage(enum.Enum):
    READY = "ready"        # nothing done for this optimizer in this iteration
    UNSCALED = "unscaled"  # unscale_ ran
    STEPPED = "stepped"    # step ran


class GradScaler:
    """Dynamic loss scaling; arguments and methods as ``torch.amp.GradScaler``.

    ``device`` is accepted for PyTorch's signature (``"cuda"`` or ``"cpu"``); the gradients' own device is
    what the work runs on. ``enabled=False`` makes every method a pass-through, so one training loop serves
    both precisions.
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {enabled!r}")
        self._scale = _scale_value("init_scale", init_scale)
        self._growth_factor = _factor("growth_factor", growth_factor, above_one=True)
        self._backoff_factor = _factor("backoff_factor", backoff_factor, above_one=False)
        self._growth_interval = _interval(growth_interval)
        self._growth_tracker = 0
        self._enabled = enabled
        self._optimizers: dict[int, dict[str, Any]] = {}  # id(optimizer) -> its stage and overflow flag

    # --- the loop's four calls -------------------------------------------------------------------
    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a tensor, or a list/tuple of them, nested) multiplied by the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(output) for output in outputs)
        raise TypeError(f"outputs must be a Tensor or a list/tuple of Tensors, got {type(outputs).__name__}")

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale in place (once per iteration, before step), noting
        whether any of them holds inf or NaN. Call it before clipping gradients."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        inv_scale = float(np.float32(1.0) / np.float32(self._scale))  # PyTorch's float32 reciprocal
        flags = []
        for grads in _gradients_by_device_and_dtype(optimizer).values():
            xp = backend.get_array_module(grads[0].data)
            with backend.on_device(backend.device_of(grads[0].data)):
                found_inf = xp.zeros(1, dtype=np.int32)
            library.unscale_gradients_multi([g.data for g in grads], inv_scale, found_inf)
            for grad in grads:
                bump_version(grad, "unscale_")
            flags.append(found_inf)
        state["found_inf"], state["stage"] = flags, _Stage.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step(*args, **kwargs)`` after unscaling, unless a gradient held inf or NaN; returns what
        it returned, or None when the step was skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs or args:
            raise RuntimeError("a closure is not supported by GradScaler.step(): call backward before step")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update()")
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        if not state["found_inf"]:
            raise RuntimeError("step(): the optimizer has no gradients to check (call backward on the scaled loss "
                               "first)")
        state["stage"] = _Stage.STEPPED
        if _overflowed(state):
            return None
        return optimizer.step(**kwargs)

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Set the next iteration's scale: ``new_scale`` when given; otherwise the scale times backoff_factor
        if any optimizer stepped over inf/NaN this iteration, or times growth_factor after growth_interval
        clean iterations in a row."""
        if not self._enabled:
            return
        if new_scale is not None:
            value = new_scale.item() if isinstance(new_scale, Tensor) else new_scale
            self._scale = _scale_value("new_scale", value)
        else:
            states = [state for state in self._optimizers.values() if state["found_inf"]]
            if not states:
                raise RuntimeError("update(): no optimizer was unscaled or stepped through this scaler since the "
                                   "last update()")
            if any([_overflowed(state) for state in states]):
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    grown = self._scale * self._growth_factor
                    if grown <= _FLOAT32_MAX:  # as PyTorch's float32 scale: it grows only while finite
                        self._scale = grown
                    self._growth_tracker = 0
        self._optimizers.clear()

    # --- settings and state ------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The scale the next ``scale()`` multiplies by (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = _factor("growth_factor", new_factor, above_one=True)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = _factor("backoff_factor", new_factor, above_one=False)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = _interval(new_interval)

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers, PyTorch's keys (empty when disabled, as PyTorch's): a checkpoint holds them as they are."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        if not state_dict:
            raise RuntimeError("the state_dict passed to load_state_dict is empty: it came from a disabled scaler")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state_dict)
        if missing:
            raise ValueError(f"state_dict lacks {sorted(missing)}")
        tracker = state_dict["_growth_tracker"]
        if isinstance(tracker, bool) or not isinstance(tracker, numbers.Integral) or tracker < 0:
            raise ValueError(f"_growth_tracker must be an int >= 0, got {tracker!r}")
        self._scale = _scale_value("scale", state_dict["scale"])
        self._growth_factor = _factor("growth_factor", state_dict["growth_factor"], above_one=True)
        self._backoff_factor = _factor("backoff_factor", state_dict["backoff_factor"], above_one=False)
        self._growth_interval = _interval(state_dict["growth_interval"])
        self._growth_tracker = int(tracker)

    # --- helpers -----------------------------------------------------------------------------------
    def _state(self, optimizer: Any) -> dict[str, Any]:
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(f"optimizer must be a minidnn optimizer, got {type(optimizer).__name__}")
        return self._optimizers.setdefault(id(optimizer), {"stage": _Stage.READY, "found_inf": []})


def _gradients_by_device_and_dtype(optimizer: Any) -> dict[tuple, list[Tensor]]:
    """The optimizer's gradients (parameters without one are skipped), by (device, dtype): one launch each."""
    groups: dict[tuple, list[Tensor]] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                groups.setdefault((backend.device_of(param.grad.data), param.grad.data.dtype), []).append(param.grad)
    return groups


def _overflowed(state: dict[str, Any]) -> bool:
    """Whether any of an optimizer's overflow flags is set, read from the device once per iteration (a read
    waits for the unscale kernels): step() and update() both ask."""
    if "overflowed" not in state:
        state["overflowed"] = any([int(backend.to_device(flag, "cpu")[0]) for flag in state["found_inf"]])
    return state["overflowed"]


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _scale_value(name: str, value: Any) -> float:
    """A scale: finite, > 0, and within float32's range (PyTorch holds it in a float32 tensor)."""
    value = _positive(name, value)
    if value > _FLOAT32_MAX:
        raise ValueError(f"{name} must be at most float32's largest value {_FLOAT32_MAX:g}, got {value!r}")
    return value


def _factor(name: str, value: Any, above_one: bool) -> float:
    value = _positive(name, value)
    if (value <= 1.0) if above_one else (value >= 1.0):
        raise ValueError(f"{name} must be {'> 1' if above_one else '< 1'}, got {value!r}")
    return value


def _interval(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"growth_interval must be an int >= 1, got {value!r}")
    return int(value)
