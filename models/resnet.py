"""Residual networks: torchvision's ImageNet ResNets and the CIFAR ResNets of He et al. (2016).

ImageNet (``resnet18``, ``resnet34``, ``resnet50``, ``resnet101``; 224x224 input): torchvision's
design and module names, so that a torchvision state dict (e.g. saved as .npz) loads with
``strict=True``. It is "ResNet v1.5": a Bottleneck strides on its 3x3 convolution (conv2), not on
the first 1x1 as in the paper, which costs a little speed and gains about 0.5 % top-1. Names::

    conv1, bn1, relu, maxpool, layer1 ... layer4, avgpool, fc
    layerX.Y.{conv1, bn1, conv2, bn2[, conv3, bn3], relu, downsample.0 (1x1 conv), downsample.1 (BN)}

Parameter counts (1000 classes): ResNet-18 11,689,512; ResNet-34 21,797,672; ResNet-50
25,557,032; ResNet-101 44,549,160 -- torchvision's.

CIFAR (``resnet20``, ``resnet32``, ``resnet44``, ``resnet56``, ``resnet110``; 32x32 input): He et
al., "Deep Residual Learning for Image Recognition", §4.2: a 3x3 convolution with 16 filters, three
stages of n BasicBlocks on 32x32, 16x16 and 8x8 maps with 16, 32 and 64 filters (6n + 2 weighted
layers), global average pooling and a linear classifier. The same module names as above with three
stages. The shortcut where the shape changes is option A by default, as in the paper's CIFAR
experiments: identity with stride-2 subsampling and zero-padded new channels, no parameters, which
gives the paper's parameter counts (ResNet-20 269,722 = "0.27 M"; ResNet-32 464,154; ResNet-44
658,586; ResNet-56 853,018; ResNet-110 1,727,962, all with 10 classes). Option B (1x1 projection
and batch norm, torchvision's ``downsample``) is available with ``shortcut="B"``; its two
projections add 2,752 parameters (ResNet-20: 272,474).
"""
from __future__ import annotations

from typing import Any, Sequence

import minidnn.functional as F
import minidnn.nn as nn
from minidnn.tensor import Tensor


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias (the batch norm that follows has one)."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution without bias: the bottleneck's reductions and the projection shortcut."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN pairs and a shortcut: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)  # torchvision's module list; forward uses the fused forms
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.bn1(self.conv1(x), relu=True)  # BN and ReLU in one kernel pass
        out = self.bn2(self.conv2(out))
        return F.add_relu(out, identity)  # the residual sum and its ReLU in one kernel


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided: v1.5), 1x1 expand by 4, each with BN; plus a shortcut."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        width = planes  # torchvision's planes * (base_width / 64) * groups with its defaults 64 and 1
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)  # torchvision's module list; forward uses the fused forms
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.bn1(self.conv1(x), relu=True)
        out = self.bn2(self.conv2(out), relu=True)
        out = self.bn3(self.conv3(out))
        return F.add_relu(out, identity)


def _init_weights(model: nn.Module, zero_init_residual: bool) -> None:
    """torchvision's ResNet initialisation.

    Convolutions: He normal with fan_out (std = √(2 / (k² · out_channels))), which keeps the
    gradients' variance steady through the ReLUs; batch norm: weight 1, bias 0; Linear keeps
    PyTorch's default. With ``zero_init_residual`` the last BN of every block starts at weight 0,
    so each residual branch starts as zero and each block as the identity (Goyal et al. 2017),
    which helps large-batch training.
    """
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    if zero_init_residual:
        for module in model.modules():
            if isinstance(module, Bottleneck):
                nn.init.zeros_(module.bn3.weight)
            elif isinstance(module, BasicBlock):
                nn.init.zeros_(module.bn2.weight)


class ResNet(nn.Module):
    """torchvision's ImageNet ResNet: 7x7/2 stem, 3x3/2 max pool, four stages, global pool, fc.

    ``layers`` gives the number of blocks per stage (e.g. [2, 2, 2, 2] for ResNet-18); the stages
    have 64, 128, 256 and 512 planes (times ``block.expansion`` at their output) and all but the
    first halve the resolution in their first block.
    """

    input_size = 224

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: Sequence[int], num_classes: int = 1000,
                 zero_init_residual: bool = False) -> None:
        super().__init__()
        if len(layers) != 4:
            raise ValueError(f"layers must give the number of blocks of 4 stages, got {list(layers)}")
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)  # torchvision's module list; forward uses the fused forms
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        _init_weights(self, zero_init_residual)

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int,
                    stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            # Projection shortcut (option B) wherever the shape changes; identity elsewhere.
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.bn1(self.conv1(x), relu=True))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-18: BasicBlocks [2, 2, 2, 2]; 11,689,512 parameters with 1000 classes."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, zero_init_residual)


