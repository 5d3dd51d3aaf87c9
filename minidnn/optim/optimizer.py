"""Optimizer base class: parameter groups, per-parameter state and its state dict (PyTorch's format)."""
from __future__ import annotations

import math
import weakref
import numbers
from typing import Any, Iterable

import numpy as np

from .. import backend
from .. import memory_format as formats
from ..autograd import bump_version
from ..tensor import Tensor


def check_hyperparameter(name: str, value: Any, low: float = 0.0, below: float | None = None) -> float:
    """``value`` as a float if it is a real, finite number in [low, below) (or >= low when ``below`` is
    None); anything else (NaN, inf, a negative number, a bool, a string) is a ``ValueError`` naming
    ``name`` and the expected form. NaN must be caught here: ``nan < 0`` is False, so a plain range
    test lets it through and the optimizer trains on NaN without a word."""
    expected = f"a finite number >= {low:g}" + ("" if below is None else f" and < {below:g}")
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < low or (below is not None and value >= below):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


class Optimizer:
    """Holds ``param_groups`` (dicts with ``"params"`` and hyper-parameters) and ``state`` per parameter.

    Subclasses implement :meth:`step`; state values are arrays on the parameter's device, so the
    state follows the model, and ints/floats.
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError("params must be an iterable of tensors or of dicts, not a single tensor")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        for group in (params if isinstance(params[0], dict) else [{"params": params}]):
            self.add_param_group(group)
        _live.add(self)

    def add_param_group(self, group: dict[str, Any]) -> None:
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("a parameter group must be a dict with a 'params' entry")
        group = dict(group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        # A parameter listed twice would be updated twice per step (twice the learning rate, and
        # two momentum buffers for one tensor in a state dict): refuse it, within a group or across.
        if len({id(p) for p in group["params"]}) != len(group["params"]):
            raise ValueError("a parameter appears more than once in a parameter group; pass each tensor once")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        for key, value in self.defaults.items():
            group.setdefault(key, value)
            # A group's own numeric hyper-parameters (lr=..., momentum=...) obey the same rule as the
            # constructor's: finite and >= 0. Flags (bools) and tuples (Adam's betas) are checked there.
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                group[key] = check_hyperparameter(key, group[key])
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.data[...] = 0

    def step(self) -> None:
        raise NotImplementedError

    # Whether step() takes ``found_inf`` (GradScaler's overflow flags, {device: int32 array}) and skips its
    # update on the device when one is set, so that the scaler never reads the flag back (PyTorch's name).
    _step_supports_amp_scaling = False

    def _state_for(self, p: Tensor) -> dict[str, Any]:
        return self.state.setdefault(p, {})

    # --- the learning rate on the device -------------------------------------------------------
    # On a GPU, step() hands the multi-tensor updates each group's learning rate as a float64 array
    # of one element on that GPU, which their kernel reads: a captured step (CUDA graph) then follows
    # schedule changes without a new capture. The copies live outside param_groups (the state dict
    # holds numbers only), keyed by (group index, device), each with the value it holds.
    def _mark_updated(self, params: list) -> None:
        """The step wrote ``params`` in place: a graph that saved them must not backward through them."""
        operation = type(self).__name__ + ".step"
        for p in params:
            bump_version(p, operation)

    def _learning_rate(self, index: int, group: dict[str, Any], device: backend.Device) -> Any:
        """group["lr"] for the updates of the group's parameters on ``device``: the number on the CPU;
        on a GPU the group's device copy, refreshed (one fill) when group["lr"] has changed."""
        if device.type == "cpu":
            return group["lr"]
        copies = vars(self).setdefault("_device_learning_rates", {})
        if (index, device) not in copies:
            with backend.on_device(device):
                copies[index, device] = [backend.cupy().empty(1, dtype=np.float64), None]
        self._refresh(copies[index, device], group["lr"])
        return copies[index, device][0]

    # The hyper-parameters step() reads from device copies (refresh_device_hyperparameters): a captured step()
    # takes those afresh at each replay and holds every other one as the capture recorded it.
    device_hyperparameters = ("lr",)

    def recorded_hyperparameters(self) -> list[dict[str, Any]]:
        """Per group, the hyper-parameters a captured step() holds as launch arguments: every name of
        ``defaults`` but :attr:`device_hyperparameters`."""
        names = [name for name in self.defaults if name not in self.device_hyperparameters]
        return [{name: group[name] for name in names} for group in self.param_groups]

    def refresh_device_hyperparameters(self) -> None:
        """Write each group's current lr into its device copies (only those that changed).

        step() does this by itself; code that captures step() in a CUDA graph calls it before the
        capture (so that the graph holds no refresh of its own) and, after any change of lr (a
        scheduler's step), before each replay, outside the graph.
        """
        for (index, _), copy in vars(self).get("_device_learning_rates", {}).items():
            self._refresh(copy, self.param_groups[index]["lr"])

    @staticmethod
    def _refresh(copy: list[Any], lr: Any) -> None:
        """copy = [device array, the value it holds]: fill it with ``lr`` unless it holds it already."""
        if copy[1] == lr:
            return
        # Checked here: the update primitive cannot look at a value that is already on the device.
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not 0 <= lr < math.inf:
            raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
        copy[0].fill(lr)
        copy[1] = lr

    # --- state dict ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {name: Tensor | number}}, "param_groups": [{..., "params": [index, ...]}]}``."""
        index_of: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            indices = [index_of.setdefault(id(p), len(index_of)) for p in group["params"]]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": indices})
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index_of[id(p)]] = {k: Tensor(v) if _is_array(v) else v for k, v in self.state[p].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if groups is None or "state" not in state_dict:
            raise ValueError("optimizer state_dict must have 'state' and 'param_groups' entries")
        if len(groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(groups)} parameter groups, the optimizer has "
                             f"{len(self.param_groups)}")
        for saved, own in zip(groups, self.param_groups):
            if len(saved["params"]) != len(own["params"]):
                raise ValueError(f"a loaded parameter group has {len(saved['params'])} parameters, the optimizer's "
                                 f"has {len(own['params'])}")
        by_index = {i: p for saved, own in zip(groups, self.param_groups) for i, p in zip(saved["params"], own["params"])}
        self.state = {}
        for index, values in state_dict["state"].items():
            p = by_index.get(int(index))
            if p is None:
                raise ValueError(f"optimizer state refers to parameter {index}, which no group holds")
            self.state[p] = {k: _to_parameter_array(v, p) for k, v in values.items()}
        for saved, own in zip(groups, self.param_groups):
            own.update({k: v for k, v in saved.items() if k != "params"})


