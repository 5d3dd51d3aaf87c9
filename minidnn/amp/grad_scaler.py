"""Dynamic loss scaling (PyTorch's ``torch.amp.GradScaler``): multiply the loss by a scale before backward so
that small float16 gradients do not flush to zero, divide the gradients by it before the optimizer's step,
and skip the step when a gradient overflowed.

    scaler = minidnn.amp.GradScaler()
    scaler.scale(loss).backward()
    scaler.step(optimizer)      # unscales (unless unscale_ ran), then optimizer.step() unless inf/NaN was found
    scaler.update()             # halve the scale after an overflow; double it after growth_interval clean steps

The scale, the count of clean steps and the overflow flags live on the device of the first scaled output,
as PyTorch's do, and nothing in those four calls reads them back to the host: the unscale kernels read the
scale there, SGD skips its update on the device when the flag is set (``Optimizer._step_supports_amp_scaling``;
another optimizer's step is decided on the host, one read), and ``update_loss_scale`` grows or backs off the
scale in place. So an fp16 training step with SGD can be captured as a CUDA graph, whose replays skip, back off
and grow as eager steps do. Only ``get_scale()`` and ``state_dict()`` read the device. Scales are powers of two
as long as the factors are, so scaling and unscaling are exact.
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

    ``device`` is accepted for PyTorch's signature (``"cuda"`` or ``"cpu"``); the scale is made on the device
    of the first output ``scale()`` multiplies (a float32 array of shape ()), beside its count of clean steps
    (int32). ``enabled=False`` makes every method a pass-through, so one training loop serves both precisions.
    A captured step holds growth_factor, backoff_factor and growth_interval as its capture recorded them.
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {enabled!r}")
        self._init_scale = _scale_value("init_scale", init_scale)
        self._growth_factor = _factor("growth_factor", growth_factor, above_one=True)
        self._backoff_factor = _factor("backoff_factor", backoff_factor, above_one=False)
        self._growth_interval = _interval(growth_interval)
        self._init_growth_tracker = 0
        self._scale: Any = None           # made on first use (_scale_on), from _init_scale
        self._growth_tracker: Any = None  # likewise, from _init_growth_tracker
        self._enabled = enabled
        self._optimizers: dict[int, dict[str, Any]] = {}  # id(optimizer) -> its stage and overflow flags

    # --- the loop's four calls -------------------------------------------------------------------
    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a tensor, or a list/tuple of them, nested) multiplied by the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale_on(outputs.device)
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
        flags, inverses = {}, {}  # by device: one overflow flag for all dtypes (the kernels only set it)
        for (device, _), grads in _gradients_by_device_and_dtype(optimizer).items():
            if device not in flags:
                xp = backend.get_array_module(grads[0].data)
                with backend.on_device(device):
                    flags[device] = xp.zeros(1, dtype=np.int32)
                    inverses[device] = xp.empty((), dtype=np.float32)
                xp.reciprocal(self._scale_on(device), out=inverses[device])  # PyTorch's float32 reciprocal
            library.unscale_gradients_multi([g.data for g in grads], inverses[device], flags[device])
            for grad in grads:
                bump_version(grad, "unscale_")
        state["found_inf"], state["stage"] = flags, _Stage.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step(*args, **kwargs)`` after unscaling, unless a gradient held inf or NaN; returns what
        it returned, or None when the step was skipped. An optimizer that takes the overflow flags
        (``_step_supports_amp_scaling``: SGD) decides on the device; another after one host read."""
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
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return optimizer.step(found_inf=state["found_inf"], **kwargs)
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
            value = _scale_value("new_scale", value)
            if self._scale is None:
                self._init_scale = value
            else:
                self._scale.fill(value)
        else:
            flags = [flag for state in self._optimizers.values() for flag in state["found_inf"].values()]
            if not flags:
                raise RuntimeError("update(): no optimizer was unscaled or stepped through this scaler since the "
                                   "last update()")
            library.update_loss_scale(self._scale, self._growth_tracker, self._any_overflow(flags),
                                      self._growth_factor, self._backoff_factor, self._growth_interval)
        self._optimizers.clear()

    # --- settings and state ------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The scale the next ``scale()`` multiplies by (1.0 when disabled); a read from the device."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else _host_value(self._scale, float)

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
        tracker = self._init_growth_tracker if self._growth_tracker is None else _host_value(self._growth_tracker, int)
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": tracker}

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
        scale = _scale_value("scale", state_dict["scale"])
        self._growth_factor = _factor("growth_factor", state_dict["growth_factor"], above_one=True)
        self._backoff_factor = _factor("backoff_factor", state_dict["backoff_factor"], above_one=False)
        self._growth_interval = _interval(state_dict["growth_interval"])
        self._init_scale, self._init_growth_tracker = scale, int(tracker)
        if self._scale is not None:  # written in place: a captured step reads these arrays
            self._scale.fill(scale)
            self._growth_tracker.fill(int(tracker))

    # --- helpers -----------------------------------------------------------------------------------
    def _scale_on(self, device: backend.Device) -> Any:
        """The scale as a float32 array on ``device``: the scaler's own (made there on first use, with its
        growth tracker), or a copy of it for another device."""
        if self._scale is None:
            xp = backend.cupy() if device.type == "cuda" else np
            with backend.on_device(device):
                self._scale = xp.full((), self._init_scale, dtype=np.float32)
                self._growth_tracker = xp.full((), self._init_growth_tracker, dtype=np.int32)
        return self._scale if backend.device_of(self._scale) == device else backend.to_device(self._scale, device)

    def _any_overflow(self, flags: list[Any]) -> Any:
        """One int32 flag on the scale's device, set when any of ``flags`` is (the flag itself when one)."""
        device = backend.device_of(self._scale)
        if len(flags) == 1 and backend.device_of(flags[0]) == device:
            return flags[0]
        xp = backend.get_array_module(self._scale)
        with backend.on_device(device):
            found = xp.zeros(1, dtype=np.int32)
        for flag in flags:
            xp.maximum(found, backend.to_device(flag, device), out=found)
        return found

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
    """Whether any of an optimizer's overflow flags is set, read from the device (a read waits for the
    unscale kernels): the host's decision for an optimizer that cannot take the flags."""
    return any([_host_value(flag, int) for flag in state["found_inf"].values()])


def _host_value(array: Any, kind: type) -> Any:
    """The one element of ``array`` as a Python ``kind`` (a read from the device on the GPU)."""
    return kind(backend.to_device(array, "cpu").reshape(()).item())


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
