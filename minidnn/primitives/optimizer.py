"""Optimizer updates as primitives: in place on one parameter array, or on a list of them at once.

The formulas are PyTorch's (``torch.optim.SGD``, ``Adam``, ``AdamW``), so a training run can be
compared step for step. ``sgd_update``/``adam_update`` update one parameter; ``sgd_update_multi``/
``adam_update_multi`` update a list of parameters of one dtype on one device with the same
hyper-parameters, which is what an optimizer's step does for a parameter group.

On the GPU a list costs a few launches of one fused kernel of optimizer.cu, not one per parameter
(apex's multi_tensor_apply): the tensors are taken in chunks of up to ``MAX_TENSORS``, and each
launch receives, by value as a kernel parameter, a table of its chunk's pointers and sizes and of
the (tensor, range of elements) that each of its blocks updates. No table is copied to the device,
so the launches can be captured in a CUDA graph. For the same reason the learning rate may be a
float64 array of one element on the parameters' device, which the kernel reads (Adam's step count
likewise, int64 or float64): a schedule can then change it between replays of a captured step.
Dynamic loss scaling keeps its state there too: ``unscale_gradients_multi`` may read the factor from
the device, ``sgd_update_multi`` skips its update when a device flag says the gradients overflowed,
and ``update_loss_scale`` grows or backs off the scale in place, so that no step reads the device.

The NumPy twin below does the same arithmetic, one tensor at a time. Every array must be
C-contiguous (the updates are in place and a kernel sees base pointers); the arguments are checked
the same way on both devices.
"""
from __future__ import annotations

import functools
import math
import numbers
import operator
import weakref
from itertools import repeat
from typing import Any, Callable, Sequence

import numpy as np

from .. import backend
from . import _cuda, layout
from ._checks import check_bool, check_dense, check_float, check_number

__all__ = ["sgd_update", "sgd_update_multi", "adam_update", "adam_update_multi", "unscale_gradients_multi",
           "update_loss_scale"]

# The kernels' table (struct TensorTable of optimizer.cu: the same fields, order and alignment).
LISTS = 5  # param, grad and up to three state arrays
MAX_TENSORS = 48
MAX_BLOCKS = 320
THREADS = 512
# elements_per_block is a multiple of one iteration of a block (THREADS threads × UNROLL elements).
BLOCK_GRANULE = THREADS * 4
_TABLE = np.dtype({"names": ["pointers", "sizes", "block_start", "elements_per_block", "block_tensor"],
                   "formats": [(np.uint64, (LISTS, MAX_TENSORS)), (np.int32, (MAX_TENSORS,)),
                               (np.int32, (MAX_BLOCKS,)), np.int32, (np.uint8, (MAX_BLOCKS,))]}, align=True)


def _finite_at_least_zero(value: float) -> bool:
    return 0.0 <= value < math.inf


# ----------------------------------------------------------------------------------------------
# SGD
# ----------------------------------------------------------------------------------------------


def sgd_update(param: Any, grad: Any, momentum_buffer: Any = None, *, lr: float | Any, momentum: float = 0.0,
               dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False,
               first_step: bool = False) -> None:
    """SGD with momentum, in place on ``param`` (and ``momentum_buffer``, same shape, when momentum > 0).

    g = ±grad + weight_decay·param; b = g on the first step, else momentum·b + (1 − dampening)·g;
    g = g + momentum·b (Nesterov) or b; param −= lr·g. lr: a number, or a float64 array of one
    element on param's device (read by the kernel). momentum_buffer is ignored when momentum is 0.
    """
    _sgd(_single_names, [param], [grad], [momentum_buffer], lr, momentum, dampening, weight_decay, nesterov,
         maximize, first_step)


