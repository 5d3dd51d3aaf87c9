"""Small CNNs for 32x32 inputs such as the built-in shapes10 data, CIFAR-10 and MNIST (padded).

``shapes_cnn`` is the default of ``python train.py``: three 3x3 conv blocks with batch norm, ReLU
and max pooling, global average pooling, one linear classifier (about 100 k parameters). It is
sized so that a 2-core CPU trains it on shapes10 in a couple of minutes.
"""
from __future__ import annotations

import minidnn.nn as nn


def _block(in_channels: int, out_channels: int, pool: bool) -> list[nn.Module]:
    layers = [nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU()]
    return layers + [nn.MaxPool2d(2)] if pool else layers


class SmallCNN(nn.Module):
    """conv-bn-relu-pool x2, conv-bn-relu, global average pool, linear."""

    input_size = 32

    def __init__(self, num_classes: int = 10, in_channels: int = 3, widths: tuple[int, int, int] = (32, 64, 128)) -> None:
        super().__init__()
        a, b, c = widths
        self.features = nn.Sequential(*_block(in_channels, a, True), *_block(a, b, True), *_block(b, c, False))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.features(x)).flatten(1))


def shapes_cnn(num_classes: int = 10) -> SmallCNN:
    return SmallCNN(num_classes, 3, (16, 32, 64))


def tiny_cnn(num_classes: int = 10) -> SmallCNN:
    """A narrower variant for quick experiments and tests."""
    return SmallCNN(num_classes, 3, (8, 16, 32))
