"""Optimizer updates as primitives: one call updates one parameter array in place.

The formulas are PyTorch's (``torch.optim.SGD``, ``Adam``, ``AdamW``), so a training run can be
compared step for step. On the GPU each update is one fused kernel (read parameter, gradient
and state once, write them once); the NumPy twin below spells the same arithmetic out.
"""
from __future__ import annotations

import math
from typing import Any

from .. import backend


def sgd_update(param: Any, grad: Any, momentum_buffer: Any = None, *, lr: float, momentum: float = 0.0,
               dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False,
               first_step: bool = False) -> None:
    """SGD with momentum, in place on ``param`` (and ``momentum_buffer``, same shape, when momentum > 0).

    g = ±grad + weight_decay·param; b = g on the first step, else momentum·b + (1 − dampening)·g;
    g = g + momentum·b (Nesterov) or b; param −= lr·g.
    """
    if backend.is_cuda_array(param):
        from . import gpu_optimizer  # noqa: PLC0415 - CuPy only

        return gpu_optimizer.sgd_update(param, grad, momentum_buffer, lr, momentum, dampening, weight_decay,
                                        nesterov, maximize, first_step)
    g = -grad if maximize else grad
    if weight_decay:
        g = g + weight_decay * param
    if momentum:
        if first_step:
            momentum_buffer[...] = g
        else:
            momentum_buffer *= momentum
            momentum_buffer += (1.0 - dampening) * g
        g = g + momentum * momentum_buffer if nesterov else momentum_buffer
    param -= lr * g
    return None


def adam_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, step: int, lr: float, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                decoupled_weight_decay: bool = False, amsgrad: bool = False, max_exp_avg_sq: Any = None,
                maximize: bool = False) -> None:
    """Adam (or AdamW with ``decoupled_weight_decay``), in place; ``step`` counts from 1.

    AdamW: param *= 1 − lr·weight_decay; Adam: g += weight_decay·param. Then
    m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g²; param −= lr/(1 − β1^t) · m / (√v/√(1 − β2^t) + eps),
    with v replaced by its running maximum under AMSGrad.
    """
    if backend.is_cuda_array(param):
        from . import gpu_optimizer  # noqa: PLC0415 - CuPy only

        return gpu_optimizer.adam_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                                         decoupled_weight_decay, amsgrad, max_exp_avg_sq, maximize)
    xp = backend.get_array_module(param)
    g = -grad if maximize else grad
    if weight_decay:
        if decoupled_weight_decay:
            param *= 1.0 - lr * weight_decay
        else:
            g = g + weight_decay * param
    exp_avg *= beta1
    exp_avg += (1.0 - beta1) * g
    exp_avg_sq *= beta2
    exp_avg_sq += (1.0 - beta2) * g * g
    second = exp_avg_sq
    if amsgrad:
        xp.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second = max_exp_avg_sq
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** step)
    denominator = xp.sqrt(second) / bias_correction2_sqrt + eps
    param -= (lr / bias_correction1) * exp_avg / denominator
    return None