def sgd_update_multi(params: Sequence[Any], grads: Sequence[Any], momentum_buffers: Sequence[Any] | None, *,
                     lr: float | Any, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                     nesterov: bool = False, maximize: bool = False, first_step: bool = False,
                     found_inf: Any = None) -> None:
    """:func:`sgd_update` of every ``params[i]`` with ``grads[i]`` and ``momentum_buffers[i]``.

    Lists of equal length; all arrays of one dtype (float32 or float64) on one device, each state
    array of its parameter's shape. ``momentum_buffers`` may be None when momentum is 0. On the GPU:
    one launch per chunk of ``MAX_TENSORS`` non-empty parameters. ``found_inf``: None, or an int32
    array of one element on the params' device (:func:`unscale_gradients_multi`'s flag); nothing is
    updated when it holds a value other than 0, which the kernel reads (no host read on the GPU).
    """
    _sgd(_multi_names, params, grads, momentum_buffers, lr, momentum, dampening, weight_decay, nesterov,
         maximize, first_step, found_inf)


def _sgd_settings(names: Callable[[str, int], str], params: Sequence[Any], grads: Sequence[Any], buffers: Any,
                  lr: Any, momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
                  first_step: bool, found_inf: Any = None) -> tuple:
    """Every check of the SGD updates; returns (lr value, lr array or None, momentum, dampening,
    weight_decay, nesterov, maximize, first_step)."""
    momentum = check_number(momentum, "momentum", _finite_at_least_zero, "a finite number >= 0")
    dampening = check_number(dampening, "dampening", _finite_at_least_zero, "a finite number >= 0")
    weight_decay = check_number(weight_decay, "weight_decay", _finite_at_least_zero, "a finite number >= 0")
    nesterov, maximize = check_bool(nesterov, "nesterov"), check_bool(maximize, "maximize")
    first_step = check_bool(first_step, "first_step")
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("nesterov momentum requires a momentum > 0 and zero dampening")
    lists = [("param", params), ("grad", grads)]
    if momentum:
        lists.append(("momentum_buffer", buffers))
    _check_lists(names, lists)
    lr_value, lr_array = _check_device_scalar(names, lr, "lr", params, (np.dtype(np.float64),))
    if found_inf is not None:
        _check_one_element(found_inf, "found_inf", np.int32, params[0] if params else None, "the params'")
    return lr_value, lr_array, momentum, dampening, weight_decay, nesterov, maximize, first_step


def _check_sgd_arguments(param: Any, grad: Any, momentum_buffer: Any, lr: Any, momentum: Any, dampening: Any,
                         weight_decay: Any, nesterov: Any, maximize: Any, first_step: Any) -> tuple:
    """The checks of :func:`sgd_update` (the naive engine checks with them too); returns (lr, momentum,
    dampening, weight_decay) as floats and (nesterov, maximize, first_step) as bools."""
    lr_value, _, *settings = _sgd_settings(_single_names, [param], [grad], [momentum_buffer], lr, momentum,
                                           dampening, weight_decay, nesterov, maximize, first_step)
    return (lr_value, *settings)


def _sgd(names: Callable[[str, int], str], params: Sequence[Any], grads: Sequence[Any], buffers: Any, lr: Any,
         momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
         first_step: bool, found_inf: Any = None) -> None:
    lr_value, lr_array, momentum, dampening, weight_decay, nesterov, maximize, first_step = _sgd_settings(
        names, params, grads, buffers, lr, momentum, dampening, weight_decay, nesterov, maximize, first_step,
        found_inf)
    if params and backend.is_cuda_array(params[0]):
        from ._cuda import f64, i32  # noqa: PLC0415 - GPU only

        _launch_chunks("sgd_update_multi", [params, grads, buffers if momentum else None],
                       (lr_array, f64(lr_value), f64(momentum), f64(dampening), f64(weight_decay), i32(nesterov),
                        i32(maximize), i32(first_step), found_inf))
        return
    if found_inf is not None and found_inf.reshape(()).item():
        return
    for i, (param, grad) in enumerate(zip(params, grads)):
        g = -grad if maximize else grad
        if weight_decay:
            g = g + weight_decay * param
        if momentum:
            buffer = buffers[i]
            if first_step:
                buffer[...] = g
            else:
                buffer *= momentum
                buffer += (1.0 - dampening) * g
            g = g + momentum * buffer if nesterov else buffer
        param -= lr_value * g


# ----------------------------------------------------------------------------------------------
# Adam and AdamW
# ----------------------------------------------------------------------------------------------


