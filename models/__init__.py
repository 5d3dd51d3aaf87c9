"""Reference models, importable from train.py, the benchmark and the tests.

``create(name, num_classes)`` builds one by name; ``MODELS`` lists the names; ``input_size(name)``
is the image side a model is designed for (its class attribute ``input_size``).
"""
from __future__ import annotations

from typing import Callable

import minidnn.nn as nn

from .alexnet import AlexNet, AlexNetCaffe, alexnet, alexnet_caffe
from .resnet import CifarResNet, ResNet, resnet18, resnet20, resnet32, resnet34, resnet50, resnet56, resnet101
from .small import SmallCNN, shapes_cnn, tiny_cnn

# name: (constructor taking num_classes, input side in pixels)
MODELS: dict[str, tuple[Callable[..., nn.Module], int]] = {
    "shapes_cnn": (shapes_cnn, SmallCNN.input_size),
    "tiny_cnn": (tiny_cnn, SmallCNN.input_size),
    "resnet20": (resnet20, CifarResNet.input_size),
    "resnet32": (resnet32, CifarResNet.input_size),
    "resnet56": (resnet56, CifarResNet.input_size),
    "resnet18": (resnet18, ResNet.input_size),
    "resnet34": (resnet34, ResNet.input_size),
    "resnet50": (resnet50, ResNet.input_size),
    "resnet101": (resnet101, ResNet.input_size),
    "alexnet": (alexnet, AlexNet.input_size),
    "alexnet_caffe": (alexnet_caffe, AlexNetCaffe.input_size),
}


def create(name: str, num_classes: int = 10) -> nn.Module:
    """The model called ``name`` with ``num_classes`` outputs (RGB input)."""
    return _lookup(name)[0](num_classes=num_classes)


def input_size(name: str) -> int:
    """The input side in pixels the model ``name`` is designed for (32, 224 or 227)."""
    return _lookup(name)[1]


def _lookup(name: str) -> tuple[Callable[..., nn.Module], int]:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name]


__all__ = ["MODELS", "create", "input_size", "SmallCNN", "shapes_cnn", "tiny_cnn", "AlexNet", "AlexNetCaffe", "alexnet",
           "alexnet_caffe", "ResNet", "CifarResNet", "resnet18", "resnet34", "resnet50", "resnet101", "resnet20",
           "resnet32", "resnet56"]
