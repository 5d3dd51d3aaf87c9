"""Adam and AdamW, PyTorch's update rules (bias-corrected moments; AdamW decays the weights directly)."""
from __future__ import annotations

from typing import Any, Iterable

from .. import backend
from ..autograd import no_grad
from ..engine import P
from .optimizer import Optimizer, check_hyperparameter


class Adam(Optimizer):
    decoupled_weight_decay = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False) -> None:
        lr, eps, weight_decay = (check_hyperparameter(name, value) for name, value in (
            ("lr", lr), ("eps", eps), ("weight_decay", weight_decay)))
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas must be a pair of numbers in [0, 1), got {betas!r}")
        betas = tuple(check_hyperparameter(f"betas[{i}]", b, below=1.0) for i, b in enumerate(betas))
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def step(self) -> None:
        with no_grad():
            for group in self.param_groups:
                beta1, beta2 = group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self._state_for(p)
                    if not state:
                        xp = backend.get_array_module(p.data)
                        state.update(step=0, exp_avg=xp.zeros_like(p.data), exp_avg_sq=xp.zeros_like(p.data))
                        if group["amsgrad"]:
                            state["max_exp_avg_sq"] = xp.zeros_like(p.data)
                    state["step"] += 1
                    P.adam_update(p.data, p.grad.data, state["exp_avg"], state["exp_avg_sq"], step=state["step"],
                                lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                                weight_decay=group["weight_decay"],
                                decoupled_weight_decay=self.decoupled_weight_decay, amsgrad=group["amsgrad"],
                                max_exp_avg_sq=state.get("max_exp_avg_sq"), maximize=group["maximize"])


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 − lr·weight_decay each step."""

    decoupled_weight_decay = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
