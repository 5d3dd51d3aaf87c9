"""Everything but convolution, as a framework without a primitives library writes it: plain array
expressions, each a separate pass over memory (on the GPU, each a separate CuPy kernel and a
temporary), no fused kernels. Same signatures and results as :mod:`minidnn.primitives`.
"""
from __future__ import annotations

import math
from typing import Any

from .. import backend
from ..primitives import pair
from ..primitives.dropout import keep_mask
from ..primitives.pooling import pool_output_size


def _xp(*arrays: Any) -> Any:
    return backend.get_array_module(*arrays)


# --- linear -----------------------------------------------------------------------------------
def linear_forward(x: Any, weight: Any, bias: Any = None) -> Any:
    y = x @ weight.T
    return y if bias is None else y + bias


def linear_backward_data(dy: Any, weight: Any) -> Any:
    return dy @ weight


def linear_backward_weight(x: Any, dy: Any) -> Any:
    return dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])


# --- activations ------------------------------------------------------------------------------
def relu_forward(x: Any, out: Any = None) -> Any:
    return _xp(x).maximum(x, 0, out=out)


def relu_backward(dy: Any, y: Any) -> Any:
    return dy * (y > 0)


def sigmoid_forward(x: Any) -> Any:
    xp = _xp(x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def sigmoid_backward(dy: Any, y: Any) -> Any:
    return dy * y * (1 - y)


def tanh_forward(x: Any) -> Any:
    return _xp(x).tanh(x)


def tanh_backward(dy: Any, y: Any) -> Any:
    return dy * (1 - y * y)


# --- softmax and losses -----------------------------------------------------------------------
def softmax_forward(x: Any, axis: int = -1) -> Any:
    e = _xp(x).exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(dy: Any, y: Any, axis: int = -1) -> Any:
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


def log_softmax_forward(x: Any, axis: int = -1) -> Any:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - _xp(x).log(_xp(x).exp(shifted).sum(axis=axis, keepdims=True))


def log_softmax_backward(dy: Any, y: Any, axis: int = -1) -> Any:
    return dy - _xp(y).exp(y) * dy.sum(axis=axis, keepdims=True)


def _row_terms(log_probs: Any, target: Any, weight: Any, ignore_index: int, label_smoothing: float):
    """Per-row losses and the row weights of PyTorch's cross-entropy over log-probabilities."""
    xp = _xp(log_probs)
    kept = target != ignore_index
    safe = xp.where(kept, target, 0)
    rows = xp.arange(log_probs.shape[0])
    class_weight = xp.ones(log_probs.shape[1], log_probs.dtype) if weight is None else weight
    row_weight = class_weight[safe] * kept
    picked = -log_probs[rows, safe] * row_weight
    if label_smoothing:
        smooth = -(log_probs * class_weight).sum(axis=1) * kept
        picked = (1 - label_smoothing) * picked + label_smoothing / log_probs.shape[1] * smooth
    return picked, row_weight, kept, safe, class_weight


def _reduce(losses: Any, row_weight: Any, reduction: str) -> Any:
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.sum() / row_weight.sum()


def nll_loss_forward(log_probs: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                     reduction: str = "mean") -> Any:
    losses, row_weight, *_ = _row_terms(log_probs, target, weight, ignore_index, 0.0)
    return _xp(log_probs).asarray(_reduce(losses, row_weight, reduction), dtype=log_probs.dtype)


def _row_scale(grad_loss: Any, row_weight: Any, reduction: str) -> Any:
    if reduction == "none":
        return grad_loss
    return grad_loss / row_weight.sum() if reduction == "mean" else grad_loss


def nll_loss_backward(grad_loss: Any, target: Any, num_classes_shape: Any, weight: Any = None,
                      ignore_index: int = -100, reduction: str = "mean") -> Any:
    xp = _xp(grad_loss)
    grad = xp.zeros(tuple(num_classes_shape), dtype=grad_loss.dtype)
    kept = target != ignore_index
    safe = xp.where(kept, target, 0)
    row_weight = (xp.ones(grad.shape[1], grad.dtype) if weight is None else weight)[safe] * kept
    grad[xp.arange(grad.shape[0]), safe] = -row_weight * _row_scale(grad_loss, row_weight, reduction)
    return grad


def cross_entropy_forward(logits: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                          label_smoothing: float = 0.0, reduction: str = "mean") -> tuple[Any, Any]:
    log_probs = log_softmax_forward(logits, axis=1)
    losses, row_weight, *_ = _row_terms(log_probs, target, weight, ignore_index, label_smoothing)
    return _xp(logits).asarray(_reduce(losses, row_weight, reduction), dtype=logits.dtype), log_probs


def cross_entropy_backward(grad_loss: Any, log_probs: Any, target: Any, weight: Any = None, ignore_index: int = -100,
                           label_smoothing: float = 0.0, reduction: str = "mean") -> Any:
    """The gradient through log-softmax by the chain rule, as separate array operations."""
    xp = _xp(log_probs)
    _, row_weight, kept, safe, class_weight = _row_terms(log_probs, target, weight, ignore_index, label_smoothing)
    scale = _row_scale(grad_loss, row_weight, reduction) * kept
    grad_log_probs = xp.zeros_like(log_probs)
    grad_log_probs[xp.arange(log_probs.shape[0]), safe] = -(1 - label_smoothing) * class_weight[safe]
    if label_smoothing:
        grad_log_probs = grad_log_probs - label_smoothing / log_probs.shape[1] * class_weight
    return log_softmax_backward(grad_log_probs * scale[:, None], log_probs, axis=1)


# --- pooling ----------------------------------------------------------------------------------
def _geometry(x_shape: tuple, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool):
    kernel = pair(kernel_size, "kernel_size", minimum=1)
    stride = kernel if stride is None else pair(stride, "stride", minimum=1)
    padding, dilation = pair(padding, "padding"), pair(dilation, "dilation", minimum=1)
    out = tuple(pool_output_size(x_shape[2 + a], kernel[a], stride[a], padding[a], dilation[a], ceil_mode)
                for a in range(2))
    return kernel, stride, padding, dilation, out


def _taps(kernel, stride, dilation, out):
    """(r, s, rows, cols): the slices of the padded input that tap (r, s) reads, one per output pixel."""
    for r in range(kernel[0]):
        for s in range(kernel[1]):
            top, left = r * dilation[0], s * dilation[1]
            yield r, s, slice(top, top + stride[0] * (out[0] - 1) + 1, stride[0]), \
                slice(left, left + stride[1] * (out[1] - 1) + 1, stride[1])


def _padded(x: Any, padding, kernel, stride, dilation, out, value: float) -> Any:
    """x padded by ``padding`` on the top/left and enough on the bottom/right for every window."""
    xp = _xp(x)
    extra = [max(0, stride[a] * (out[a] - 1) + dilation[a] * (kernel[a] - 1) + 1 - x.shape[2 + a] - padding[a])
             for a in range(2)]
    return xp.pad(x, ((0, 0), (0, 0), (padding[0], extra[0]), (padding[1], extra[1])), constant_values=value)


def max_pool2d_forward(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                       ceil_mode: bool = False, return_indices: bool = False) -> tuple[Any, Any]:
    xp = _xp(x)
    kernel, stride, padding, dilation, out = _geometry(x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    padded = _padded(x, padding, kernel, stride, dilation, out, -math.inf)
    best, best_tap = None, None
    for r, s, rows, cols in _taps(kernel, stride, dilation, out):
        candidate = padded[:, :, rows, cols]
        tap = r * kernel[1] + s
        if best is None:
            best, best_tap = candidate.copy(), xp.zeros(candidate.shape, dtype=xp.int64)
        else:
            better = candidate > best
            best = xp.where(better, candidate, best)
            best_tap = xp.where(better, tap, best_tap)
    # The tap becomes PyTorch's flat index h·W + w into the input plane.
    p = xp.arange(out[0]).reshape(-1, 1)
    q = xp.arange(out[1]).reshape(1, -1)
    h = p * stride[0] - padding[0] + (best_tap // kernel[1]) * dilation[0]
    w = q * stride[1] - padding[1] + (best_tap % kernel[1]) * dilation[1]
    return best, h * x.shape[3] + w


def max_pool2d_backward(dy: Any, indices: Any, x_shape: tuple, *window: Any) -> Any:
    """A scatter-add of dy onto the chosen pixels (CuPy's scatter_add: atomics, as a framework would)."""
    xp = _xp(dy)
    N, C, H, W = x_shape
    dx = xp.zeros((N * C, H * W), dtype=dy.dtype)
    planes = xp.arange(N * C).reshape(-1, 1)
    backend.add_at(dx, (planes, indices.reshape(N * C, -1)), dy.reshape(N * C, -1))
    return dx.reshape(x_shape)


def _avg_divisor(x_shape, kernel, stride, padding, out, count_include_pad, divisor_override, dtype, xp):
    if divisor_override:
        return divisor_override
    ones = xp.ones((1, 1, x_shape[2], x_shape[3]), dtype=dtype)
    if count_include_pad:
        ones = xp.pad(ones, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2), constant_values=1)
        padding = (0, 0)
    counted = _padded(ones, padding, kernel, stride, (1, 1), out, 0)
    return sum(counted[:, :, rows, cols] for _, _, rows, cols in _taps(kernel, stride, (1, 1), out))


def avg_pool2d_forward(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                       count_include_pad: bool = True, divisor_override: Any = None) -> Any:
    kernel, stride, padding, _, out = _geometry(x.shape, kernel_size, stride, padding, 1, ceil_mode)
    padded = _padded(x, padding, kernel, stride, (1, 1), out, 0)
    total = sum(padded[:, :, rows, cols] for _, _, rows, cols in _taps(kernel, stride, (1, 1), out))
    return total / _avg_divisor(x.shape, kernel, stride, padding, out, count_include_pad, divisor_override, x.dtype,
                                _xp(x))


def avg_pool2d_backward(dy: Any, x_shape: tuple, kernel_size: Any, stride: Any = None, padding: Any = 0,
                        ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Any:
    xp = _xp(dy)
    kernel, stride, padding, _, out = _geometry(x_shape, kernel_size, stride, padding, 1, ceil_mode)
    share = dy / _avg_divisor(x_shape, kernel, stride, padding, out, count_include_pad, divisor_override, dy.dtype, xp)
    dx = _padded(xp.zeros(x_shape, dtype=dy.dtype), padding, kernel, stride, (1, 1), out, 0)
    for _, _, rows, cols in _taps(kernel, stride, (1, 1), out):
        dx[:, :, rows, cols] += share
    return dx[:, :, padding[0]:padding[0] + x_shape[2], padding[1]:padding[1] + x_shape[3]]


def _adaptive_windows(size: int, out: int):
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def _adaptive_out(x_shape: tuple, output_size: Any) -> tuple[int, int]:
    sizes = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    return tuple(x_shape[2 + a] if sizes[a] is None else sizes[a] for a in range(2))


def adaptive_avg_pool2d_forward(x: Any, output_size: Any) -> Any:
    """One mean per output cell (a loop over the P·Q cells, each a reduction)."""
    xp = _xp(x)
    out = _adaptive_out(x.shape, output_size)
    y = xp.empty(x.shape[:2] + out, dtype=x.dtype)
    for i, (h0, h1) in enumerate(_adaptive_windows(x.shape[2], out[0])):
        for j, (w0, w1) in enumerate(_adaptive_windows(x.shape[3], out[1])):
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return y


def adaptive_avg_pool2d_backward(dy: Any, x_shape: tuple) -> Any:
    xp = _xp(dy)
    dx = xp.zeros(x_shape, dtype=dy.dtype)
    for i, (h0, h1) in enumerate(_adaptive_windows(x_shape[2], dy.shape[2])):
        for j, (w0, w1) in enumerate(_adaptive_windows(x_shape[3], dy.shape[3])):
            dx[:, :, h0:h1, w0:w1] += (dy[:, :, i, j] / ((h1 - h0) * (w1 - w0)))[:, :, None, None]
    return dx


# --- local response normalisation ------------------------------------------------------------
def _channel_window_sum(values: Any, before: int, after: int) -> Any:
    """Σ over channels c − before .. c + after (zero outside), by shifted adds."""
    xp = _xp(values)
    padded = xp.pad(values, ((0, 0), (before, after)) + ((0, 0),) * (values.ndim - 2))
    channels = values.shape[1]
    return sum(padded[:, offset:offset + channels] for offset in range(before + after + 1))


def lrn_forward(x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0,
                keep_scale: bool = True) -> tuple[Any, Any]:
    scale = k + alpha / size * _channel_window_sum(x * x, size // 2, (size - 1) // 2)
    return x * scale ** -beta, scale


def lrn_backward(dy: Any, x: Any, y: Any, scale: Any, size: int, alpha: float = 1e-4, beta: float = 0.75,
                 k: float = 1.0) -> Any:
    mirrored = _channel_window_sum(dy * y / scale, (size - 1) // 2, size // 2)
    return dy * scale ** -beta - 2 * alpha * beta / size * x * mirrored


# --- batch normalisation ----------------------------------------------------------------------
def _axes(x: Any) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


def _per_channel(v: Any, x: Any) -> Any:
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def batch_norm_forward_training(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                momentum: float = 0.1, eps: float = 1e-5) -> tuple[Any, Any, Any]:
    xp = _xp(x)
    mean = x.mean(axis=_axes(x))
    var = ((x - _per_channel(mean, x)) ** 2).mean(axis=_axes(x))
    invstd = 1 / xp.sqrt(var + eps)
    if running_mean is not None:
        count = x.size // x.shape[1]
        running_mean[...] = (1 - momentum) * running_mean + momentum * mean
        running_var[...] = (1 - momentum) * running_var + momentum * var * (count / (count - 1))
    y = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        y = y * _per_channel(weight, x)
    if bias is not None:
        y = y + _per_channel(bias, x)
    return y, mean, invstd


def batch_norm_forward_inference(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                 eps: float = 1e-5) -> Any:
    y = (x - _per_channel(running_mean, x)) / _xp(x).sqrt(_per_channel(running_var, x) + eps)
    y = y if weight is None else y * _per_channel(weight, x)
    return y if bias is None else y + _per_channel(bias, x)


def batch_norm_backward_training(dy: Any, x: Any, weight: Any, mean: Any, invstd: Any) -> tuple[Any, Any, Any]:
    normalised = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    dbias = dy.sum(axis=_axes(x))
    dweight = (dy * normalised).sum(axis=_axes(x))
    count = x.size // x.shape[1]
    scale = invstd if weight is None else invstd * weight
    dx = _per_channel(scale, x) * (dy - _per_channel(dbias / count, x) - normalised * _per_channel(dweight / count, x))
    return dx, dweight, dbias


def batch_norm_backward_inference(dy: Any, x: Any, weight: Any, running_mean: Any, running_var: Any,
                                  eps: float = 1e-5) -> tuple[Any, Any, Any]:
    invstd = 1 / _xp(x).sqrt(running_var + eps)
    scale = invstd if weight is None else invstd * weight
    dweight = (dy * (x - _per_channel(running_mean, x)) * _per_channel(invstd, x)).sum(axis=_axes(x))
    return dy * _per_channel(scale, x), dweight, dy.sum(axis=_axes(x))


# --- dropout ----------------------------------------------------------------------------------
def dropout_forward(x: Any, p: float, seed: int, offset: int = 0) -> tuple[Any, Any]:
    """The same counter-based mask as the primitives (so the engines agree), applied by array ops."""
    mask = keep_mask(x.shape, p, seed, offset, _xp(x))
    return x * mask / (1 - p) if p < 1 else x * 0, mask


def dropout_backward(dy: Any, mask: Any, p: float) -> Any:
    return dy * mask / (1 - p) if p < 1 else dy * 0


# --- optimizer updates ------------------------------------------------------------------------
def sgd_update(param: Any, grad: Any, momentum_buffer: Any = None, *, lr: float, momentum: float = 0.0,
               dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False,
               first_step: bool = False) -> None:
    g = -grad if maximize else grad
    if weight_decay:
        g = g + weight_decay * param
    if momentum:
        momentum_buffer[...] = g if first_step else momentum * momentum_buffer + (1 - dampening) * g
        g = g + momentum * momentum_buffer if nesterov else momentum_buffer
    param[...] = param - lr * g


def adam_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, step: int, lr: float, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                decoupled_weight_decay: bool = False, amsgrad: bool = False, max_exp_avg_sq: Any = None,
                maximize: bool = False) -> None:
    xp = _xp(param)
    g = -grad if maximize else grad
    if weight_decay and decoupled_weight_decay:
        param[...] = param * (1 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * param
    exp_avg[...] = beta1 * exp_avg + (1 - beta1) * g
    exp_avg_sq[...] = beta2 * exp_avg_sq + (1 - beta2) * g * g
    second = exp_avg_sq
    if amsgrad:
        max_exp_avg_sq[...] = xp.maximum(max_exp_avg_sq, exp_avg_sq)
        second = max_exp_avg_sq
    denominator = xp.sqrt(second) / math.sqrt(1 - beta2 ** step) + eps
    param[...] = param - lr / (1 - beta1 ** step) * exp_avg / denominator
