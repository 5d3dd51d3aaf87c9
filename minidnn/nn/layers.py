"""Layers: thin modules that hold parameters and call :mod:`minidnn.functional`.

Constructor arguments, parameter names and default initialisations are PyTorch's, so a model
written here reads like its PyTorch twin and their state dicts are interchangeable.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from .. import functional as F
from ..tensor import Tensor
from ..primitives import pair
from ..primitives.activation import check_gelu_approximation, check_negative_slope
from ..primitives.conv.problem import check_channels, conv_arguments
from ..primitives.dropout import check_probability
from ..primitives.softmax import check_label_smoothing, check_reduction
from . import init
from .module import Module, Parameter


def _empty(shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """An uninitialised float array (float32 unless ``dtype`` says otherwise) on ``device``."""
    array = np.empty(shape, dtype=np.float32 if dtype is None else np.dtype(dtype))
    if array.dtype.kind != "f":
        raise TypeError(f"dtype must be a floating-point dtype, got {array.dtype}")
    return array if device is None else backend.to_device(array, device)


def _parameter(shape: tuple[int, ...], dtype: Any, device: Any) -> Parameter:
    return Parameter(_empty(shape, dtype, device))


def _positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class Conv2d(Module):
    """2-D convolution: (N, in_channels, H, W) -> (N, out_channels, P, Q)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        _positive_int(in_channels, "in_channels")
        _positive_int(out_channels, "out_channels")
        # The primitives' own check of the hyper-parameters (a string padding is functional's to translate).
        self.stride, numeric_padding, self.dilation, self.groups = conv_arguments(
            stride, 0 if isinstance(padding, str) else padding, dilation, groups)
        check_channels(in_channels, out_channels, groups)
        if padding_mode != "zeros":
            raise ValueError(f"padding_mode must be 'zeros' (the only mode implemented), got {padding_mode!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = pair(kernel_size, "kernel_size", minimum=1)
        self.padding = padding if isinstance(padding, str) else numeric_padding
        self.weight = _parameter((out_channels, in_channels // groups, *self.kernel_size), dtype, device)
        self.bias = _parameter((out_channels,), dtype, device) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # PyTorch's default: kaiming_uniform_(a=√5), i.e. U(±1/√fan_in), for weight and bias alike.
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(init.fan_in_and_fan_out(self.weight)[0])
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


class Linear(Module):
    """y = x @ weight.T + bias: (..., in_features) -> (..., out_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "in_features")
        self.out_features = _positive_int(out_features, "out_features")
        self.weight = _parameter((out_features, in_features), dtype, device)
        self.bias = _parameter((out_features,), dtype, device) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class MaxPool2d(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x: Tensor) -> Any:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class ReLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x, self.inplace)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = check_negative_slope(negative_slope), inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class SiLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x, self.inplace)


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = check_gelu_approximation(approximate)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Softmax(Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)


class LogSoftmax(Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(x, self.dim)


class LocalResponseNorm(Module):
    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = _positive_int(size, "size"), alpha, beta, k

    def forward(self, x: Tensor) -> Tensor:
        return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        self.p, self.inplace = check_probability(p), inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Dropout2d(Module):
    """Zero whole channels of (N, C, H, W) with probability p in training (see ``F.dropout2d``)."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        self.p, self.inplace = check_probability(p), inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout2d(x, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class _BatchNorm(Module):
    """Batch normalisation per channel (axis 1); buffers running_mean, running_var, num_batches_tracked.
    Subclasses say which input ranks they take (``_ranks``, ``_layout``)."""

    _ranks: tuple[int, ...] = ()
    _layout = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.num_features = _positive_int(num_features, "num_features")
        self.eps, self.momentum, self.affine, self.track_running_stats = eps, momentum, affine, track_running_stats
        self.weight = _parameter((num_features,), dtype, device) if affine else None
        self.bias = _parameter((num_features,), dtype, device) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(_empty((num_features,), dtype, device)))
            self.register_buffer("running_var", Tensor(_empty((num_features,), dtype, device)))
            counter = np.zeros((), dtype=np.int64)
            self.register_buffer("num_batches_tracked", Tensor(counter if device is None else backend.to_device(counter, device)))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            self.num_batches_tracked.data[...] = 0

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """``relu=True``: max(BN(x), 0) in the same kernels (the fused form models use)."""
        if x.ndim not in self._ranks:
            raise ValueError(f"{type(self).__name__} expects {self._layout} input, got shape {x.shape}")
        # A fixed momentum lets the normalisation's own kernel count the batch; momentum=None needs the count
        # on the host first (_momentum).
        in_kernel = self.momentum is not None and self.training and self.track_running_stats
        momentum = self.momentum if in_kernel else self._momentum()
        # Without running statistics (track_running_stats=False) even eval() normalises with the batch's.
        use_batch_statistics = self.training or not self.track_running_stats
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_batch_statistics,
                            momentum, self.eps, relu, num_batches_tracked=self.num_batches_tracked if in_kernel else None)

    def _momentum(self) -> float:
        """This step's momentum for the running statistics, counting the batch (one launch) in training
        (``momentum=None``: the cumulative moving average, as PyTorch)."""
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.data += 1
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked.item())
        return momentum

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) per channel C (over N, or N and L)."""

    _ranks, _layout = (2, 3), "2-D (N, C) or 3-D (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) per channel; buffers running_mean, running_var, num_batches_tracked."""

    _ranks, _layout = (4,), "4-D (N, C, H, W)"


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` axes of (*, *normalized_shape), with an
    element-wise weight (ones) and bias (zeros) of normalized_shape when ``elementwise_affine`` (``bias=False``:
    the weight alone), as PyTorch's."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        for n in shape:
            _positive_int(n, "normalized_shape")
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        self.weight = _parameter(shape, dtype, device) if elementwise_affine else None
        self.bias = _parameter(shape, dtype, device) if elementwise_affine and bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return F.flatten(x, self.start_dim, self.end_dim)


class Identity(Module):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class CrossEntropyLoss(Module):
    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        check_reduction(reduction)
        check_label_smoothing(label_smoothing)
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)