# Every optimizer alive: a captured training step (minidnn.cuda.graphs) refreshes their device learning
# rates before each replay, whichever of them the step uses.
_live: "weakref.WeakSet[Optimizer]" = weakref.WeakSet()


def live_optimizers() -> list[Optimizer]:
    return list(_live)


def contiguous_grad(p: Tensor) -> Any:
    """p's gradient array laid out as p is (C order, or channels-last for a 4-D parameter laid out so), copied
    when it is not (a transpose's gradient can be a strided view): the update primitives walk a parameter, its
    gradient and its state as flat buffers of one layout."""
    grad = p.grad.data
    if grad.strides == p.data.strides or (grad.flags.c_contiguous and p.data.flags.c_contiguous):
        return grad
    if p.ndim == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=formats.channels_last):
        return formats.lay_out(grad, formats.channels_last)
    return backend.get_array_module(grad).ascontiguousarray(grad)


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or backend.is_cuda_array(value)


def _to_parameter_array(value: Any, p: Tensor) -> Any:
    """A saved state entry as an array on ``p``'s device (numbers stay numbers)."""
    if isinstance(value, Tensor):
        value = value.data
    if _is_array(value):
        if value.shape != p.shape and value.ndim:
            raise ValueError(f"optimizer state of shape {value.shape} does not match its parameter {p.shape}")
        return backend.to_device(value, p.device).astype(p.dtype if value.dtype.kind == "f" else value.dtype, copy=True)
    return value
