"""Batch normalisation, layer normalisation, softmax and the losses, dropout: plain array expressions, as a framework
without a primitives library writes them. Each operation is a separate pass over memory (on the
GPU, a separate CuPy kernel and temporary); nothing is fused. Caffe's batch norm
(batch_norm_layer.cu) was in the same spirit, a chain of about twenty BLAS calls and small kernels
per direction; its softmax loss and dropout (softmax_loss_layer.cu, dropout_layer.cu) a few
kernels each.

The arithmetic is PyTorch's, which is where these depart from Caffe: batch norm with its affine
weight and bias (Caffe left them to a separate Scale layer), a running mean and unbiased variance
updated with ``momentum`` (Caffe kept sums scaled by a moving-average factor); the losses on
log-softmax (Caffe took −log of the softmax clamped at FLT_MIN) with class weights and label
smoothing (Caffe had neither); dropout with the primitives' counter-based mask, so that both
engines draw the same masks (Caffe drew a cuRAND integer per element). The batch-norm variants
with ``relu`` are unfused compositions: the normalisation, then ReLU in place (Caffe nets ran
BatchNorm, Scale and an in-place ReLU as three layers); backward, ReLU's backward and then the
normalisation's.

Arguments are checked by the primitives' helpers (:mod:`minidnn.primitives.batchnorm`,
``softmax``, ``dropout``), so both engines refuse the same inputs with the same errors; the losses'
row arithmetic (the picked cost, the reduction, the per-row gradient scale) is the primitives'
NumPy code too, run as array expressions on either device.
"""
from __future__ import annotations

from typing import Any

from .. import backend
from ..primitives import batchnorm as bn_checks
from ..primitives import convert
from ..primitives import dropout as dropout_checks
from ..primitives import layernorm as ln_checks
from ..primitives import softmax as softmax_checks
from ..primitives.softmax import _picked_cost, _reduce, _row_scale
from ..primitives._checks import (check_bool, check_float, check_float_or_half, check_int, check_like,
                                  check_same_dtype, normalise_axis)
from ..primitives.dropout import _keep_scale, keep_mask
from .activation import relu_backward, relu_forward


# ----------------------------------------------------------------------------------------------
# Batch normalisation
# ----------------------------------------------------------------------------------------------
def _axes(x: Any) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