def resnet34(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-34: BasicBlocks [3, 4, 6, 3]; 21,797,672 parameters with 1000 classes."""
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes, zero_init_residual)


def resnet50(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-50 (v1.5): Bottlenecks [3, 4, 6, 3]; 25,557,032 parameters with 1000 classes."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, zero_init_residual)


def resnet101(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-101 (v1.5): Bottlenecks [3, 4, 23, 3]; 44,549,160 parameters with 1000 classes."""
    return ResNet(Bottleneck, [3, 4, 23, 3], num_classes, zero_init_residual)


# ----------------------------------------------------------------------------------------------
# CIFAR ResNets
# ----------------------------------------------------------------------------------------------
class ZeroPadShortcut(nn.Module):
    """Option A shortcut: subsample by ``stride`` and pad with zero channels; no parameters.

    y = [0 ... 0, x[:, :, ::stride, ::stride], 0 ... 0] along the channels, the new
    ``out_channels - in_channels`` zero channels split half before, half after the identity ones
    (``planes // 4`` each side, as in Y. Idelbayev's widely used PyTorch CIFAR ResNets, whose
    checkpoints therefore load here once their keys are renamed: ``linear`` -> ``fc``, without
    DataParallel's ``module.`` prefix). The paper only says "extra zero entries padded
    for increasing dimensions"; where the zeros go changes nothing but which channels of the
    block's output carry the identity.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(f"a zero-padding shortcut cannot reduce channels ({in_channels} -> {out_channels})")
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride

    def forward(self, x: Tensor) -> Tensor:
        if self.stride != 1:
            # Subsampling keeps the top-left pixel of each 2x2 cell: the pixel the strided 3x3
            # convolution of the residual branch is centred on, so the two stay aligned.
            x = x[:, :, ::self.stride, ::self.stride]
        extra = self.out_channels - self.in_channels
        if extra == 0:
            return x
        return F.pad(x, (0, 0, 0, 0, extra // 2, extra - extra // 2))  # zero channels, half before and half after

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, stride={self.stride}"


class CifarResNet(nn.Module):
    """He et al.'s ResNet for 32x32 images: 6n + 2 layers in three stages of n BasicBlocks.

    ``shortcut="A"`` (default, the paper's CIFAR choice): parameter-free zero-padding shortcuts
    (:class:`ZeroPadShortcut`, registered as ``downsample`` so the forward reads like
    torchvision's); ``"B"``: 1x1 convolution + BN projections (``downsample.0``, ``downsample.1``).
    Initialisation as torchvision's ResNet (the paper uses He et al.'s [13] normal initialisation,
    which allows fan-in or fan-out).
    """

    input_size = 32

    def __init__(self, n: int, num_classes: int = 10, shortcut: str = "A", zero_init_residual: bool = False) -> None:
        super().__init__()
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n (blocks per stage) must be a positive int, got {n!r}")
        if shortcut not in ("A", "B"):
            raise ValueError(f"shortcut must be 'A' (zero padding) or 'B' (projection), got {shortcut!r}")
        self.shortcut = shortcut
        self.inplanes = 16
        self.conv1 = conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)  # torchvision's module list; forward uses the fused forms
        self.layer1 = self._make_layer(16, n)
        self.layer2 = self._make_layer(32, n, stride=2)
        self.layer3 = self._make_layer(64, n, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)
        _init_weights(self, zero_init_residual)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample: nn.Module | None = None
        if stride != 1 or self.inplanes != planes:
            if self.shortcut == "A":
                downsample = ZeroPadShortcut(self.inplanes, planes, stride)
            else:
                downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.bn1(self.conv1(x), relu=True)
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.avgpool(x).flatten(1))

    def extra_repr(self) -> str:
        return f"shortcut={self.shortcut!r}"


def cifar_resnet(depth: int, num_classes: int = 10, shortcut: str = "A", **kwargs: Any) -> CifarResNet:
    """The CIFAR ResNet with ``depth`` = 6n + 2 weighted layers (20, 32, 44, 56, 110, ...)."""
    if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise ValueError(f"depth must be 6n + 2 for a positive int n (20, 32, 44, 56, 110, ...), got {depth!r}")
    return CifarResNet((depth - 2) // 6, num_classes, shortcut, **kwargs)


def resnet20(num_classes: int = 10, shortcut: str = "A") -> CifarResNet:
    """CIFAR ResNet-20 (n = 3): 269,722 parameters with option A and 10 classes."""
    return cifar_resnet(20, num_classes, shortcut)


def resnet32(num_classes: int = 10, shortcut: str = "A") -> CifarResNet:
    """CIFAR ResNet-32 (n = 5): 464,154 parameters with option A and 10 classes."""
    return cifar_resnet(32, num_classes, shortcut)


def resnet44(num_classes: int = 10, shortcut: str = "A") -> CifarResNet:
    """CIFAR ResNet-44 (n = 7): 658,586 parameters with option A and 10 classes."""
    return cifar_resnet(44, num_classes, shortcut)


def resnet56(num_classes: int = 10, shortcut: str = "A") -> CifarResNet:
    """CIFAR ResNet-56 (n = 9): 853,018 parameters with option A and 10 classes."""
    return cifar_resnet(56, num_classes, shortcut)


def resnet110(num_classes: int = 10, shortcut: str = "A") -> CifarResNet:
    """CIFAR ResNet-110 (n = 18): 1,727,962 parameters with option A and 10 classes."""
    return cifar_resnet(110, num_classes, shortcut)


__all__ = [
    "BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet34", "resnet50", "resnet101",
    "ZeroPadShortcut", "CifarResNet", "cifar_resnet", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110",
]
