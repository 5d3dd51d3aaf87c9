"""PyTorch twins of the benchmark's models, holding the same weights as the minidnn model.

torchvision's AlexNet and ResNets use the very module names minidnn's do, so their state dicts
load key for key. CaffeNet is one flat Sequential of standard layers, mirrored layer by layer;
the CIFAR ResNets and the small CNNs get a small twin class with the same names. PyTorch is only the reference
here: nothing in minidnn imports it.
"""
from __future__ import annotations

from typing import Any

import minidnn.nn as nn


def _torch():
    import torch  # noqa: PLC0415 - optional

    return torch


def _layer(module: nn.Module) -> Any:
    """The torch layer equal to one standard minidnn layer."""
    t = _torch().nn
    if isinstance(module, nn.Conv2d):
        return t.Conv2d(module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding,
                        module.dilation, module.groups, bias=module.bias is not None)
    if isinstance(module, nn.Linear):
        return t.Linear(module.in_features, module.out_features, bias=module.bias is not None)
    if isinstance(module, nn.BatchNorm2d):
        return t.BatchNorm2d(module.num_features, module.eps, module.momentum)
    if isinstance(module, nn.MaxPool2d):
        return t.MaxPool2d(module.kernel_size, module.stride, module.padding, module.dilation, ceil_mode=module.ceil_mode)
    if isinstance(module, nn.LocalResponseNorm):
        return t.LocalResponseNorm(module.size, module.alpha, module.beta, module.k)
    if isinstance(module, nn.Dropout):
        return t.Dropout(module.p)
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return t.AdaptiveAvgPool2d(module.output_size)
    simple = {nn.ReLU: t.ReLU, nn.Flatten: t.Flatten, nn.Identity: t.Identity}
    for ours, theirs in simple.items():
        if isinstance(module, ours):
            return theirs()
    raise TypeError(f"no torch twin for layer {type(module).__name__}")


def _sequential_twin(model: nn.Sequential) -> Any:
    from collections import OrderedDict  # noqa: PLC0415

    return _torch().nn.Sequential(OrderedDict((name, _layer(child)) for name, child in model.named_children()))


def _cifar_resnet_twin(model: nn.Module) -> Any:
    """He et al.'s CIFAR ResNet with option-A shortcuts (zero-padded channels), minidnn's names."""
    torch = _torch()
    t, F = torch.nn, torch.nn.functional

    class Shortcut(t.Module):
        def __init__(self, extra: int) -> None:
            super().__init__()
            self.before, self.after = extra // 2, extra - extra // 2

        def forward(self, x):
            return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.before, self.after))

    class Block(t.Module):
        def __init__(self, ours: nn.Module) -> None:
            super().__init__()
            self.conv1, self.bn1 = _layer(ours.conv1), _layer(ours.bn1)
            self.conv2, self.bn2 = _layer(ours.conv2), _layer(ours.bn2)
            down = ours.downsample
            self.downsample = None if down is None else Shortcut(down.out_channels - down.in_channels)

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Twin(t.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = _layer(model.conv1), _layer(model.bn1)
            for stage in ("layer1", "layer2", "layer3"):
                setattr(self, stage, t.Sequential(*(Block(block) for block in getattr(model, stage))))
            self.fc = _layer(model.fc)

        def forward(self, x):
            x = F.relu(self.bn1(self.conv1(x)))
            x = self.layer3(self.layer2(self.layer1(x)))
            return self.fc(x.mean((2, 3)))

    return Twin()


def _small_cnn_twin(model: nn.Module) -> Any:
    """models/small.py's SmallCNN (shapes_cnn, tiny_cnn): its features mirrored layer by layer, then global
    average pooling and the linear classifier, minidnn's names."""
    t = _torch().nn

    class Twin(t.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = _sequential_twin(model.features)
            self.pool, self.fc = _layer(model.pool), _layer(model.fc)

        def forward(self, x):
            return self.fc(self.pool(self.features(x)).flatten(1))

    return Twin()


def torch_twin(name: str, model: nn.Module) -> Any:
    """A torch model computing what ``model`` (built by ``models.create(name)``) computes, same weights."""
    torch = _torch()
    if name in ("alexnet", "resnet18", "resnet34", "resnet50", "resnet101"):
        import torchvision  # noqa: PLC0415 - optional

        num_classes = (model.fc if name.startswith("resnet") else model.classifier[6]).out_features
        twin = getattr(torchvision.models, name)(num_classes=num_classes)
    elif name == "alexnet_caffe":
        twin = _sequential_twin(model)
    elif name in ("resnet20", "resnet32", "resnet56"):
        twin = _cifar_resnet_twin(model)
    elif name in ("shapes_cnn", "tiny_cnn"):
        twin = _small_cnn_twin(model)
    else:
        twin = _sequential_twin(model) if isinstance(model, nn.Sequential) else None
        if twin is None:
            raise ValueError(f"no torch twin for model {name!r}")
    state = {key: torch.from_numpy(value.numpy().copy()) for key, value in model.state_dict().items()}
    twin.load_state_dict(state, strict=True)
    return twin