def adam_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, step: int | Any, lr: float | Any,
                beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                decoupled_weight_decay: bool = False, amsgrad: bool = False, max_exp_avg_sq: Any = None,
                maximize: bool = False) -> None:
    """Adam (or AdamW with ``decoupled_weight_decay``), in place; ``step`` counts from 1.

    AdamW: param *= 1 − lr·weight_decay; Adam: g += weight_decay·param. Then
    m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g²; param −= lr/(1 − β1^t) · m / (√v/√(1 − β2^t) + eps),
    with v replaced by its running maximum (``max_exp_avg_sq``) under AMSGrad. lr: a number or a
    float64 array of one element on param's device; step: an int >= 1 or an int64/float64 array of
    one element there (the kernel then computes the bias corrections).
    """
    _adam(_single_names, [param], [grad], [exp_avg], [exp_avg_sq], [max_exp_avg_sq], step, lr, beta1, beta2, eps,
          weight_decay, decoupled_weight_decay, amsgrad, maximize)


def adam_update_multi(params: Sequence[Any], grads: Sequence[Any], exp_avgs: Sequence[Any], exp_avg_sqs: Sequence[Any],
                      max_exp_avg_sqs: Sequence[Any] | None, *, step: int | Any, lr: float | Any, beta1: float = 0.9,
                      beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                      decoupled_weight_decay: bool = False, amsgrad: bool = False, maximize: bool = False) -> None:
    """:func:`adam_update` of every ``params[i]`` with its gradient and state, one ``step`` for all.

    Lists of equal length; all arrays of one dtype on one device, each state array of its
    parameter's shape. ``max_exp_avg_sqs`` may be None unless ``amsgrad``. On the GPU: one launch
    per chunk of ``MAX_TENSORS`` non-empty parameters.
    """
    _adam(_multi_names, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps,
          weight_decay, decoupled_weight_decay, amsgrad, maximize)


def _adam_settings(names: Callable[[str, int], str], params: Sequence[Any], grads: Sequence[Any],
                   exp_avgs: Sequence[Any], exp_avg_sqs: Sequence[Any], max_exp_avg_sqs: Any, step: Any, lr: Any,
                   beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool, amsgrad: bool,
                   maximize: bool) -> tuple:
    """Every check of the Adam updates; returns (step value, step array or None, lr value, lr array or
    None, beta1, beta2, eps, weight_decay, decoupled, amsgrad, maximize)."""
    beta1 = check_number(beta1, "beta1", lambda b: 0.0 <= b < 1.0, "in [0, 1)")
    beta2 = check_number(beta2, "beta2", lambda b: 0.0 <= b < 1.0, "in [0, 1)")
    eps = check_number(eps, "eps", _finite_at_least_zero, "a finite number >= 0")
    weight_decay = check_number(weight_decay, "weight_decay", _finite_at_least_zero, "a finite number >= 0")
    decoupled = check_bool(decoupled, "decoupled_weight_decay")
    amsgrad, maximize = check_bool(amsgrad, "amsgrad"), check_bool(maximize, "maximize")
    lists = [("param", params), ("grad", grads), ("exp_avg", exp_avgs), ("exp_avg_sq", exp_avg_sqs)]
    if amsgrad:
        lists.append(("max_exp_avg_sq", max_exp_avg_sqs))
    _check_lists(names, lists)
    lr_value, lr_array = _check_device_scalar(names, lr, "lr", params, (np.dtype(np.float64),))
    step_value, step_array = _check_device_scalar(names, step, "step", params,
                                                  (np.dtype(np.int64), np.dtype(np.float64)), integer=True)
    return (step_value, step_array, lr_value, lr_array, beta1, beta2, eps, weight_decay, decoupled, amsgrad,
            maximize)


