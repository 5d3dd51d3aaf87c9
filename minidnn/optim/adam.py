"""Adam and AdamW, PyTorch's update rules (bias-corrected moments; AdamW decays the weights directly)."""
from __future__ import annotations

from typing import Any, Iterable

from .. import backend
from ..autograd import no_grad
from ..engine import library
from .optimizer import Optimizer, check_hyperparameter, contiguous_grad


def _capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph (False without a GPU)."""
    return backend.cuda_is_available() and backend.cupy().cuda.get_current_stream().is_capturing()


class Adam(Optimizer):
    """``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, maximize=False)``.

    A step makes one multi-tensor update (``adam_update_multi``) per (device, dtype, step count) of the
    parameters that have a gradient. On a GPU the learning rate is read from a float64 device copy of
    each group's ``lr``, refreshed by ``step()`` when ``lr`` changed (see SGD and
    :meth:`refresh_device_hyperparameters` for capturing a step in a CUDA graph). State per parameter:
    ``step`` (a Python int, as the state dict holds it: a captured step would replay one step count),
    ``exp_avg``, ``exp_avg_sq`` and, under AMSGrad, ``max_exp_avg_sq``.
    """

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
        if _capturing():
            raise RuntimeError("Adam keeps its step count on the host, so a captured CUDA graph would replay one "
                               "step count: run an Adam training step eagerly")
        with no_grad():
            for index, group in enumerate(self.param_groups):
                beta1, beta2 = group["betas"]
                batches: dict[tuple, list[Any]] = {}  # (device index, dtype, step count) -> parameters
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
                    batches.setdefault((backend.device_index(p.data), p.data.dtype, state["step"]), []).append(p)
                for (_, _, step), params in batches.items():
                    device = backend.device_of(params[0].data)
                    states = [self.state[p] for p in params]
                    maxima = [state.get("max_exp_avg_sq") for state in states] if group["amsgrad"] else None
                    library.adam_update_multi([p.data for p in params], [contiguous_grad(p) for p in params],
                                              [state["exp_avg"] for state in states],
                                              [state["exp_avg_sq"] for state in states], maxima, step=step,
                                              lr=self._learning_rate(index, group, device), beta1=beta1, beta2=beta2,
                                              eps=group["eps"], weight_decay=group["weight_decay"],
                                              decoupled_weight_decay=self.decoupled_weight_decay,
                                              amsgrad=group["amsgrad"], maximize=group["maximize"])
                    self._mark_updated(params)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 − lr·weight_decay each step."""

    decoupled_weight_decay = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
