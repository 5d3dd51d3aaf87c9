"""SyncBatchNorm: batch normalisation with the statistics of the global batch, summed across the ranks.

Plain batch norm under DistributedDataParallel normalises each rank's shard with that shard's mean and variance;
with small per-GPU batches those are noisy. SyncBatchNorm all-reduces each channel's [Σx, Σx², count] (one
collective of 2C + 1 float64 values per layer), normalises with the global mean and biased variance, and in
backward all-reduces [Σdy, Σdy·x̂] (2C values) for the two terms of the gradient that pass through the statistics.
The result is what one process computes on the global batch. Sums of squares rather than a second pass over the
centred values: one collective instead of two per layer; accumulated in float64, the cancellation in Σx²/M − mean²
costs a relative ~1e-16·mean²/var, nothing unless a channel's mean is ~1e4 standard deviations from 0.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from .. import functional as F
from ..autograd import Function
from ..engine import library
from ..nn.layers import BatchNorm2d
from ..nn.module import Module
from ..tensor import Tensor
from .process_group import ProcessGroup, ReduceOp, default_group, is_initialized

__all__ = ["SyncBatchNorm", "SyncBatchNormFunction", "convert_sync_batchnorm"]


def _per_channel(values: Any, ndim: int) -> Any:
    return values.reshape((1, -1) + (1,) * (ndim - 2))


class SyncBatchNormFunction(Function):
    """Training-mode batch norm over every rank's batch. Forward: (x (N, C, *), weight (C,) or None, bias (C,) or
    None, running_mean, running_var ((C,) arrays, updated in place, or None), momentum, eps, relu, group) -> y."""

    def forward(self, x, weight, bias, running_mean, running_var, momentum, eps, relu, group):
        xp = backend.get_array_module(x)
        channels = x.shape[1]
        axes = (0,) + tuple(range(2, x.ndim))
        with backend.on_device(backend.device_of(x)):
            stats = xp.empty(2 * channels + 1, dtype=np.float64)
            stats[:channels] = x.sum(axis=axes, dtype=np.float64)
            stats[channels:2 * channels] = (x * x).sum(axis=axes, dtype=np.float64)
            stats[2 * channels] = x.size // max(channels, 1)
        group.all_reduce(stats, ReduceOp.SUM).wait()
        count = stats[2 * channels]
        mean = stats[:channels] / count
        var = xp.maximum(stats[channels:2 * channels] / count - mean * mean, 0.0)  # biased: normalisation uses it
        if running_mean is not None:
            # In place (the module's buffers); the running variance is unbiased, as in batch norm.
            running_mean[...] = ((1.0 - momentum) * running_mean + momentum * mean).astype(x.dtype)
            running_var[...] = ((1.0 - momentum) * running_var + momentum * var * (count / (count - 1))).astype(x.dtype)
        mean, var = mean.astype(x.dtype), var.astype(x.dtype)
        # With the statistics fixed, the normalisation is inference's formula, relu and all.
        y = library.batch_norm_forward_inference(x, weight, bias, mean, var, eps, relu=relu)
        self.save_for_backward(x, weight, mean, var, y if relu else None)
        self.eps, self.group, self.count = eps, group, count
        return y

    def backward(self, dy):
        x, weight, mean, var, relu_output = self.saved
        xp = backend.get_array_module(x)
        channels = x.shape[1]
        # dx = scale·(dy − Σdy/M − x̂·Σ(dy·x̂)/M), the sums over every rank: inference's backward gives scale·dy
        # and this rank's sums (dbias = Σdy, dweight = Σdy·x̂), with dy masked by the ReLU when fused.
        dx, dweight, dbias = library.batch_norm_backward_inference(dy, x, weight, mean, var, self.eps,
                                                                   relu_output=relu_output)
        sums = xp.concatenate([dbias.astype(np.float64), dweight.astype(np.float64)])
        self.group.all_reduce(sums, ReduceOp.SUM).wait()
        invstd = 1.0 / xp.sqrt(var.astype(np.float64) + self.eps)
        scale = invstd if weight is None else invstd * weight.astype(np.float64)
        through_mean = _per_channel((scale * sums[:channels] / self.count).astype(x.dtype), x.ndim)
        through_var = _per_channel((scale * invstd * sums[channels:] / self.count).astype(x.dtype), x.ndim)
        dx = dx - through_mean - (x - _per_channel(mean, x.ndim)) * through_var
        return dx, dweight, dbias  # the parameters' gradients are this rank's: DDP averages them


class SyncBatchNorm(BatchNorm2d):
    """``SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
    process_group=None)``: batch norm over (N, C, *) whose training statistics are the global batch's.

    Outside training, or without an initialized process group of more than one rank, it is batch norm.
    ``process_group``: the group whose batch is normalised together (the default group when None).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: ProcessGroup | None = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_group = process_group

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        if x.ndim < 2:
            raise ValueError(f"SyncBatchNorm expects input of at least 2 dimensions (N, C, ...), got shape {x.shape}")
        group = self.process_group or (default_group() if is_initialized() else None)
        if not self.training or group is None or group.size == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training or not self.track_running_stats, self._momentum(), self.eps, relu)
        momentum = self._momentum()
        return SyncBatchNormFunction.apply(x, self.weight, self.bias,
                                           None if self.running_mean is None else self.running_mean.data,
                                           None if self.running_var is None else self.running_var.data,
                                           momentum, self.eps, relu, group)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group: ProcessGroup | None = None) -> Module:
        """``module`` with every BatchNorm2d replaced by a SyncBatchNorm holding the same parameters and buffers
        (the same tensors), the children's order kept; a BatchNorm2d itself is returned converted."""
        if isinstance(module, BatchNorm2d) and not isinstance(module, SyncBatchNorm):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                            process_group)
            for name in ("weight", "bias"):
                if module._parameters.get(name) is not None:
                    converted._parameters[name] = module._parameters[name]
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                converted._buffers[name] = module._buffers.get(name)
            object.__setattr__(converted, "training", module.training)
            return converted
        for name, child in list(module._modules.items()):
            if child is not None:
                module._modules[name] = cls.convert_sync_batchnorm(child, process_group)  # in place: order kept
        return module


def convert_sync_batchnorm(module: Module, process_group: ProcessGroup | None = None) -> Module:
    """:meth:`SyncBatchNorm.convert_sync_batchnorm` as a function."""
    return SyncBatchNorm.convert_sync_batchnorm(module, process_group)
