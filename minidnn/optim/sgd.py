"""Stochastic gradient descent with momentum, PyTorch's update rule."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from .. import backend
from ..autograd import no_grad
from ..engine import library
from .optimizer import Optimizer, check_hyperparameter, contiguous_grad


class SGD(Optimizer):
    """``SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, maximize=False)``.

    b = g on the first step, else momentum·b + (1 − dampening)·g, with g = grad + weight_decay·p;
    p −= lr·(g + momentum·b if nesterov else b). (PyTorch's form: Sutskever's/Chainer's
    v = μv − lr·g differs when lr changes during training.)

    A step makes one multi-tensor update (``sgd_update_multi``) per (device, dtype) of the parameters
    that have a gradient (those on their first step with momentum form a batch of their own). On a
    GPU the learning rate is read from a float64 device copy of each group's ``lr``, which ``step()``
    refreshes when ``lr`` changed; a captured step() must be preceded by
    :meth:`refresh_device_hyperparameters` (before the capture, and before each replay that follows a
    change of lr). State per parameter: ``momentum_buffer`` (when momentum > 0).

    ``step(found_inf=...)`` takes :class:`minidnn.amp.GradScaler`'s overflow flags ({device: an int32 array
    of one element}) and skips every update whose device's flag is set, on the device, with no host read: an
    fp16 step can then be captured. (A first step skipped that way leaves a zero momentum buffer; with
    ``dampening`` 0 the next step's buffer is the gradient, as on a first step.)
    """

    _step_supports_amp_scaling = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False) -> None:
        lr, momentum, dampening, weight_decay = (check_hyperparameter(name, value) for name, value in (
            ("lr", lr), ("momentum", momentum), ("dampening", dampening), ("weight_decay", weight_decay)))
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum requires a momentum > 0 and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def step(self, found_inf: Mapping[backend.Device, Any] | None = None) -> None:
        with no_grad():
            for index, group in enumerate(self.param_groups):
                batches: dict[tuple, list[Any]] = {}  # (device index, dtype, first step?) -> parameters
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self._state_for(p)
                    first_step = "momentum_buffer" not in state
                    if group["momentum"] and first_step:
                        state["momentum_buffer"] = backend.get_array_module(p.data).zeros_like(p.data)
                    batches.setdefault((backend.device_index(p.data), p.data.dtype, first_step), []).append(p)
                for (_, _, first_step), params in batches.items():
                    device = backend.device_of(params[0].data)
                    buffers = [self.state[p]["momentum_buffer"] for p in params] if group["momentum"] else None
                    library.sgd_update_multi([p.data for p in params], [contiguous_grad(p) for p in params], buffers,
                                             lr=self._learning_rate(index, group, device), momentum=group["momentum"],
                                             dampening=group["dampening"], weight_decay=group["weight_decay"],
                                             nesterov=group["nesterov"], maximize=group["maximize"],
                                             first_step=first_step,
                                             found_inf=None if found_inf is None else found_inf[device])
                    self._mark_updated(params)
