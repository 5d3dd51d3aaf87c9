"""Reference models, importable from train.py, the benchmark and the tests.

``MODELS`` maps each name to its :class:`ModelSpec` (constructor, input size, classifier layer);
``create(name, num_classes)`` builds one by name; ``input_size(name)`` is the image side a model is
designed for. ``load_pretrained(path)`` rebuilds a trained model, ready to predict, from a
checkpoint that describes itself (:mod:`models.pretrained`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import minidnn.nn as nn

from .alexnet import AlexNet, AlexNetCaffe, alexnet, alexnet_caffe
from .resnet import CifarResNet, ResNet, resnet18, resnet20, resnet32, resnet34, resnet50, resnet56, resnet101
from .small import SmallCNN, shapes_cnn, tiny_cnn


@dataclass(frozen=True)
class ModelSpec:
    """What it takes to build a reference model again.

    ``constructor(num_classes=..., **arguments)`` makes it; ``input_size`` is the image side in pixels it is
    designed for (its class attribute ``input_size``); ``classifier`` is the name of its final ``Linear``
    layer, the head that fine-tuning on another number of classes replaces (its ``weight`` and ``bias``
    are the state-dict keys ``<classifier>.weight`` and ``<classifier>.bias``).
    """

    constructor: Callable[..., nn.Module]
    input_size: int
    classifier: str


MODELS: dict[str, ModelSpec] = {
    "shapes_cnn": ModelSpec(shapes_cnn, SmallCNN.input_size, "fc"),
    "tiny_cnn": ModelSpec(tiny_cnn, SmallCNN.input_size, "fc"),
    "resnet20": ModelSpec(resnet20, CifarResNet.input_size, "fc"),
    "resnet32": ModelSpec(resnet32, CifarResNet.input_size, "fc"),
    "resnet56": ModelSpec(resnet56, CifarResNet.input_size, "fc"),
    "resnet18": ModelSpec(resnet18, ResNet.input_size, "fc"),
    "resnet34": ModelSpec(resnet34, ResNet.input_size, "fc"),
    "resnet50": ModelSpec(resnet50, ResNet.input_size, "fc"),
    "resnet101": ModelSpec(resnet101, ResNet.input_size, "fc"),
    "alexnet": ModelSpec(alexnet, AlexNet.input_size, "classifier.6"),
    "alexnet_caffe": ModelSpec(alexnet_caffe, AlexNetCaffe.input_size, "fc8"),
}


def spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of the model ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name]


def create(name: str, num_classes: int = 10, **arguments: Any) -> nn.Module:
    """The model called ``name`` with ``num_classes`` outputs (RGB input); ``arguments`` go to its
    constructor (``dropout=``, ``shortcut=``...)."""
    return spec(name).constructor(num_classes=num_classes, **arguments)


def input_size(name: str) -> int:
    """The input side in pixels the model ``name`` is designed for (32, 224 or 227)."""
    return spec(name).input_size


from .pretrained import Pretrained, describe, load_pretrained  # noqa: E402 - it looks models up in MODELS

__all__ = ["MODELS", "ModelSpec", "spec", "create", "input_size", "describe", "load_pretrained", "Pretrained",
           "SmallCNN", "shapes_cnn", "tiny_cnn", "AlexNet", "AlexNetCaffe", "alexnet", "alexnet_caffe", "ResNet",
           "CifarResNet", "resnet18", "resnet34", "resnet50", "resnet101", "resnet20", "resnet32", "resnet56"]