def _check_adam_arguments(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, max_exp_avg_sq: Any, step: Any,
                          lr: Any, beta1: Any, beta2: Any, eps: Any, weight_decay: Any, decoupled_weight_decay: Any,
                          amsgrad: Any, maximize: Any) -> tuple:
    """The checks of :func:`adam_update` (the naive engine checks with them too); returns (step, lr,
    beta1, beta2, eps, weight_decay) as an int and floats and (decoupled_weight_decay, amsgrad,
    maximize) as bools."""
    step_value, _, lr_value, _, *settings = _adam_settings(
        _single_names, [param], [grad], [exp_avg], [exp_avg_sq], [max_exp_avg_sq], step, lr, beta1, beta2, eps,
        weight_decay, decoupled_weight_decay, amsgrad, maximize)
    return (int(step_value), lr_value, *settings)


def _adam(names: Callable[[str, int], str], params: Sequence[Any], grads: Sequence[Any], exp_avgs: Sequence[Any],
          exp_avg_sqs: Sequence[Any], max_exp_avg_sqs: Any, step: Any, lr: Any, beta1: float, beta2: float, eps: float,
          weight_decay: float, decoupled: bool, amsgrad: bool, maximize: bool) -> None:
    (step_value, step_array, lr_value, lr_array, beta1, beta2, eps, weight_decay, decoupled, amsgrad,
     maximize) = _adam_settings(names, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2,
                                eps, weight_decay, decoupled, amsgrad, maximize)
    if params and backend.is_cuda_array(params[0]):
        from ._cuda import f64, i32  # noqa: PLC0415 - GPU only

        step_is_int = step_array is not None and step_array.dtype == np.int64
        lists = [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else None]
        _launch_chunks("adam_update_multi", lists,
                       (lr_array, f64(lr_value), step_array if step_is_int else None,
                        None if step_is_int else step_array, f64(step_value), f64(beta1), f64(beta2), f64(eps),
                        f64(weight_decay), i32(decoupled), i32(amsgrad), i32(maximize)))
        return
    bias_correction1 = 1.0 - beta1 ** step_value
    bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** step_value)
    for i, (param, grad, exp_avg, exp_avg_sq) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        xp = backend.get_array_module(param)
        g = -grad if maximize else grad
        if weight_decay:
            if decoupled:
                param *= 1.0 - lr_value * weight_decay
            else:
                g = g + weight_decay * param
        exp_avg *= beta1
        exp_avg += (1.0 - beta1) * g
        exp_avg_sq *= beta2
        exp_avg_sq += (1.0 - beta2) * g * g
        second = exp_avg_sq
        if amsgrad:
            second = max_exp_avg_sqs[i]
            xp.maximum(second, exp_avg_sq, out=second)
        denominator = xp.sqrt(second) / bias_correction2_sqrt + eps
        param -= (lr_value / bias_correction1) * exp_avg / denominator


# ----------------------------------------------------------------------------------------------
# Unscaling gradients (dynamic loss scaling)
# ----------------------------------------------------------------------------------------------
def check_unscale_arguments(grads: Any, inv_scale: Any, found_inf: Any) -> tuple[float, Any]:
    """The checks of :func:`unscale_gradients_multi` (the naive engine checks with them too); returns (the
    factor, None) for a number and (0.0, the array) for a factor held in a float32 array."""
    if not isinstance(grads, (list, tuple)):
        raise TypeError(f"grads must be a list or tuple of arrays, got {type(grads).__name__}")
    _check_lists(lambda name, index: f"grads[{index}]", [("param", grads)])
    first = grads[0] if grads else None
    _check_one_element(found_inf, "found_inf", np.int32, first, "the grads'")
    if hasattr(inv_scale, "dtype"):  # the factor on the device: its value is the kernel's to read
        _check_one_element(inv_scale, "inv_scale", np.float32, first, "the grads'")
        return 0.0, inv_scale
    return check_number(inv_scale, "inv_scale", lambda v: 0 < v < math.inf, "a finite number > 0"), None


