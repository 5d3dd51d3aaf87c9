"""Optimizer updates as primitives: one call updates one parameter array in place.

The formulas are PyTorch's (``torch.optim.SGD``, ``Adam``, ``AdamW``), so a training run can be
compared step for step. On the GPU each update is one fused kernel of optimizer.cu (read
parameter, gradient and state once, write them once); the NumPy twin below spells the same
arithmetic out. Parameters and state must be contiguous arrays (they are updated in place).
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
        from . import _cuda  # noqa: PLC0415 - GPU only

        buffer = param if momentum_buffer is None else momentum_buffer  # never read when momentum == 0
        _cuda.launch(_cuda.function("optimizer.cu", "sgd_update", param.dtype), param.size,
                     (param, _contiguous(grad), buffer, _cuda.i32(param.size), _cuda.f64(lr), _cuda.f64(momentum),
                      _cuda.f64(dampening), _cuda.f64(weight_decay), _cuda.i32(nesterov), _cuda.i32(maximize),
                      _cuda.i32(first_step)))
        return None
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
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** step)
    if backend.is_cuda_array(param):
        from . import _cuda  # noqa: PLC0415 - GPU only

        maximum = exp_avg_sq if max_exp_avg_sq is None else max_exp_avg_sq  # read only under AMSGrad
        _cuda.launch(_cuda.function("optimizer.cu", "adam_update", param.dtype), param.size,
                     (param, _contiguous(grad), exp_avg, exp_avg_sq, maximum, _cuda.i32(param.size), _cuda.f64(lr),
                      _cuda.f64(beta1), _cuda.f64(beta2), _cuda.f64(eps), _cuda.f64(weight_decay),
                      _cuda.f64(lr / bias_correction1), _cuda.f64(bias_correction2_sqrt),
                      _cuda.i32(decoupled_weight_decay), _cuda.i32(amsgrad), _cuda.i32(maximize)))
        return None
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
    denominator = xp.sqrt(second) / bias_correction2_sqrt + eps
    param -= (lr / bias_correction1) * exp_avg / denominator
    return None


def _contiguous(array: Any) -> Any:
    return backend.get_array_module(array).ascontiguousarray(array)
