"""Optimizer updates as Caffe's solvers applied them (src/caffe/solvers/sgd_solver.cpp/.cu,
adam_solver.cpp/.cu): parameter by parameter, in three passes over its memory (a kernel each on
the GPU):

    Regularize           g = ±grad + weight_decay·param      (an axpy; only with weight decay or maximize)
    ComputeUpdateValue   SGDUpdate or AdamUpdate: the moments, and g becomes the update value
    Update               param −= update                     (an axpy)

with PyTorch's arithmetic, so that training runs on the two engines agree (torch.optim's rules: SGD's
momentum b = μ·b + (1 − dampening)·g, b = g on the first step, Nesterov, maximize; Adam's bias
corrections and AMSGrad; AdamW's decoupled decay param *= 1 − lr·weight_decay, one more pass, a
scal as Caffe's). Departures from Caffe: the regularised gradient and the update value go to a
scratch array (Caffe overwrote the parameter's diff; the caller's gradient is left as PyTorch
leaves it), and lr stays outside SGD's momentum buffer, as in PyTorch.

The ``*_multi`` functions take lists and run Caffe's per-parameter update on each (Caffe had no
multi-tensor kernels); every parameter is checked before the first is updated. A learning rate or
step held in a 1-element device array is read back to the host once per call, where Caffe's solver
kept its rate. Arguments are checked by :mod:`minidnn.primitives.optimizer`'s helpers.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import backend
from ..primitives import _cuda
from ..primitives import optimizer as checks
from . import kernels


# ----------------------------------------------------------------------------------------------
# One parameter
# ----------------------------------------------------------------------------------------------
def sgd_update(param: Any, grad: Any, momentum_buffer: Any = None, *, lr: float, momentum: float = 0.0,
               dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False,
               first_step: bool = False) -> None:
    """SGD with momentum (SGDSolver: Regularize, SGDUpdate, Update), in place on ``param`` (and on
    ``momentum_buffer``, param's shape, when momentum > 0)."""
    settings = checks._check_sgd_arguments(param, grad, momentum_buffer, lr, momentum, dampening, weight_decay,
                                           nesterov, maximize, first_step)
    _sgd(param, grad, momentum_buffer, *settings)


def adam_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, step: int, lr: float, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                decoupled_weight_decay: bool = False, amsgrad: bool = False, max_exp_avg_sq: Any = None,
                maximize: bool = False) -> None:
    """Adam (AdamSolver: Regularize, AdamUpdate, Update), or AdamW with ``decoupled_weight_decay``
    (a scal of param first), in place; ``step`` counts from 1."""
    settings = checks._check_adam_arguments(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2,
                                            eps, weight_decay, decoupled_weight_decay, amsgrad, maximize)
    _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, *settings)


def _sgd(param: Any, grad: Any, momentum_buffer: Any, lr: float, momentum: float, dampening: float,
         weight_decay: float, nesterov: bool, maximize: bool, first_step: bool) -> None:
    if backend.is_cuda_array(param):
        cupy = backend.cupy()
        _cuda.check_int32(param)
        count, update = _cuda.i32(param.size), cupy.empty_like(param)
        g = _regularized(param, cupy.ascontiguousarray(grad), update, maximize, weight_decay)
        buffer = momentum_buffer if momentum else update  # not read without momentum
        kernels.launch("sgd_update", param.dtype, param.size,
                       (g, buffer, update, count, _cuda.f64(lr), _cuda.f64(momentum), _cuda.f64(dampening),
                        _cuda.i32(nesterov), _cuda.i32(first_step)))
        kernels.launch("axpy", param.dtype, param.size, (update, param, count, _cuda.f64(-1.0)))
        return
    g = -grad if maximize else grad
    if weight_decay:
        g = g + weight_decay * param
    if momentum:
        momentum_buffer[...] = g if first_step else momentum * momentum_buffer + (1.0 - dampening) * g
        g = g + momentum * momentum_buffer if nesterov else momentum_buffer
    param -= lr * g


