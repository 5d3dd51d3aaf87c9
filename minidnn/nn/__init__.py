"""Layers and containers with PyTorch's names (``torch.nn``)."""
from . import init
from .layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, CrossEntropyLoss, Dropout, Flatten, Identity,
                     Linear, LocalResponseNorm, LogSoftmax, MaxPool2d, MSELoss, NLLLoss, ReLU, Sigmoid, Softmax, Tanh)
from .module import Module, ModuleList, Parameter, Sequential

__all__ = [
    "init", "Module", "Parameter", "Sequential", "ModuleList", "Conv2d", "Linear", "MaxPool2d", "AvgPool2d",
    "AdaptiveAvgPool2d", "ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "LocalResponseNorm", "Dropout",
    "BatchNorm2d", "Flatten", "Identity", "CrossEntropyLoss", "NLLLoss", "MSELoss",
]


def __getattr__(name: str):
    # nn.SyncBatchNorm is minidnn.distributed's, found on first use: nn does not import the layer above it.
    if name == "SyncBatchNorm":
        from ..distributed.sync_batchnorm import SyncBatchNorm  # noqa: PLC0415

        return SyncBatchNorm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
