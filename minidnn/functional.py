"""Neural-network operations with PyTorch's names, signatures and semantics (``torch.nn.functional``).

Each operation is a graph node (a :class:`~minidnn.autograd.Function` named ``...Function``) whose
forward and backward call the current engine's primitives through ``library`` (:mod:`minidnn.engine`:
minidnn's own, or the naive baseline), looked up at each call; nothing here computes on arrays
itself beyond glue (reshapes for the losses). Argument checking belongs to the primitives, which
check once and name the argument; this module only translates PyTorch's options (string paddings,
``dim``, ``inplace``). Use as ``import minidnn.functional as F``.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from . import random as _random
from .autocast_mode import lower_precision
from .autograd import Function, is_grad_enabled, is_half
from .creation import ones
from .engine import library  # the current engine's primitives (minidnn's own, or the naive baseline)
from .ops import PadFunction, takes_float32_gradient
from .primitives import pair
from .primitives.activation import check_negative_slope
from .primitives.dropout import check_probability
from .tensor import Tensor

__all__ = [
    "conv2d", "linear", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "relu", "sigmoid", "tanh",
    "softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss", "dropout", "batch_norm", "add_relu",
    "local_response_norm", "flatten", "leaky_relu", "silu", "gelu", "layer_norm", "dropout2d", "pad",
]


def _require_tensor(value: Any, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a minidnn Tensor, got {type(value).__name__}")
    return value


def _data(value: Tensor | None) -> Any:
    return None if value is None else value.data


# ----------------------------------------------------------------------------------------------
# Convolution and linear layers
# ----------------------------------------------------------------------------------------------
class Conv2dFunction(Function):
    half_inputs = True

    def forward(self, x, w, b, stride, padding, dilation, groups):
        self.args = (stride, padding, dilation, groups)
        self.save_for_backward(x if self.needs_input_grad[1] else None, w if self.needs_input_grad[0] else None)
        self.x_shape, self.w_shape = x.shape, w.shape
        y = library.conv2d_forward(x, w, *self.args)
        return y if b is None else library.bias_add(y, b, axis=1, out=y)  # in place: no copy of the output

    def backward(self, dy):
        x, w = self.saved
        dx = library.conv2d_backward_data(dy, w, self.x_shape, *self.args) if self.needs_input_grad[0] else None
        dw = None
        if self.needs_input_grad[1]:  # float32 when the weight is a bfloat16 cast of a float32 tensor (autocast's)
            dw = library.conv2d_backward_filter(x, dy, self.w_shape, *self.args, dtype=np.float32 if
                                                takes_float32_gradient(self.parents[1]) else None)
        db = library.bias_backward(dy, axis=1) if self.needs_input_grad[2] else None
        return dx, dw, db


def _conv_padding(padding: Any, weight: Tensor, stride: Any, dilation: Any) -> Any:
    """PyTorch's string paddings: 'valid' is 0; 'same' keeps the size (stride 1, odd dilated kernel)."""
    if not isinstance(padding, str):
        return padding
    if padding == "valid":
        return 0
    if padding == "same":
        if stride not in (1, (1, 1)):
            raise ValueError("padding='same' is not supported for strided convolutions")
        dh, dw = pair(dilation, "dilation", minimum=1)
        spans = (dh * (weight.shape[2] - 1), dw * (weight.shape[3] - 1))
        if spans[0] % 2 or spans[1] % 2:
            raise ValueError("padding='same' needs an odd (dilated) kernel size here: pad explicitly instead")
        return (spans[0] // 2, spans[1] // 2)
    raise ValueError(f"padding must be an int, a pair of ints, 'valid' or 'same', got {padding!r}")


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation. input (N, C, H, W), weight (K, C/groups, R, S), bias (K,) -> (N, K, P, Q)."""
    _require_tensor(input, "input")
    _require_tensor(weight, "weight")
    padding = _conv_padding(padding, weight, stride, dilation)
    input, weight, bias = lower_precision(input, weight, bias)
    # The hyper-parameters as keywords: apply then looks at the three tensors alone (a step makes this call often).
    return Conv2dFunction.apply(input, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)


class LinearFunction(Function):
    half_inputs = True

    def forward(self, x, w, b):
        self.save_for_backward(x if self.needs_input_grad[1] else None, w if self.needs_input_grad[0] else None)
        return library.linear_forward(x, w, b)

    def backward(self, dy):
        x, w = self.saved
        dx = library.linear_backward_data(dy, w) if self.needs_input_grad[0] else None
        dw = library.linear_backward_weight(x, dy) if self.needs_input_grad[1] else None
        db = library.bias_backward(dy, axis=-1) if self.needs_input_grad[2] else None
        return dx, dw, db


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = input @ weight.T + bias. input (..., in_features), weight (out_features, in_features)."""
    _require_tensor(input, "input")
    input, weight, bias = lower_precision(input, weight, bias)
    return LinearFunction.apply(input, weight, bias)


# ----------------------------------------------------------------------------------------------
# Pooling
# ----------------------------------------------------------------------------------------------
class MaxPool2dFunction(Function):
    half_inputs = True  # half x gives half y: float math, and a maximum is one of its window's values
    sums_gradient_parts = True  # ResNet's stem pooling feeds the first block twice: its convolution and shortcut

    def forward(self, x, kernel_size, stride, padding, dilation, ceil_mode, indices_out=None):
        # Without return_indices the engine keeps its own compact record of the maxima for backward.
        y, self.indices = library.max_pool2d_forward(x, kernel_size, stride, padding, dilation, ceil_mode,
                                                     return_indices=indices_out is not None)
        self.x_shape, self.window = x.shape, (kernel_size, stride, padding, dilation, ceil_mode)
        if indices_out is not None:  # return_indices: hand the argmax to the caller as well
            indices_out.append(self.indices)
        return y

    def backward(self, dy, dy_other=None):
        # The window lets the GPU gather (each input pixel visits only the windows covering it), float parts at once.
        return library.max_pool2d_backward(dy, self.indices, self.x_shape, *self.window, dy_other=dy_other)


def max_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """Max pooling over (H, W). With ``return_indices`` also the flat h·W + w index of each maximum."""
    _require_tensor(input, "input")
    indices: list = []
    y = MaxPool2dFunction.apply(input, kernel_size, stride, padding, dilation, ceil_mode,
                                indices if return_indices else None)
    return (y, Tensor(indices[0])) if return_indices else y


class AvgPool2dFunction(Function):
    half_inputs = True  # half x gives half y: float sums, one rounding

    def forward(self, x, *args):
        self.x_shape, self.args = x.shape, args
        return library.avg_pool2d_forward(x, *args)

    def backward(self, dy):
        return library.avg_pool2d_backward(dy, self.x_shape, *self.args)


def avg_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    _require_tensor(input, "input")
    return AvgPool2dFunction.apply(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


class AdaptiveAvgPool2dFunction(Function):
    half_inputs = True

    def forward(self, x, output_size):
        self.x_shape = x.shape
        return library.adaptive_avg_pool2d_forward(x, output_size)

    def backward(self, dy):
        return library.adaptive_avg_pool2d_backward(dy, self.x_shape)


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    _require_tensor(input, "input")
    return AdaptiveAvgPool2dFunction.apply(input, output_size)


# ----------------------------------------------------------------------------------------------
# Activations and softmax
# ----------------------------------------------------------------------------------------------
def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(input, 0). With ``inplace`` the result is written over ``input`` and ``input`` is returned,
    as in PyTorch, where autograd allows it (see ``Tensor.relu_``); otherwise a new tensor."""
    _require_tensor(input, "input")
    return input.relu_() if inplace else input.relu()


def sigmoid(input: Tensor) -> Tensor:
    return _require_tensor(input, "input").sigmoid()


def tanh(input: Tensor) -> Tensor:
    return _require_tensor(input, "input").tanh()


def softmax(input: Tensor, dim: int) -> Tensor:
    return _require_tensor(input, "input").softmax(dim)


def log_softmax(input: Tensor, dim: int) -> Tensor:
    return _require_tensor(input, "input").log_softmax(dim)


class LeakyReLUFunction(Function):
    """x where x > 0, else negative_slope·x. The backward reads x; written in place (``out``), it reads
    the output instead, which has x's signs when negative_slope >= 0 (the in-place form needs that;
    a later write to the output is caught by its version counter)."""

    def forward(self, x, negative_slope, out=None):
        self.negative_slope = negative_slope
        y = library.leaky_relu_forward(x, negative_slope, out=out)
        self.save_for_backward(x if out is None else y)
        return y

    def backward(self, dy):
        return library.leaky_relu_backward(dy, self.saved[0], self.negative_slope), None


class SiLUFunction(Function):
    """x·σ(x). The backward reads x: written in place, a copy of x is kept first (only when a
    gradient will be asked for)."""

    def forward(self, x, out=None):
        saved = None
        if self.needs_input_grad[0]:
            saved = x if out is None else x.copy()  # in place, x is about to be overwritten
        self.save_for_backward(saved)
        return library.silu_forward(x, out=out)

    def backward(self, dy):
        return library.silu_backward(dy, self.saved[0])


class GELUFunction(Function):
    def forward(self, x, approximate):
        self.approximate = approximate
        self.save_for_backward(x)
        return library.gelu_forward(x, approximate)

    def backward(self, dy):
        return library.gelu_backward(dy, self.saved[0], self.approximate), None


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """input where input > 0, else negative_slope·input. ``inplace`` writes over input and returns it (as
    ``Tensor.relu_``); with a gradient to compute, that needs negative_slope >= 0, as in PyTorch."""
    _require_tensor(input, "input")
    negative_slope = check_negative_slope(negative_slope)
    if not inplace:
        return LeakyReLUFunction.apply(input, negative_slope)
    if negative_slope < 0 and input.requires_grad and is_grad_enabled():
        raise ValueError("leaky_relu: inplace=True with a negative negative_slope cannot be differentiated "
                         "(the output no longer tells the input's sign); use inplace=False")
    return LeakyReLUFunction.apply_in_place("leaky_relu_", input, negative_slope)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """input·sigmoid(input) (SiLU, swish). ``inplace`` writes over input and returns it (its old values
    kept for the backward when a gradient is recorded)."""
    _require_tensor(input, "input")
    return SiLUFunction.apply_in_place("silu_", input) if inplace else SiLUFunction.apply(input)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """input·Φ(input), Φ the standard normal CDF; ``approximate="tanh"``: PyTorch's tanh approximation."""
    _require_tensor(input, "input")
    return GELUFunction.apply(input, approximate)


# ----------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------
def _rows(input: Tensor, target: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """(N, C) or (N, C, d1, ...) scores with (N,) or (N, d1, ...) targets -> (M, C) rows and (M,) targets."""
    _require_tensor(input, "input")
    _require_tensor(target, "target")
    if input.ndim < 2:
        raise ValueError(f"{name}: input must be (N, C) or (N, C, d1, ...), got shape {input.shape}")
    if target.shape != (input.shape[0],) + input.shape[2:]:
        raise ValueError(f"{name}: target shape {target.shape} does not match input {input.shape} "
                         f"(expected {(input.shape[0],) + input.shape[2:]})")
    if input.ndim == 2:
        return input, target
    rows = input.permute(0, *range(2, input.ndim), 1).reshape(-1, input.shape[1])
    return rows, target.reshape(-1)


def _unrows(loss: Tensor, input: Tensor, reduction: str) -> Tensor:
    return loss.reshape((input.shape[0],) + input.shape[2:]) if reduction == "none" and input.ndim > 2 else loss


class CrossEntropyFunction(Function):
    def forward(self, logits, target, weight, ignore_index, label_smoothing, reduction):
        self.args = (weight, ignore_index, label_smoothing, reduction)
        loss, log_probs = library.cross_entropy_forward(logits, target, *self.args)
        self.save_for_backward(log_probs, target)
        return loss

    def backward(self, grad_loss):
        log_probs, target = self.saved
        return library.cross_entropy_backward(grad_loss, log_probs, target, *self.args), None


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy over class indices, fused (one primitive forward, one backward)."""
    rows, targets = _rows(input, target, "cross_entropy")
    loss = CrossEntropyFunction.apply(rows, targets.data, _data(weight), ignore_index, float(label_smoothing), reduction)
    return _unrows(loss, input, reduction)


class NLLLossFunction(Function):
    def forward(self, log_probs, target, weight, ignore_index, reduction):
        self.args = (weight, ignore_index, reduction)
        self.shape = log_probs.shape
        self.save_for_backward(target)
        return library.nll_loss_forward(log_probs, target, *self.args)

    def backward(self, grad_loss):
        (target,) = self.saved
        return library.nll_loss_backward(grad_loss, target, self.shape, *self.args), None


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    rows, targets = _rows(input, target, "nll_loss")
    loss = NLLLossFunction.apply(rows, targets.data, _data(weight), ignore_index, reduction)
    return _unrows(loss, input, reduction)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    _require_tensor(input, "input")
    if isinstance(target, Tensor) and target.shape != input.shape:
        raise ValueError(f"mse_loss: target shape {target.shape} differs from input shape {input.shape}")
    squared = (input - target) ** 2
    if reduction == "mean":
        return squared.mean()
    if reduction == "sum":
        return squared.sum()
    if reduction == "none":
        return squared
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


# ----------------------------------------------------------------------------------------------
# Regularisation and normalisation
# ----------------------------------------------------------------------------------------------
class DropoutFunction(Function):
    half_inputs = True  # half x gives half y: the float product, one rounding

    def forward(self, x, p, seed, offset):
        y, mask = library.dropout_forward(x, p, seed, offset)
        self.p = p
        self.save_for_backward(mask)
        return y

    def backward(self, dy):
        return library.dropout_backward(dy, self.saved[0], self.p)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training.

    The mask comes from the global generator's counter stream (see :mod:`minidnn.random`).
    """
    _require_tensor(input, "input")
    p = check_probability(p)  # here too: in evaluation the primitive is not called
    if not training or p == 0.0:
        return input
    generator = _random.default_generator
    return DropoutFunction.apply(input, float(p), generator.seed, generator.next_offset(input.numel()))


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels: each (sample, channel) plane of input (N, C, *spatial) is dropped with
    probability p, and the kept ones scaled by 1/(1-p); identity when not training. As in PyTorch, a
    3-D input is read as (N, C, L), with PyTorch's warning. ``inplace`` multiplies input itself
    (``Tensor.mul_``) and returns it."""
    _require_tensor(input, "input")
    p = check_probability(p)
    if input.ndim < 2:
        raise ValueError(f"dropout2d: input must be (N, C, H, W) (or (N, C, L)), got shape {input.shape}")
    if input.ndim == 3:
        warnings.warn("dropout2d: received a 3-D input; as PyTorch does, it is read as (N, C, L), each (sample, "
                      "channel) row dropped whole, not as one unbatched (C, H, W) image", UserWarning, stacklevel=2)
    elif input.ndim != 4:
        warnings.warn(f"dropout2d: received a {input.ndim}-D input; dropout2d is meant for 3-D or 4-D inputs",
                      UserWarning, stacklevel=2)
    if not training or p == 0.0:
        return input
    planes = ones(input.shape[:2] + (1,) * (input.ndim - 2), dtype=input.dtype, device=input.device)
    scale = dropout(planes, p, training=True)  # 0 or 1/(1-p) per (sample, channel), from the counter stream
    return input.mul_(scale) if inplace else input * scale


class BatchNormTrainingFunction(Function):
    half_inputs = True  # half x, float32 weight and statistics: batch norm under autocast, as PyTorch's

    def forward(self, x, weight, bias, running_mean, running_var, momentum, eps, relu=False, num_batches_tracked=None):
        y, mean, invstd = library.batch_norm_forward_training(x, weight, bias, running_mean, running_var, momentum, eps,
                                                              relu=relu, num_batches_tracked=num_batches_tracked)
        # With the fused ReLU the backward masks dy by [y > 0], which it recomputes from x and the bias (the
        # primitives' relu=True): y is never read again, one pass over it fewer each way.
        self.save_for_backward(x, weight, mean, invstd, bias if relu else None)
        self.relu = relu
        return y

    def backward(self, dy):
        x, weight, mean, invstd, bias = self.saved
        dx, dweight, dbias = library.batch_norm_backward_training(dy, x, weight, mean, invstd, bias=bias,
                                                                  relu=self.relu)
        return dx, dweight, dbias


class BatchNormInferenceFunction(Function):
    half_inputs = True

    def forward(self, x, weight, bias, running_mean, running_var, eps, relu=False):
        y = library.batch_norm_forward_inference(x, weight, bias, running_mean, running_var, eps, relu=relu)
        self.save_for_backward(x, weight, running_mean.copy(), running_var.copy(), y if relu else None)
        self.eps = eps
        return y

    def backward(self, dy):
        x, weight, running_mean, running_var, relu_output = self.saved
        return library.batch_norm_backward_inference(dy, x, weight, running_mean, running_var, self.eps,
                                                     relu_output=relu_output)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
               relu: bool = False, num_batches_tracked: Tensor | None = None) -> Tensor:
    """Batch normalisation over every axis but 1. In training, normalises with the batch statistics
    and updates the running ones in place; otherwise uses the running statistics. ``relu``: max(·, 0)
    in the same kernels, forward and backward (cuDNN and PyTorch's fused BN + ReLU).
    ``num_batches_tracked`` (minidnn's addition; an int64 tensor of one element): in training, 1 is added
    to it in place by the statistics' own kernel, so nn.BatchNorm's count needs no launch of its own."""
    _require_tensor(input, "input")
    if training:
        # Everything but the three tensors as keywords, which apply passes through untouched (see conv2d).
        return BatchNormTrainingFunction.apply(input, weight, bias, running_mean=_data(running_mean),
                                               running_var=_data(running_var), momentum=momentum, eps=eps, relu=relu,
                                               num_batches_tracked=_data(num_batches_tracked))
    if running_mean is None or running_var is None:
        raise ValueError("batch_norm: running_mean and running_var are required when training=False")
    return BatchNormInferenceFunction.apply(input, weight, bias, running_mean.data, running_var.data, eps, relu)


class LayerNormFunction(Function):
    def forward(self, x, weight, bias, normalized_shape, eps):
        y, mean, invstd = library.layer_norm_forward(x, normalized_shape, weight, bias, eps)
        self.normalized_shape = normalized_shape
        self.save_for_backward(x, weight, mean, invstd)
        return y

    def backward(self, dy):
        x, weight, mean, invstd = self.saved
        dx, dweight, dbias = library.layer_norm_backward(dy, x, self.normalized_shape, weight, mean, invstd)
        return dx, (dweight if weight is not None else None), (dbias if self.needs_input_grad[2] else None), None, None


def layer_norm(input: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise each sample over its trailing ``normalized_shape`` axes (PyTorch's layer_norm):
    input (*, *normalized_shape); weight, bias: normalized_shape, or None."""
    _require_tensor(input, "input")
    return LayerNormFunction.apply(input, weight, bias, normalized_shape, eps)


class AddReLUFunction(Function):
    half_inputs = True
    sums_gradient_parts = True  # a residual block's output feeds the next block twice: its conv and its shortcut

    def forward(self, a, b):
        y = library.add_relu_forward(a, b)
        self.save_for_backward(y)
        return y

    def backward(self, dy, dy_other=None):
        dx = library.relu_backward(dy, self.saved[0], dy_other)
        return dx, dx  # the sum's gradient is the identity for each input


def add_relu(input: Tensor, other: Tensor) -> Tensor:
    """max(input + other, 0) in one kernel: a residual block's sum and ReLU (PyTorch's quantized
    ``FloatFunctional.add_relu``). Same shapes and dtypes; a half-precision tensor beside a float32 one is
    widened to float32 first (autocast's promotion)."""
    _require_tensor(input, "input")
    _require_tensor(other, "other")
    if input.dtype != other.dtype and (is_half(input.data) or is_half(other.data)):
        input, other = input.float(), other.float()
    return AddReLUFunction.apply(input, other)


class LocalResponseNormFunction(Function):
    def forward(self, x, size, alpha, beta, k):
        self.args = (size, alpha, beta, k)
        y, scale = library.lrn_forward(x, size, alpha, beta, k)  # scale None: the engine recomputes it
        self.save_for_backward(x, y, scale)
        return y

    def backward(self, dy):
        x, y, scale = self.saved
        return library.lrn_backward(dy, x, y, scale, *self.args)


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """Cross-channel LRN as in PyTorch and Caffe: x / (k + alpha/size · Σ_window x²)^beta."""
    _require_tensor(input, "input")
    return LocalResponseNormFunction.apply(input, size, alpha, beta, k)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return _require_tensor(input, "input").flatten(start_dim, end_dim)


def pad(input: Tensor, pad: Any, mode: str = "constant", value: float | None = None) -> Tensor:
    """``input`` padded with ``value`` (0 by default): ``pad`` = (left, right, top, bottom, front, back, ...), a
    (before, after) pair per axis from the last one back, as in PyTorch; a negative width crops. Only PyTorch's
    ``"constant"`` mode is implemented."""
    _require_tensor(input, "input")
    if mode != "constant":
        raise ValueError(f"mode must be 'constant' (the only padding minidnn implements), got {mode!r}")
    if not isinstance(pad, (tuple, list)) or len(pad) % 2 or len(pad) // 2 > input.ndim or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in pad):
        raise ValueError(f"pad must be a tuple of ints, a (before, after) pair for each of at most {input.ndim} "
                         f"axes, last axis first, got {pad!r}")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))):
        raise TypeError(f"value must be a number, got {value!r}")
    return PadFunction.apply(input, tuple(int(n) for n in pad), 0 if value is None else value)
