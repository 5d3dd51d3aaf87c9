"""Stochastic gradient descent with momentum, PyTorch's update rule."""
from __future__ import annotations

from typing import Any, Iterable

from .. import backend
from ..autograd import no_grad
from ..engine import P
from .optimizer import Optimizer, check_hyperparameter


class SGD(Optimizer):
    """``SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, maximize=False)``.

    b = g on the first step, else momentum·b + (1 − dampening)·g, with g = grad + weight_decay·p;
    p −= lr·(g + momentum·b if nesterov else b). (PyTorch's form: Sutskever's/Chainer's
    v = μv − lr·g differs when lr changes during training.)
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False) -> None:
        lr, momentum, dampening, weight_decay = (check_hyperparameter(name, value) for name, value in (
            ("lr", lr), ("momentum", momentum), ("dampening", dampening), ("weight_decay", weight_decay)))
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum requires a momentum > 0 and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def step(self) -> None:
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self._state_for(p)
                    first_step = "momentum_buffer" not in state
                    if group["momentum"] and first_step:
                        state["momentum_buffer"] = backend.get_array_module(p.data).zeros_like(p.data)
                    P.sgd_update(p.data, p.grad.data, state.get("momentum_buffer"), lr=group["lr"],
                               momentum=group["momentum"], dampening=group["dampening"],
                               weight_decay=group["weight_decay"], nesterov=group["nesterov"],
                               maximize=group["maximize"], first_step=first_step)
