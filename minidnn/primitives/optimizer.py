"""Optimizer updates as primitives: one call updates one parameter array in place.

The formulas are PyTorch's (``torch.optim.SGD``, ``Adam``, ``AdamW``), so a training run can be
compared step for step. On the GPU each update is one fused kernel of optimizer.cu (read
parameter, gradient and state once, write them once); the NumPy twin below spells the same
arithmetic out. Parameters and state must be contiguous arrays (they are updated in place); every
argument is checked first, since the kernels are handed raw pointers.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

from .. import backend
from ._checks import check_bool, check_float, check_same_dtype, check_same_shape


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------
def _check_rate(value: Any, name: str, below: float | None = None) -> float:
    """A hyper-parameter: a real, finite number >= 0 (and < ``below`` when given), as a Python float.

    NaN must be caught by name: ``nan < 0`` is False, so a plain range test would let it train.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (below is not None and value >= below):
        expected = "a finite number >= 0" + ("" if below is None else f" and < {below:g}")
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def _check_arrays(param: Any, grad: Any, **state: Any) -> None:
    """param and each state array: float, contiguous (updated in place), one dtype, shape and device;
    grad alike but may be strided (it is only read)."""
    backend.get_array_module(param, grad, *state.values())
    for name, array in (("param", param), ("grad", grad), *state.items()):
        check_float(array, name)
        if array is not param:
            check_same_dtype(array, param, name, "param")
            check_same_shape(array, param, name, "param")
        if array is not grad and not array.flags.c_contiguous:
            raise ValueError(f"{name} must be a C-contiguous array: it is updated in place")


def _check_sgd_arguments(param: Any, grad: Any, momentum_buffer: Any, lr: Any, momentum: Any, dampening: Any,
                         weight_decay: Any, nesterov: Any, maximize: Any, first_step: Any) -> tuple:
    """The arguments of :func:`sgd_update`; returns (lr, momentum, dampening, weight_decay) as floats and
    (nesterov, maximize, first_step) as bools."""
    rates = tuple(_check_rate(value, name) for name, value in (
        ("lr", lr), ("momentum", momentum), ("dampening", dampening), ("weight_decay", weight_decay)))
    flags = tuple(check_bool(value, name) for name, value in (
        ("nesterov", nesterov), ("maximize", maximize), ("first_step", first_step)))
    if rates[1] and momentum_buffer is None:
        raise ValueError("momentum_buffer must be an array of param's shape when momentum != 0, got None")
    _check_arrays(param, grad, **({"momentum_buffer": momentum_buffer} if rates[1] else {}))
    return rates + flags


def _check_adam_arguments(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, max_exp_avg_sq: Any, step: Any,
                          lr: Any, beta1: Any, beta2: Any, eps: Any, weight_decay: Any, decoupled_weight_decay: Any,
                          amsgrad: Any, maximize: Any) -> tuple:
    """The arguments of :func:`adam_update`; returns (step, lr, beta1, beta2, eps, weight_decay) as an int
    and floats and (decoupled_weight_decay, amsgrad, maximize) as bools."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be an int (the update's number, counting from 1), got {step!r}")
    if step < 1:
        raise ValueError(f"step must be >= 1 (the update's number, counting from 1), got {step}")
    rates = (_check_rate(lr, "lr"), _check_rate(beta1, "beta1", below=1.0), _check_rate(beta2, "beta2", below=1.0),
             _check_rate(eps, "eps"), _check_rate(weight_decay, "weight_decay"))
    flags = tuple(check_bool(value, name) for name, value in (
        ("decoupled_weight_decay", decoupled_weight_decay), ("amsgrad", amsgrad), ("maximize", maximize)))
    if flags[1] and max_exp_avg_sq is None:
        raise ValueError("max_exp_avg_sq must be an array of param's shape when amsgrad is on, got None")
    _check_arrays(param, grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq,
                  **({"max_exp_avg_sq": max_exp_avg_sq} if flags[1] else {}))
    return (int(step),) + rates + flags


# ----------------------------------------------------------------------------------------------
# Updates
# ----------------------------------------------------------------------------------------------


def sgd_update(param: Any, grad: Any, momentum_buffer: Any = None, *, lr: float, momentum: float = 0.0,
               dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False,
               first_step: bool = False) -> None:
    """SGD with momentum, in place on ``param`` (and ``momentum_buffer``, same shape, when momentum > 0).

    g = ±grad + weight_decay·param; b = g on the first step, else momentum·b + (1 − dampening)·g;
    g = g + momentum·b (Nesterov) or b; param −= lr·g.
    """
    lr, momentum, dampening, weight_decay, nesterov, maximize, first_step = _check_sgd_arguments(
        param, grad, momentum_buffer, lr, momentum, dampening, weight_decay, nesterov, maximize, first_step)
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
    step, lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, amsgrad, maximize = _check_adam_arguments(
        param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
        decoupled_weight_decay, amsgrad, maximize)
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