def _per_channel(v: Any, x: Any) -> Any:
    """(C,) -> (1, C, 1, ...) to broadcast against x."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _check_relu_output(relu_output: Any, x: Any) -> None:
    bn_checks._check_like_x(relu_output, x, "relu_output", optional=True)


def batch_norm_forward_training(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                momentum: float = 0.1, eps: float = 1e-5, relu: bool = False,
                                num_batches_tracked: Any = None) -> tuple[Any, Any, Any]:
    """Normalise with the batch statistics (biased variance), update the running ones in place (unbiased
    variance), then ReLU when ``relu``; num_batches_tracked (int64, one element) += 1 when given.
    x: (N, C, *spatial); returns y, and mean, invstd: (C,)."""
    xp = backend.get_array_module(x, weight, bias, running_mean, running_var)
    channels = bn_checks._check_input(x)
    bn_checks._check_channel_vector(weight, "weight", channels, x, optional=True)
    bn_checks._check_channel_vector(bias, "bias", channels, x, optional=True)
    bn_checks._check_running_statistics(running_mean, running_var, channels, x)
    momentum, eps = bn_checks._check_momentum(momentum), bn_checks._check_eps(eps)
    count = bn_checks._check_training_count(x)
    relu = check_bool(relu, "batch_norm: relu")
    bn_checks._check_batches_tracked(num_batches_tracked, x)
    if num_batches_tracked is not None:
        num_batches_tracked[...] += 1
    mean = x.mean(axis=_axes(x))
    centered = x - _per_channel(mean, x)
    var = (centered * centered).mean(axis=_axes(x))
    invstd = 1 / xp.sqrt(var + eps)
    if running_mean is not None:
        running_mean[...] = (1 - momentum) * running_mean + momentum * mean
        running_var[...] = (1 - momentum) * running_var + momentum * var * (count / (count - 1))
    y = _affine(centered * _per_channel(invstd, x), weight, bias, relu)
    return y, mean, invstd


def batch_norm_forward_inference(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                 eps: float = 1e-5, relu: bool = False) -> Any:
    """Normalise with the running statistics, then ReLU when ``relu``. x: (N, C, *spatial); returns y."""
    xp = backend.get_array_module(x, weight, bias, running_mean, running_var)
    channels = bn_checks._check_input(x)
    bn_checks._check_channel_vector(weight, "weight", channels, x, optional=True)
    bn_checks._check_channel_vector(bias, "bias", channels, x, optional=True)
    bn_checks._check_channel_vector(running_mean, "running_mean", channels, x)
    bn_checks._check_channel_vector(running_var, "running_var", channels, x)
    eps = bn_checks._check_eps(eps)
    relu = check_bool(relu, "batch_norm: relu")
    normalised = (x - _per_channel(running_mean, x)) / xp.sqrt(_per_channel(running_var, x) + eps)
    return _affine(normalised, weight, bias, relu)


def _affine(normalised: Any, weight: Any, bias: Any, relu: bool) -> Any:
    y = normalised if weight is None else normalised * _per_channel(weight, normalised)
    y = y if bias is None else y + _per_channel(bias, normalised)
    return relu_forward(y, out=y if y.flags.c_contiguous else None) if relu else y


def batch_norm_backward_training(dy: Any, x: Any, weight: Any, mean: Any, invstd: Any,
                                 relu_output: Any = None, bias: Any = None, relu: bool = False) -> tuple[Any, Any, Any]:
    """Gradients through the batch statistics; with ``relu_output`` (the forward's y after ReLU) dy is
    first masked by y > 0, and with ``relu`` by the same mask recomputed from x (the forward's arithmetic on its
    returned mean and invstd, and ``bias``). Returns dx: x's shape, dweight, dbias: (C,)."""
    backend.get_array_module(dy, x, weight, mean, invstd, relu_output, bias)
    channels = bn_checks._check_input(x)
    bn_checks._check_like_x(dy, x, "dy")
    bn_checks._check_channel_vector(weight, "weight", channels, x, optional=True)
    bn_checks._check_channel_vector(bias, "bias", channels, x, optional=True)
    bn_checks._check_channel_vector(mean, "mean", channels, x)
    bn_checks._check_channel_vector(invstd, "invstd", channels, x)
    count = bn_checks._check_nonempty_channels(x)
    _check_relu_output(relu_output, x)
    relu = check_bool(relu, "batch_norm_backward_training: relu")
    if relu and relu_output is not None:
        raise ValueError("batch_norm_backward_training: pass relu_output (the forward's y) or relu=True (the mask "
                         "recomputed from x), not both")
    normalised = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if relu:  # the forward's y before its ReLU: y > 0 where max(y, 0) > 0
        relu_output = _affine(normalised, weight, bias, False)
    if relu_output is not None:
        dy = relu_backward(dy, relu_output)
    dbias = dy.sum(axis=_axes(x))
    dweight = (dy * normalised).sum(axis=_axes(x))
    scale = invstd if weight is None else invstd * weight
    dx = _per_channel(scale, x) * (dy - _per_channel(dbias / count, x) - normalised * _per_channel(dweight / count, x))
    return dx, dweight, dbias


def batch_norm_backward_inference(dy: Any, x: Any, weight: Any, running_mean: Any, running_var: Any,
                                  eps: float = 1e-5, relu_output: Any = None) -> tuple[Any, Any, Any]:
    """Gradients with the running statistics as constants; ``relu_output`` as in the training backward."""
    xp = backend.get_array_module(dy, x, weight, running_mean, running_var, relu_output)
    channels = bn_checks._check_input(x)
    bn_checks._check_like_x(dy, x, "dy")
    bn_checks._check_channel_vector(weight, "weight", channels, x, optional=True)
    bn_checks._check_channel_vector(running_mean, "running_mean", channels, x)
    bn_checks._check_channel_vector(running_var, "running_var", channels, x)
    eps = bn_checks._check_eps(eps)
    _check_relu_output(relu_output, x)
    if relu_output is not None:
        dy = relu_backward(dy, relu_output)
    invstd = 1 / xp.sqrt(running_var + eps)
    scale = invstd if weight is None else invstd * weight
    dweight = (dy * (x - _per_channel(running_mean, x)) * _per_channel(invstd, x)).sum(axis=_axes(x))
    return dy * _per_channel(scale, x), dweight, dy.sum(axis=_axes(x))


# ----------------------------------------------------------------------------------------------
# Layer normalisation (Caffe had none: PyTorch's arithmetic, one expression per step)
# ----------------------------------------------------------------------------------------------
def layer_norm_forward(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                       eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """Each row of x normalised over its trailing normalized_shape axes; returns y, and mean, invstd: (M,)."""
    shape, rows, size, eps = ln_checks.check_forward_arguments(x, normalized_shape, weight, bias, eps)
    xp = backend.get_array_module(x)
    values = x.reshape(rows, size).astype(xp.float64)
    mean = values.mean(axis=1)
    invstd = 1.0 / xp.sqrt(((values - mean[:, None]) ** 2).mean(axis=1) + eps)
    y = (values - mean[:, None]) * invstd[:, None]
    if weight is not None:
        y = y * weight.reshape(size)
    if bias is not None:
        y = y + bias.reshape(size)
    return y.reshape(x.shape).astype(x.dtype), mean.astype(x.dtype), invstd.astype(x.dtype)


def layer_norm_backward(dy: Any, x: Any, normalized_shape: Any, weight: Any, mean: Any,
                        invstd: Any) -> tuple[Any, Any, Any]:
    """dx through each row's statistics, and dweight, dbias: normalized_shape."""
    shape, rows, size = ln_checks.check_backward_arguments(dy, x, normalized_shape, weight, mean, invstd)
    xp = backend.get_array_module(x)
    grads = dy.reshape(rows, size).astype(xp.float64)
    normalised = (x.reshape(rows, size) - mean[:, None]) * invstd[:, None]
    normalised = normalised.astype(xp.float64)
    g = grads if weight is None else grads * weight.reshape(size)
    dx = (g - g.mean(axis=1, keepdims=True) - normalised * (g * normalised).mean(axis=1, keepdims=True))
    dx = dx * invstd[:, None]
    dweight = (grads * normalised).sum(axis=0).reshape(shape)
    dbias = grads.sum(axis=0).reshape(shape)
    return dx.reshape(x.shape).astype(x.dtype), dweight.astype(x.dtype), dbias.astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Softmax and log-softmax
# ----------------------------------------------------------------------------------------------
def softmax_forward(x: Any, axis: int = -1) -> Any:
    check_float(x, "x")
    axis = normalise_axis(axis, x.ndim, "x")
    e = backend.get_array_module(x).exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(dy: Any, y: Any, axis: int = -1) -> Any:
    check_like(dy, y, "dy", "y")
    axis = normalise_axis(axis, y.ndim, "y")
    backend.get_array_module(dy, y)
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


def log_softmax_forward(x: Any, axis: int = -1) -> Any:
    check_float(x, "x")
    axis = normalise_axis(axis, x.ndim, "x")
    xp = backend.get_array_module(x)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


def log_softmax_backward(dy: Any, y: Any, axis: int = -1) -> Any:
    check_like(dy, y, "dy", "y")
    axis = normalise_axis(axis, y.ndim, "y")
    xp = backend.get_array_module(dy, y)
    return dy - xp.exp(y) * dy.sum(axis=axis, keepdims=True)


# ----------------------------------------------------------------------------------------------
# Losses (PyTorch's nll_loss and cross_entropy with class-index targets)
# ----------------------------------------------------------------------------------------------
def _rows(target: Any, weight: Any, ignore_index: int, num_classes: int, dtype: Any) -> tuple[Any, Any, Any]:
    """(kept, safe_target, row_weight), each (N,): rows not ignored; targets with ignored (and, on the GPU,
    unchecked out-of-range) ones replaced by class 0 so gathers stay in range; w[t_i] on kept rows, 0 on
    ignored ones and NaN for an out-of-range target (the primitives' GPU rule)."""
    xp = backend.get_array_module(target)
    kept = target != ignore_index
    valid = (target >= 0) & (target < num_classes)
    safe = xp.where(kept & valid, target, 0)
    class_weight = xp.ones(target.shape, dtype=dtype) if weight is None else weight[safe]
    row_weight = xp.where(kept, xp.where(valid, class_weight, xp.nan), 0).astype(dtype)
    return kept, safe, row_weight


def nll_loss_forward(log_probs: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                     reduction: str = "mean") -> Any:
    batch, num_classes = softmax_checks._check_scores(log_probs, "log_probs")
    softmax_checks.check_reduction(reduction)
    backend.get_array_module(log_probs, target, weight)
    target = softmax_checks._check_target(target, batch, num_classes, ignore_index)
    softmax_checks._check_weight(weight, num_classes, log_probs.dtype, "log_probs")
    kept, safe, row_weight = _rows(target, weight, ignore_index, num_classes, log_probs.dtype)
    return _reduce(row_weight * _picked_cost(log_probs, kept, safe), row_weight, reduction)


def nll_loss_backward(grad_loss: Any, target: Any, num_classes_shape: Any, weight: Any = None,
                      ignore_index: int = -100, reduction: str = "mean") -> Any:
    batch, num_classes = softmax_checks._check_num_classes_shape(num_classes_shape)
    softmax_checks.check_reduction(reduction)
    softmax_checks._check_grad_loss(grad_loss, batch, reduction)
    xp = backend.get_array_module(grad_loss, target, weight)
    target = softmax_checks._check_target(target, batch, num_classes, ignore_index)
    softmax_checks._check_weight(weight, num_classes, grad_loss.dtype, "grad_loss")
    kept, safe, row_weight = _rows(target, weight, ignore_index, num_classes, grad_loss.dtype)
    grad = xp.zeros((batch, num_classes), dtype=grad_loss.dtype)
    grad[xp.arange(batch), safe] = -row_weight * _row_scale(grad_loss, kept, row_weight, reduction)
    return grad


def cross_entropy_forward(logits: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                          label_smoothing: float = 0.0, reduction: str = "mean") -> tuple[Any, Any]:
    """log_softmax, then the picked (and with label smoothing, the uniform) cost; returns (loss, log_probs)."""
    batch, num_classes = softmax_checks._check_scores(logits, "logits")
    softmax_checks.check_reduction(reduction)
    xp = backend.get_array_module(logits, target, weight)
    target = softmax_checks._check_target(target, batch, num_classes, ignore_index)
    softmax_checks._check_weight(weight, num_classes, logits.dtype, "logits")
    epsilon = softmax_checks.check_label_smoothing(label_smoothing)
    log_probs = log_softmax_forward(logits, axis=1)
    kept, safe, row_weight = _rows(target, weight, ignore_index, num_classes, logits.dtype)
    losses = row_weight * _picked_cost(log_probs, kept, safe)
    if epsilon > 0:  # skipped, not multiplied by 0, when off: a log-probability of −inf would give NaN
        weighted = log_probs if weight is None else log_probs * weight
        uniform = xp.where(kept, -weighted.sum(axis=1), 0).astype(logits.dtype)
        losses = (1 - epsilon) * losses + (epsilon / num_classes) * uniform
    return _reduce(losses, row_weight, reduction), log_probs


def cross_entropy_backward(grad_loss: Any, log_probs: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                           label_smoothing: float = 0.0, reduction: str = "mean") -> Any:
    """By the chain rule, as separate passes: ∂loss/∂log_probs (the smoothed, weighted one-hot scaled per
    row), then through log-softmax."""
    batch, num_classes = softmax_checks._check_scores(log_probs, "log_probs")
    softmax_checks.check_reduction(reduction)
    softmax_checks._check_grad_loss(grad_loss, batch, reduction)
    check_same_dtype(grad_loss, log_probs, "grad_loss", "log_probs")
    xp = backend.get_array_module(grad_loss, log_probs, target, weight)
    target = softmax_checks._check_target(target, batch, num_classes, ignore_index)
    softmax_checks._check_weight(weight, num_classes, log_probs.dtype, "log_probs")
    epsilon = softmax_checks.check_label_smoothing(label_smoothing)
    kept, safe, row_weight = _rows(target, weight, ignore_index, num_classes, log_probs.dtype)
    grad_log_probs = xp.zeros_like(log_probs)
    grad_log_probs[xp.arange(batch), safe] = -(1 - epsilon) * row_weight
    if epsilon > 0:
        grad_log_probs -= epsilon / num_classes * (1 if weight is None else weight)
    scale = _row_scale(grad_loss, kept, row_weight, reduction)
    return log_softmax_backward(grad_log_probs * scale[:, None], log_probs, axis=1)


# ----------------------------------------------------------------------------------------------
# Dropout
# ----------------------------------------------------------------------------------------------
def dropout_forward(x: Any, p: float, seed: int, offset: int = 0) -> tuple[Any, Any]:
    """y = x·mask·1/(1 − p) (0 for p = 1), with the primitives' counter-based mask, so that both engines
    draw the same masks; returns (y, mask). A half x runs the float32 layer on its widening, y rounded once."""
    xp = backend.get_array_module(x)
    check_float_or_half(x, "x")
    p = dropout_checks.check_probability(p)
    seed = check_int(seed, "dropout: seed", 0, (1 << 64) - 1)
    offset = check_int(offset, "dropout: offset", 0)
    if convert.half_type_of(x) is not None:
        return convert.on_widened_first(dropout_forward, x, p, seed, offset)
    mask = keep_mask(tuple(x.shape), p, seed, offset, xp)
    return x * mask * _keep_scale(p, x.dtype), mask


def dropout_backward(dy: Any, mask: Any, p: float) -> Any:
    """dx = dy·mask·1/(1 − p) (half dy: widened, rounded once)."""
    backend.get_array_module(dy, mask)
    check_float_or_half(dy, "dy")
    p = dropout_checks.check_probability(p)
    dropout_checks._check_mask(mask, dy)
    if convert.half_type_of(dy) is not None:
        return convert.on_widened(dropout_backward, dy, mask, p)
    return dy * mask * _keep_scale(p, dy.dtype)

