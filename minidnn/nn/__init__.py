"""Layers and containers with PyTorch's names (``torch.nn``)."""
from . import init, utils
from .layers import (GELU, AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, CrossEntropyLoss, Dropout,
                     Dropout2d, Flatten, Identity, LayerNorm, LeakyReLU, Linear, LocalResponseNorm, LogSoftmax, MaxPool2d,
                     MSELoss, NLLLoss, ReLU, Sigmoid, SiLU, Softmax, Tanh)
from .module import Module, ModuleList, Parameter, Sequential

__all__ = [
    "init", "utils", "Module", "Parameter", "Sequential", "ModuleList", "Conv2d", "Linear", "MaxPool2d", "AvgPool2d",
    "AdaptiveAvgPool2d", "ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "LocalResponseNorm", "Dropout",
    "BatchNorm2d", "Flatten", "Identity", "CrossEntropyLoss", "NLLLoss", "MSELoss", "BatchNorm1d", "LayerNorm",
    "GELU", "LeakyReLU", "SiLU", "Dropout2d",
]


def __getattr__(name: str):
    # nn.SyncBatchNorm is minidnn.distributed's, found on first use: nn does not import the layer above it.
    if name == "SyncBatchNorm":
        from ..distributed.sync_batchnorm import SyncBatchNorm  # noqa: PLC0415

        return SyncBatchNorm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