def _adam(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, max_exp_avg_sq: Any, step: int, lr: float,
          beta1: float, beta2: float, eps: float, weight_decay: float, decoupled_weight_decay: bool, amsgrad: bool,
          maximize: bool) -> None:
    step_size, correction2_sqrt = lr / (1.0 - beta1 ** step), math.sqrt(1.0 - beta2 ** step)
    decoupled_decay = weight_decay if decoupled_weight_decay else 0.0
    coupled_decay = 0.0 if decoupled_weight_decay else weight_decay
    if backend.is_cuda_array(param):
        cupy = backend.cupy()
        _cuda.check_int32(param)
        count, update = _cuda.i32(param.size), cupy.empty_like(param)
        if decoupled_decay:
            kernels.launch("scal", param.dtype, param.size, (param, count, _cuda.f64(1.0 - lr * decoupled_decay)))
        g = _regularized(param, cupy.ascontiguousarray(grad), update, maximize, coupled_decay)
        maximum = max_exp_avg_sq if amsgrad else exp_avg_sq  # not read without AMSGrad
        kernels.launch("adam_update", param.dtype, param.size,
                       (g, exp_avg, exp_avg_sq, maximum, update, count, _cuda.f64(beta1), _cuda.f64(beta2),
                        _cuda.f64(eps), _cuda.f64(step_size), _cuda.f64(correction2_sqrt), _cuda.i32(amsgrad)))
        kernels.launch("axpy", param.dtype, param.size, (update, param, count, _cuda.f64(-1.0)))
        return
    xp = backend.get_array_module(param)
    if decoupled_decay:
        param *= 1.0 - lr * decoupled_decay
    g = -grad if maximize else grad
    if coupled_decay:
        g = g + coupled_decay * param
    exp_avg[...] = beta1 * exp_avg + (1.0 - beta1) * g
    exp_avg_sq[...] = beta2 * exp_avg_sq + (1.0 - beta2) * g * g
    second = exp_avg_sq
    if amsgrad:
        max_exp_avg_sq[...] = xp.maximum(max_exp_avg_sq, exp_avg_sq)
        second = max_exp_avg_sq
    param -= step_size * exp_avg / (xp.sqrt(second) / correction2_sqrt + eps)


def _regularized(param: Any, grad: Any, scratch: Any, maximize: bool, weight_decay: float) -> Any:
    """The gradient the update reads: grad itself, or ±grad + weight_decay·param written into ``scratch``
    (Regularize) when maximize or a weight decay asks for it."""
    if not (maximize or weight_decay):
        return grad
    kernels.launch("regularize", param.dtype, param.size,
                   (grad, param, scratch, _cuda.i32(param.size), _cuda.i32(maximize), _cuda.f64(weight_decay)))
    return scratch


# ----------------------------------------------------------------------------------------------
# Lists of parameters
# ----------------------------------------------------------------------------------------------
def sgd_update_multi(params: Sequence[Any], grads: Sequence[Any], momentum_buffers: Sequence[Any] | None, *,
                     lr: float | Any, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                     nesterov: bool = False, maximize: bool = False, first_step: bool = False,
                     found_inf: Any = None) -> None:
    """:func:`sgd_update` on every parameter: params, grads and momentum_buffers are lists of one length
    (momentum_buffers may be None, or hold None, when momentum is 0); lr a number or a 1-element array;
    nothing is updated when ``found_inf`` (an int32 array of one element, read back to the host as Caffe's
    solver would) is set."""
    params, grads, buffers = _check_lists(("momentum_buffers",), params=params, grads=grads,
                                          momentum_buffers=momentum_buffers)
    lr = _host_number(lr, "lr")
    settings = [checks._check_sgd_arguments(p, g, b, lr, momentum, dampening, weight_decay, nesterov, maximize,
                                            first_step) for p, g, b in zip(params, grads, buffers)]
    if found_inf is not None:
        checks._check_one_element(found_inf, "found_inf", np.int32, params[0] if params else None, "the params'")
        if _host_number(found_inf, "found_inf"):
            return
    for p, g, b, setting in zip(params, grads, buffers, settings):
        _sgd(p, g, b, *setting)