def unscale_gradients_multi(grads: Sequence[Any], inv_scale: float | Any, found_inf: Any) -> None:
    """grads[i] *= inv_scale in place for every gradient, after setting ``found_inf[0] = 1`` if any value of
    any of them is inf or NaN (``found_inf`` is otherwise left as it is: the caller zeroes it). The step of
    ``minidnn.amp.GradScaler``, as PyTorch's ``_amp_foreach_non_finite_check_and_unscale_``: the values are
    checked before the multiplication, and the factor is ``inv_scale`` rounded to float32 for either dtype.

    grads: C-contiguous float32 or float64 arrays of one dtype and device; inv_scale: a finite number > 0,
    or a float32 array of one element on the grads' device (read by the kernel, so that a captured step
    unscales by the scale of its replay); found_inf: an int32 array of one element on the grads' device.
    """
    factor, factor_array = check_unscale_arguments(grads, inv_scale, found_inf)
    if not grads:
        return
    if backend.is_cuda_array(grads[0]):
        from ._cuda import f64  # noqa: PLC0415 - GPU only

        _launch_chunks("unscale_gradients_multi", [grads], (factor_array, f64(factor), found_inf))
        return
    if factor_array is not None:
        factor = factor_array.reshape(()).item()
    for grad in grads:
        if not np.isfinite(grad).all():
            found_inf.reshape(-1)[0] = 1
        grad *= grad.dtype.type(np.float32(factor))


def check_loss_scale_arguments(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: Any,
                               backoff_factor: Any, growth_interval: Any) -> tuple[float, float, int]:
    """The checks of :func:`update_loss_scale` (the naive engine checks with them too); returns the factors
    and the interval."""
    _check_one_element(scale, "scale", np.float32, None, "")
    _check_one_element(growth_tracker, "growth_tracker", np.int32, scale, "scale's")
    _check_one_element(found_inf, "found_inf", np.int32, scale, "scale's")
    growth_factor = check_number(growth_factor, "growth_factor", lambda v: 1 < v < math.inf, "a finite number > 1")
    backoff_factor = check_number(backoff_factor, "backoff_factor", lambda v: 0 < v < 1, "a number in (0, 1)")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral) or \
            not 1 <= growth_interval < 2**31:
        raise ValueError(f"growth_interval must be an int >= 1, got {growth_interval!r}")
    return growth_factor, backoff_factor, int(growth_interval)


