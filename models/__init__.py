"""Reference models, importable from train.py, the benchmark and the tests.

``create(name, num_classes)`` builds one by name; ``MODELS`` lists the names; ``input_size(name)``
is the image side a model is designed for (its class attribute ``input_size``).
"""
from __future__ import annotations

from typing import Callable

import minidnn.nn as nn

from .small import SmallCNN, shapes_cnn, tiny_cnn

# name: (constructor taking num_classes, input side in pixels)
MODELS: dict[str, tuple[Callable[..., nn.Module], int]] = {
    "shapes_cnn": (shapes_cnn, SmallCNN.input_size),
    "tiny_cnn": (tiny_cnn, SmallCNN.input_size),
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


__all__ = ["MODELS", "create", "input_size", "SmallCNN", "shapes_cnn", "tiny_cnn"]