def adam_update_multi(params: Sequence[Any], grads: Sequence[Any], exp_avgs: Sequence[Any],
                      exp_avg_sqs: Sequence[Any], max_exp_avg_sqs: Sequence[Any] | None, *, step: int | Any,
                      lr: float | Any, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                      weight_decay: float = 0.0, decoupled_weight_decay: bool = False, amsgrad: bool = False,
                      maximize: bool = False) -> None:
    """:func:`adam_update` on every parameter: lists of one length (max_exp_avg_sqs may be None, or hold
    None, without AMSGrad); step and lr numbers or 1-element arrays."""
    params, grads, exp_avgs, exp_avg_sqs, maxima = _check_lists(
        ("max_exp_avg_sqs",), params=params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs,
        max_exp_avg_sqs=max_exp_avg_sqs)
    step, lr = _host_number(step, "step"), _host_number(lr, "lr")
    if isinstance(step, float) and step.is_integer():  # a step counter kept in a float64 array
        step = int(step)
    settings = [checks._check_adam_arguments(p, g, m, v, v_max, step, lr, beta1, beta2, eps, weight_decay,
                                             decoupled_weight_decay, amsgrad, maximize)
                for p, g, m, v, v_max in zip(params, grads, exp_avgs, exp_avg_sqs, maxima)]
    for p, g, m, v, v_max, setting in zip(params, grads, exp_avgs, exp_avg_sqs, maxima, settings):
        _adam(p, g, m, v, v_max, *setting)


def _check_lists(optional: tuple[str, ...], **lists: Any) -> list[list]:
    """Each argument a list or tuple as long as the first (params); those named in ``optional`` may be None,
    read as a list of None."""
    checked: list = []
    for name, value in lists.items():
        if value is None and name in optional:
            checked.append(None)
            continue
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{name} must be a list of arrays, got {type(value).__name__}")
        if checked and len(value) != len(checked[0]):
            raise ValueError(f"{name} must hold one entry per parameter ({len(checked[0])}), got {len(value)}")
        checked.append(list(value))
    return [[None] * len(checked[0]) if value is None else value for value in checked]


def _host_number(value: Any, name: str) -> Any:
    """A number, or the one element of a 1-element array, read back to the host."""
    if not hasattr(value, "shape"):
        return value
    if value.size != 1:
        raise ValueError(f"{name} must be a number or a 1-element array, got an array of shape {tuple(value.shape)}")
    return value.reshape(()).item()


def unscale_gradients_multi(grads: Sequence[Any], inv_scale: float | Any, found_inf: Any) -> None:
    """The primitives' unscale (dynamic loss scaling), gradient by gradient in plain array expressions: a test
    for values that are not finite, then a scal. The flag (and a factor held in an array) stays on the device:
    no host read per gradient."""
    factor, factor_array = checks.check_unscale_arguments(grads, inv_scale, found_inf)
    for grad in grads:
        xp = backend.get_array_module(grad)
        xp.maximum(found_inf, xp.logical_not(xp.isfinite(grad)).any().astype(np.int32), out=found_inf)
        grad *= grad.dtype.type(np.float32(factor)) if factor_array is None else factor_array.astype(grad.dtype)


def update_loss_scale(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float, backoff_factor: float,
                      growth_interval: int) -> None:
    """The primitives' loss-scale update in plain array expressions (a select each for the scale and the count
    of clean steps), on the device without a host read."""
    growth_factor, backoff_factor, growth_interval = checks.check_loss_scale_arguments(
        scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
    xp = backend.get_array_module(scale)
    scale, growth_tracker = scale.reshape(1), growth_tracker.reshape(1)  # views: written in place below
    overflowed = found_inf.reshape(1) != 0
    clean_steps = growth_tracker + 1
    grow = xp.logical_and(~overflowed, clean_steps == growth_interval)
    with np.errstate(over="ignore"):
        grown = scale * np.float32(growth_factor)
    grown = xp.where(xp.isfinite(grown), grown, scale)
    scale[...] = xp.where(overflowed, scale * np.float32(backoff_factor), xp.where(grow, grown, scale))
    growth_tracker[...] = xp.where(xp.logical_or(overflowed, grow), 0, clean_steps)