def update_loss_scale(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float, backoff_factor: float,
                      growth_interval: int) -> None:
    """Dynamic loss scaling's update, in place, as PyTorch's ``_amp_update_scale_``: after an overflow
    (``found_inf`` != 0) scale *= backoff_factor and growth_tracker = 0; otherwise growth_tracker += 1, and
    when it reaches growth_interval, scale *= growth_factor (only if the float32 product is finite) and
    growth_tracker = 0. One thread on the GPU, no host read: a captured step updates the scale at each replay.

    scale: a float32 array of one element; growth_tracker and found_inf: int32 arrays of one element, on
    scale's device; growth_factor > 1; 0 < backoff_factor < 1; growth_interval an int >= 1.
    """
    growth_factor, backoff_factor, growth_interval = check_loss_scale_arguments(
        scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
    if backend.is_cuda_array(scale):
        kernel = _cuda.function("optimizer.cu", "update_loss_scale", np.float32)
        _cuda.launch_blocks(kernel, 1, 1, (scale, growth_tracker, found_inf, _cuda.f64(growth_factor),
                                           _cuda.f64(backoff_factor), _cuda.i32(growth_interval)))
        return
    scale, growth_tracker = scale.reshape(-1), growth_tracker.reshape(-1)
    if found_inf.reshape(()).item():
        scale[0] *= np.float32(backoff_factor)
        growth_tracker[0] = 0
        return
    clean_steps = int(growth_tracker[0]) + 1
    if clean_steps == growth_interval:
        with np.errstate(over="ignore"):
            grown = scale[0] * np.float32(growth_factor)
        if np.isfinite(grown):
            scale[0] = grown
        clean_steps = 0
    growth_tracker[0] = clean_steps


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def _single_names(name: str, index: int) -> str:
    return name


def _multi_names(name: str, index: int) -> str:
    return f"{name}s[{index}]"


def _check_lists(names: Callable[[str, int], str], lists: list[tuple[str, Any]]) -> None:
    """Every list holds one float array per parameter: the params' dtype and device, and the shape and layout of
    its parameter (C-contiguous, or channels-last: the kernels walk them as flat buffers). ``names(name, i)`` is
    how errors name element i ("grad" or "grads[3]")."""
    (_, params), *states = lists
    for name, arrays in lists:
        if not isinstance(arrays, (list, tuple)):  # (only the multi-tensor functions take lists from callers)
            raise TypeError(f"{name}s must be a list or tuple of arrays, got {type(arrays).__name__}")
        if len(arrays) != len(params):
            raise ValueError(f"{name}s must have one array per parameter ({len(params)}), got {len(arrays)}")
    if not params:
        return
    first = params[0]
    check_float(first, names("param", 0))
    device_id = first.data.device_id if backend.is_cuda_array(first) else None  # (same type: same library)
    if device_id is not None and _steady_lists_pass(lists, device_id):
        return
    # An optimizer step checks hundreds of arrays: one cheap test each, the itemised checks (and their
    # messages) only for an array that fails it.
    for name, arrays in lists:
        for i, array in enumerate(arrays):
            # A state array laid out as its parameter (checked first) is as dense as it is.
            if not (type(array) is type(first) and array.dtype == first.dtype
                    and (array.flags.c_contiguous if name == "param" else layout.same_order(array, params[i]))
                    and (device_id is None or array.data.device_id == device_id)):
                _check_array(names, name, i, array, params)


# The steady state of a training step on the GPU: its optimizer passes the same parameters and state arrays every step
# and new gradients of the same shapes. The arrays of the last lists that passed (all but the gradients), held weakly
# and keyed by their names, pass again as the same objects: a CuPy array's dtype, size, device and contiguity are
# fixed for its life. Every other array takes a few list-wide comparisons against the parameters, in C, and any
# failure the itemised checks below, which say what is wrong.
_passed: dict[tuple, dict[str, list]] = {}
_MOST_PASSED = 16
_shape, _strides, _dtype, _device = (operator.attrgetter(name) for name in ("shape", "strides", "dtype",
                                                                           "data.device_id"))
_call_reference = weakref.ref.__call__


@functools.lru_cache(maxsize=256)
def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides of a C-contiguous array of ``shape`` (every axis's, lengths of 1 and 0 included)."""
    strides, step = [], itemsize
    for length in reversed(shape):
        strides.append(step)
        step *= max(length, 1)
    return tuple(reversed(strides))


def _steady_lists_pass(lists: list[tuple[str, Any]], device_id: int) -> bool:
    """Whether every array of ``lists`` (CuPy arrays, params first) passes :func:`_check_lists` by the steady state's
    quick tests; False sends the call to the itemised checks. See ``_passed``."""
    (_, params), *states = lists
    first = params[0]
    kind, dtype = type(first), first.dtype
    key = tuple(name for name, _ in lists)
    kept = _passed.get(key)
    shapes = strides = None
    fresh = []  # the lists, other than the gradients, that were not those of the last pass
    # The params come first: new params make every list new (a state array passed beside its parameter).
    for name, arrays in lists:
        if name == "grad" or kept is None or fresh or len(kept[name]) != len(arrays) or \
                not all(map(operator.is_, map(_call_reference, kept[name]), arrays)):
            if name != "grad":
                fresh.append(name)
            if not (all(map(operator.is_, map(type, arrays), repeat(kind)))
                    and all(map(operator.eq, map(_dtype, arrays), repeat(dtype)))
                    and all(map(operator.eq, map(_device, arrays), repeat(device_id)))):
                return False
            if shapes is None:
                shapes, strides = list(map(_shape, params)), list(map(_strides, params))
            if name == "param":
                if list(map(_c_strides, shapes, repeat(first.itemsize))) != strides:
                    return False
            elif list(map(_shape, arrays)) != shapes or list(map(_strides, arrays)) != strides:
                return False
    if fresh:
        if len(_passed) >= _MOST_PASSED:
            _passed.clear()
        _passed[key] = {name: [weakref.ref(a) for a in arrays] for name, arrays in lists if name != "grad"}
    return True


def _check_array(names: Callable[[str, int], str], name: str, i: int, array: Any, params: Sequence[Any]) -> None:
    """The itemised checks of list ``name``'s element i, each with its own message."""
    label, first = names(name, i), names("param", 0)
    check_float(array, label)
    if array.dtype != params[0].dtype:
        raise TypeError(f"{label} must have {first}'s dtype {params[0].dtype}, got {array.dtype}")
    if backend.device_of(array) != backend.device_of(params[0]):
        raise ValueError(f"{label} must be on {first}'s device {backend.device_of(params[0])}, "
                         f"got {backend.device_of(array)}")
    if name != "param" and tuple(array.shape) != tuple(params[i].shape):
        raise ValueError(f"{label} must have {names('param', i)}'s shape {tuple(params[i].shape)}, "
                         f"got {tuple(array.shape)}")
    check_dense(array, label)
    if name != "param" and not layout.same_order(array, params[i]):
        raise ValueError(f"{label} must be laid out as {names('param', i)} (C-contiguous or channels-last, strides "
                         f"{params[i].strides}), got strides {array.strides}")


def _check_one_element(array: Any, name: str, dtype: Any, like: Any, like_name: str) -> None:
    """``array`` is a ``dtype`` array of one element (shape () or (1,)) on ``like``'s device (when given)."""
    if getattr(array, "dtype", None) != dtype or getattr(array, "size", 0) != 1 or array.ndim > 1:
        kind = np.dtype(dtype).name
        raise TypeError(f"{name} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind} array of shape () or (1,), "
                        f"got {array!r}")
    if like is not None and backend.device_index(array) != backend.device_index(like):
        raise ValueError(f"{name} must be on {like_name} device {backend.device_of(like)}, "
                         f"got {backend.device_of(array)}")


def _check_device_scalar(names: Callable[[str, int], str], value: Any, name: str, params: Sequence[Any],
                         dtypes: tuple[np.dtype, ...], integer: bool = False) -> tuple[float, Any]:
    """lr (>= 0) or step (>= 1, ``integer``): a Python number, or an array of one element of ``dtypes`` on
    the params' device. Returns (value, None) for a number or a NumPy array (whose value is read and
    checked), (0.0, array) for a device array (its value is the kernel's to read)."""
    minimum, expected = (1.0, "an int >= 1") if integer else (0.0, "a finite number >= 0")
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        if integer and not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int or an array of one element, got {value!r}")
        return check_number(value, name, lambda v: minimum <= v < math.inf, expected), None
    wanted = " or ".join(str(d) for d in dtypes)
    dtype = getattr(value, "dtype", None)
    # `dtype is None` first: NumPy compares np.dtype("float64") == None as True.
    if dtype is None or dtype not in dtypes or value.size != 1 or value.ndim > 1:
        raise TypeError(f"{name} must be a number or a {wanted} array of shape () or (1,), got {value!r}")
    if params and backend.device_index(value) != backend.device_index(params[0]):
        raise ValueError(f"{name} must be on {names('param', 0)}'s device {backend.device_of(params[0])}, "
                         f"got {backend.device_of(value)}")
    if backend.is_cuda_array(value):
        return 0.0, value
    return check_number(value.reshape(()).item(), name, lambda v: minimum <= v < math.inf, expected), None


# ----------------------------------------------------------------------------------------------
# GPU: chunks of tensors, one launch each
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def launch_plan(sizes: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], int, np.ndarray, np.ndarray], ...]:
    """How tensors of these sizes are updated: one entry per launch, (the indices of its tensors,
    elements_per_block, block_tensor, block_start), where block b of the launch updates elements
    [block_start[b], block_start[b] + elements_per_block) of its tensor number block_tensor[b] (an
    index into the launch's tensors), clipped to that tensor's size.

    Empty tensors are left out; a launch holds at most MAX_TENSORS tensors and MAX_BLOCKS blocks, which
    ceil(total / (MAX_BLOCKS − tensors)) elements per block guarantee: Σ ceil(size/E) <= total/E + tensors.
    Pure host arithmetic, cached per list of sizes (an optimizer's step repeats the same list).
    """
    nonempty = [i for i, size in enumerate(sizes) if size > 0]
    plan = []
    for first in range(0, len(nonempty), MAX_TENSORS):
        indices = tuple(nonempty[first:first + MAX_TENSORS])
        chunk_sizes = np.array([sizes[i] for i in indices], dtype=np.int64)
        needed = -(-int(chunk_sizes.sum()) // (MAX_BLOCKS - len(indices)))
        elements_per_block = max(1, -(-needed // BLOCK_GRANULE)) * BLOCK_GRANULE
        blocks_per_tensor = -(-chunk_sizes // elements_per_block)
        block_tensor = np.repeat(np.arange(len(indices)), blocks_per_tensor)
        first_block = np.cumsum(blocks_per_tensor) - blocks_per_tensor
        block_start = (np.arange(block_tensor.size) - first_block[block_tensor]) * elements_per_block
        plan.append((indices, elements_per_block, block_tensor.astype(np.uint8), block_start.astype(np.int32)))
    return tuple(plan)


def _launch_chunks(kernel_name: str, lists: list[Sequence[Any] | None], arguments: tuple) -> None:
    """Launch ``kernel_name`` once per chunk of the plan for ``lists[0]``'s sizes; ``lists``: the kernel's
    tensor lists in its order (None: a list it does not read); ``arguments``: its arguments after the table
    (arrays, None, NumPy scalars).

    The launches are kept (``_kept``): a call whose sizes, lists and kinds of arguments were seen before on this GPU
    writes its addresses into each chunk's packed table and its scalars into their slots, and launches (no CuPy
    conversion of a table of a few kilobytes per launch)."""
    params = lists[0]
    sizes = tuple(map(_size, params))
    _cuda.check_int32(max(sizes))
    key = (kernel_name, params[0].dtype, params[0].data.device_id, sizes, tuple(a is None for a in lists),
           tuple(a.dtype if isinstance(a, np.generic) else None for a in arguments))
    chunks = _kept.get(key)
    if chunks is None:
        chunks = _keep_chunks(key, kernel_name, lists, arguments)
    per_call = [a for a in arguments if not isinstance(a, np.generic)]  # arrays and Nones
    for launch, pointers, scalars, indices in chunks:
        for position, arrays in enumerate(lists):
            if arrays is not None:
                pointers[position, :len(indices)] = list(map(_pointer, map(arrays.__getitem__, indices)))
        for view, value in zip(scalars, (a for a in arguments if isinstance(a, np.generic))):
            view[0] = value
        launch(*per_call)


# Kept launches of the multi-tensor kernels, by their call's key (see _launch_chunks): per chunk of the plan, its
# PackedLaunch, its packed table's pointers (a view to write each call's addresses into), its scalars' views and
# its tensors' indices.
_kept: dict[tuple, list] = {}
_MOST_KEPT = 128
_size, _pointer = operator.attrgetter("size"), operator.attrgetter("data.ptr")


def _keep_chunks(key: tuple, kernel_name: str, lists: list[Sequence[Any] | None], arguments: tuple) -> list:
    """The chunks of ``_kept[key]``, made: each chunk's table filled but for its addresses, its launch packed with
    the table and ``arguments`` (their arrays and Nones passed per call)."""
    params = lists[0]
    kernel = _cuda.function("optimizer.cu", kernel_name, params[0].dtype)
    P = _cuda.PER_CALL
    packed_arguments = tuple(a if isinstance(a, np.generic) else P for a in arguments)
    chunks = []
    for indices, elements_per_block, block_tensor, block_start in launch_plan(key[3]):
        table = np.zeros(1, dtype=_TABLE)
        table["sizes"][0, :len(indices)] = [params[i].size for i in indices]
        table["block_tensor"][0, :block_tensor.size] = block_tensor
        table["block_start"][0, :block_start.size] = block_start
        table["elements_per_block"] = elements_per_block
        launch = _cuda.PackedLaunch(kernel, (block_tensor.size,), (THREADS,), (table[0], *packed_arguments))
        scalars = [launch.argument_view(1 + i) for i, a in enumerate(packed_arguments) if a is not P]
        chunks.append((launch, launch.argument_view(0)["pointers"][0], scalars, indices))
    if len(_kept) >= _MOST_KEPT:
        _kept.clear()
    _kept[key] = chunks  # (host memory only: a launch made while a graph is captured serves the eager calls too)
    return chunks
