"""Reference models: published parameter counts, torchvision's state-dict names, architecture details,
one training step each, and (where PyTorch is installed) ResNet-18, a Bottleneck ResNet and CaffeNet's
convolutional part against PyTorch in float64 (torchvision's models where it is installed, else the
same written out here).

Cost. The big models are built once each (a module-scoped, parametrized fixture: pytest runs all of
one model's tests together, then drops it) and trained for one step at the smallest input their
architecture allows: ResNets at 32x32 (CIFAR ResNets down to 16x16), AlexNets at batch 1 and full
size, since their forward and backward there cost less than building them (the 61 M parameters).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, NamedTuple

import numpy as np
import pytest

import minidnn
import minidnn.nn as nn
import models
from minidnn.optim import SGD
from models.alexnet import AlexNet, AlexNetCaffe, alexnet, alexnet_caffe, caffenet_features
from models.resnet import (BasicBlock, Bottleneck, CifarResNet, ResNet, ZeroPadShortcut, cifar_resnet, resnet18,
                           resnet20, resnet32, resnet34, resnet50, resnet56, resnet101)


class Case(NamedTuple):
    build: Callable[[], nn.Module]
    parameters: int  # the published count
    num_classes: int
    batch: int  # of the training step
    side: int  # input side of the training step
    state_entries: int  # parameters and persistent buffers in the state dict (torchvision's count)


CASES = {
    # torchvision's counts (its model docs) and the cuDNN paper / Caffe model zoo's CaffeNet.
    "alexnet": Case(alexnet, 61_100_840, 1000, 1, 224, 16),
    "alexnet_caffe": Case(alexnet_caffe, 60_965_224, 1000, 1, 227, 16),
    "resnet18": Case(resnet18, 11_689_512, 1000, 2, 32, 122),
    "resnet34": Case(resnet34, 21_797_672, 1000, 2, 32, 218),
    "resnet50": Case(resnet50, 25_557_032, 1000, 2, 32, 320),
    "resnet101": Case(resnet101, 44_549_160, 1000, 2, 32, 626),
    # He et al. 2016 Table 6 gives 0.27 M, 0.46 M and 0.85 M; these are the exact counts with option A.
    "resnet20": Case(resnet20, 269_722, 10, 2, 32, 116),
    "resnet32": Case(resnet32, 464_154, 10, 2, 16, 188),
    "resnet56": Case(resnet56, 853_018, 10, 2, 16, 332),
}

# Representative state-dict entries and shapes, written down from torchvision's models (and
# CaffeNet's prototxt), so the names are checked even where torchvision is not installed.
EXPECTED_ENTRIES = {
    "alexnet": {
        "features.0.weight": (64, 3, 11, 11), "features.0.bias": (64,), "features.3.weight": (192, 64, 5, 5),
        "features.6.weight": (384, 192, 3, 3), "features.8.weight": (256, 384, 3, 3),
        "features.10.weight": (256, 256, 3, 3), "features.10.bias": (256,), "classifier.1.weight": (4096, 9216),
        "classifier.4.weight": (4096, 4096), "classifier.6.weight": (1000, 4096), "classifier.6.bias": (1000,),
    },
    "alexnet_caffe": {
        "conv1.weight": (96, 3, 11, 11), "conv1.bias": (96,), "conv2.weight": (256, 48, 5, 5),
        "conv3.weight": (384, 256, 3, 3), "conv4.weight": (384, 192, 3, 3), "conv5.weight": (256, 192, 3, 3),
        "fc6.weight": (4096, 9216), "fc7.weight": (4096, 4096), "fc8.weight": (1000, 4096), "fc8.bias": (1000,),
    },
    "resnet18": {
        "conv1.weight": (64, 3, 7, 7), "bn1.weight": (64,), "bn1.running_mean": (64,), "bn1.num_batches_tracked": (),
        "layer1.0.conv1.weight": (64, 64, 3, 3), "layer1.1.bn2.running_var": (64,),
        "layer2.0.conv1.weight": (128, 64, 3, 3), "layer2.0.downsample.0.weight": (128, 64, 1, 1),
        "layer2.0.downsample.1.running_var": (128,), "layer4.1.conv2.weight": (512, 512, 3, 3),
        "fc.weight": (1000, 512), "fc.bias": (1000,),
    },
    "resnet34": {
        "layer1.2.conv2.weight": (64, 64, 3, 3), "layer2.3.bn2.bias": (128,), "layer3.5.conv1.weight": (256, 256, 3, 3),
        "layer3.0.downsample.0.weight": (256, 128, 1, 1), "layer4.2.bn2.num_batches_tracked": (),
        "fc.weight": (1000, 512),
    },
    "resnet50": {
        "layer1.0.conv1.weight": (64, 64, 1, 1), "layer1.0.conv2.weight": (64, 64, 3, 3),
        "layer1.0.conv3.weight": (256, 64, 1, 1), "layer1.0.bn3.weight": (256,),
        "layer1.0.downsample.0.weight": (256, 64, 1, 1), "layer1.0.downsample.1.running_mean": (256,),
        "layer2.0.conv1.weight": (128, 256, 1, 1), "layer3.5.bn3.running_var": (1024,),
        "layer4.2.conv3.weight": (2048, 512, 1, 1), "fc.weight": (1000, 2048),
    },
    "resnet101": {
        "layer3.22.conv3.weight": (1024, 256, 1, 1), "layer3.22.bn3.num_batches_tracked": (),
        "layer4.0.downsample.0.weight": (2048, 1024, 1, 1), "fc.weight": (1000, 2048),
    },
    "resnet20": {
        "conv1.weight": (16, 3, 3, 3), "bn1.weight": (16,), "layer1.0.conv1.weight": (16, 16, 3, 3),
        "layer2.0.conv1.weight": (32, 16, 3, 3), "layer2.0.conv2.weight": (32, 32, 3, 3),
        "layer3.2.bn2.running_var": (64,), "fc.weight": (10, 64), "fc.bias": (10,),
    },
    "resnet32": {"layer3.4.conv2.weight": (64, 64, 3, 3), "fc.weight": (10, 64)},
    "resnet56": {"layer3.8.conv2.weight": (64, 64, 3, 3), "fc.weight": (10, 64)},
}

# Entries that must NOT be there: blocks that keep their shape have no downsample; option A has none at all.
ABSENT_ENTRIES = {
    "resnet18": ["layer1.0.downsample.0.weight", "layer1.0.conv3.weight"],
    "resnet50": ["layer1.1.downsample.0.weight"],
    "resnet20": ["layer2.0.downsample.0.weight", "layer3.0.downsample.1.weight"],
}


@pytest.fixture(scope="module", params=list(CASES))
def built(request):
    """(name, model), built once per module run and reused by every test of that model."""
    minidnn.manual_seed(0)
    yield request.param, CASES[request.param].build()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# Every model
# ----------------------------------------------------------------------------------------------
def test_parameter_count_is_the_published_one(built):
    name, model = built
    assert count_parameters(model) == CASES[name].parameters


def _check_alexnet(model: nn.Module) -> None:
    assert isinstance(model, AlexNet) and model.input_size == 224
    assert [type(m).__name__ for m in model.features] == [
        "Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "Conv2d", "ReLU", "Conv2d",
        "ReLU", "MaxPool2d"]
    assert [type(m).__name__ for m in model.classifier] == [
        "Dropout", "Linear", "ReLU", "Dropout", "Linear", "ReLU", "Linear"]
    assert (model.features[0].stride, model.features[0].padding) == ((4, 4), (2, 2))
    assert all((m.kernel_size, m.stride) == (3, 2) for m in model.features if isinstance(m, nn.MaxPool2d))
    assert model.avgpool.output_size == (6, 6) and model.classifier[0].p == 0.5
    # The adaptive pool lets torchvision's AlexNet take inputs from 63x63 up (pool5 is then 1x1).
    model.eval()
    with minidnn.no_grad():
        assert model(minidnn.randn(1, 3, 63, 63)).shape == (1, 1000)


def _check_caffenet(model: nn.Module) -> None:
    assert isinstance(model, AlexNetCaffe) and model.input_size == 227
    assert [name for name, _ in model.named_children()] == [
        "conv1", "relu1", "pool1", "norm1", "conv2", "relu2", "pool2", "norm2", "conv3", "relu3", "conv4", "relu4",
        "conv5", "relu5", "pool5", "flatten", "fc6", "relu6", "drop6", "fc7", "relu7", "drop7", "fc8"]
    assert (model.conv1.kernel_size, model.conv1.stride, model.conv1.padding) == ((11, 11), (4, 4), (0, 0))
    assert [model.conv2.groups, model.conv3.groups, model.conv4.groups, model.conv5.groups] == [2, 1, 2, 2]
    assert all(getattr(model, f"pool{i}").ceil_mode for i in (1, 2, 5))
    assert all((n.size, n.alpha, n.beta, n.k) == (5, 1e-4, 0.75, 1.0) for n in (model.norm1, model.norm2))
    assert model.drop6.p == model.drop7.p == 0.5


def _check_resnet(model: nn.Module, block: type, stages: list[int]) -> None:
    """Block type, blocks per stage, where the shortcuts project, and v1.5's stride on the 3x3."""
    assert isinstance(model, ResNet) and model.input_size == 224
    layers = [model.layer1, model.layer2, model.layer3, model.layer4]
    assert [len(stage) for stage in layers] == stages
    assert all(isinstance(b, block) for stage in layers for b in stage)
    assert (model.conv1.kernel_size, model.conv1.stride, model.conv1.padding) == ((7, 7), (2, 2), (3, 3))
    assert (model.maxpool.kernel_size, model.maxpool.stride, model.maxpool.padding) == (3, 2, 1)
    for index, stage in enumerate(layers):
        first = stage[0]
        # BasicBlock stages 2-4 and every Bottleneck stage (64 -> 256 in layer1 too) change shape.
        assert (first.downsample is not None) == (index > 0 or block is Bottleneck)
        assert all(b.downsample is None for b in list(stage)[1:])
        stride = (2, 2) if index > 0 else (1, 1)
        if block is Bottleneck:
            assert (first.conv1.stride, first.conv2.stride, first.conv3.stride) == ((1, 1), stride, (1, 1))
        else:
            assert (first.conv1.stride, first.conv2.stride) == (stride, (1, 1))
        if first.downsample is not None:
            assert first.downsample[0].stride == stride


def _check_cifar_resnet(model: nn.Module, n: int) -> None:
    assert isinstance(model, CifarResNet) and model.input_size == 32 and model.shortcut == "A"
    layers = [model.layer1, model.layer2, model.layer3]
    assert [len(stage) for stage in layers] == [n] * 3
    assert [stage[0].conv1.out_channels for stage in layers] == [16, 32, 64]
    assert model.layer1[0].downsample is None
    for stage, (in_channels, out_channels) in zip(layers[1:], [(16, 32), (32, 64)]):
        shortcut = stage[0].downsample
        assert isinstance(shortcut, ZeroPadShortcut)
        assert (shortcut.in_channels, shortcut.out_channels, shortcut.stride) == (in_channels, out_channels, 2)
    assert model.fc.in_features == 64


ARCHITECTURE = {
    "alexnet": _check_alexnet,
    "alexnet_caffe": _check_caffenet,
    "resnet18": lambda m: _check_resnet(m, BasicBlock, [2, 2, 2, 2]),
    "resnet34": lambda m: _check_resnet(m, BasicBlock, [3, 4, 6, 3]),
    "resnet50": lambda m: _check_resnet(m, Bottleneck, [3, 4, 6, 3]),
    "resnet101": lambda m: _check_resnet(m, Bottleneck, [3, 4, 23, 3]),
    "resnet20": lambda m: _check_cifar_resnet(m, 3),
    "resnet32": lambda m: _check_cifar_resnet(m, 5),
    "resnet56": lambda m: _check_cifar_resnet(m, 9),
}


def test_architecture(built):
    name, model = built
    ARCHITECTURE[name](model)

def test_state_dict_names_are_torchvisions(built):
    name, model = built
    state = model.state_dict()
    assert len(state) == CASES[name].state_entries
    for key, shape in EXPECTED_ENTRIES[name].items():
        assert key in state, f"{name}: missing {key}"
        assert state[key].shape == shape, f"{name}: {key} has shape {state[key].shape}, expected {shape}"
    for key in ABSENT_ENTRIES.get(name, []):
        assert key not in state
    if isinstance(model, ResNet):
        assert list(state)[:6] == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                                   "bn1.num_batches_tracked"]
        assert list(state)[-2:] == ["fc.weight", "fc.bias"]

    try:
        import torchvision  # noqa: PLC0415 - optional: the full comparison runs only where it is installed
    except ImportError:
        return
    if name not in ("alexnet", "resnet18", "resnet34", "resnet50", "resnet101"):
        return
    theirs = getattr(torchvision.models, name)(weights=None).state_dict()
    assert list(state) == list(theirs)
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


def _forward(model: nn.Module, x: minidnn.Tensor) -> tuple[minidnn.Tensor, dict[str, tuple[int, ...]]]:
    """The model's output and, for a Sequential (CaffeNet), every named child's output shape."""
    if not isinstance(model, nn.Sequential):
        return model(x), {}
    shapes = {}
    for child_name, child in model.named_children():
        x = child(x)
        shapes[child_name] = x.shape
    return x, shapes


def test_one_training_step(built):
    """Forward, loss, backward and one SGD step at a tiny batch: finite loss, gradients everywhere, weights move."""
    name, model = built
    case = CASES[name]
    minidnn.manual_seed(1)
    x = minidnn.randn(case.batch, 3, case.side, case.side)
    target = minidnn.tensor(np.arange(case.batch) * 7 % case.num_classes)
    named = list(model.named_parameters())
    watched = {key: p.numpy().copy() for key, p in (named[0], named[len(named) // 2], named[-1])}

    start = time.perf_counter()
    model.train()
    model.zero_grad()
    logits, shapes = _forward(model, x)
    assert logits.shape == (case.batch, case.num_classes)
    loss = nn.CrossEntropyLoss()(logits, target)
    assert np.isfinite(loss.item())
    loss.backward()
    SGD(model.parameters(), lr=0.01).step()
    elapsed = time.perf_counter() - start

    for key, p in named:
        assert p.grad is not None, f"{name}: no gradient for {key}"
        assert np.all(np.isfinite(p.grad.numpy())) and np.any(p.grad.numpy() != 0), f"{name}: bad gradient for {key}"
    for key, before in watched.items():
        assert not np.array_equal(dict(named)[key].numpy(), before), f"{name}: {key} did not change"
    if isinstance(model, AlexNetCaffe):
        # Caffe's 227 -> 55 -> 27 -> 13 -> 6, pool before LRN (CaffeNet's order).
        assert shapes["conv1"] == (1, 96, 55, 55) and shapes["pool1"] == shapes["norm1"] == (1, 96, 27, 27)
        assert shapes["conv2"] == (1, 256, 27, 27) and shapes["pool2"] == (1, 256, 13, 13)
        assert shapes["conv5"] == (1, 256, 13, 13) and shapes["pool5"] == (1, 256, 6, 6)
    # Generous: a regression to, say, a per-pixel Python loop would take minutes, not seconds.
    assert elapsed < 30, f"{name}: one training step took {elapsed:.1f} s"


# ----------------------------------------------------------------------------------------------
# Architecture details
# ----------------------------------------------------------------------------------------------
def test_cifar_resnets_have_6n_plus_2_weighted_layers_and_the_papers_sizes():
    # He et al. 2016 Table 6: 0.27 M, 0.46 M, 0.66 M, 0.85 M, 1.7 M parameters.
    expected = {20: 269_722, 32: 464_154, 44: 658_586, 56: 853_018, 110: 1_727_962}
    for depth, parameters in expected.items():
        model = cifar_resnet(depth)
        weighted = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        assert len(weighted) == depth  # option A: no shortcut convolutions
        assert count_parameters(model) == parameters
        assert [len(stage) for stage in (model.layer1, model.layer2, model.layer3)] == [(depth - 2) // 6] * 3
    # Option B adds two 1x1 projections with batch norm: 16·32 + 2·32 + 32·64 + 2·64 = 2,752.
    assert count_parameters(resnet20(shortcut="B")) == 272_474
    for bad in (0, 19, 21, 2):
        with pytest.raises(ValueError):
            cifar_resnet(bad)
    with pytest.raises(ValueError):
        resnet20(shortcut="C")


def test_cifar_resnet_shapes_and_num_classes():
    model = resnet20(num_classes=100).eval()
    with minidnn.no_grad():
        assert model(minidnn.randn(2, 3, 32, 32)).shape == (2, 100)
        # stages on 32, 16 and 8 pixels
        x = model.relu(model.bn1(model.conv1(minidnn.randn(1, 3, 32, 32))))
        for stage, channels, side in ((model.layer1, 16, 32), (model.layer2, 32, 16), (model.layer3, 64, 8)):
            x = stage(x)
            assert x.shape == (1, channels, side, side)
    small = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=7).eval()
    with minidnn.no_grad():
        assert small(minidnn.randn(2, 3, 32, 32)).shape == (2, 7)


def test_zero_pad_shortcut_values_and_gradient():
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((2, 4, 5, 6))
    x = minidnn.tensor(x_np, requires_grad=True)
    y = ZeroPadShortcut(4, 8, stride=2)(x)
    sub = x_np[:, :, ::2, ::2]  # 5x6 -> 3x3: subsampling keeps rows/columns 0, 2, 4
    expected = np.concatenate([np.zeros((2, 2, 3, 3)), sub, np.zeros((2, 2, 3, 3))], axis=1)
    np.testing.assert_array_equal(y.numpy(), expected)
    assert y.dtype == np.float64

    weights = rng.standard_normal(expected.shape)
    (y * minidnn.tensor(weights)).sum().backward()
    grad = np.zeros_like(x_np)
    grad[:, :, ::2, ::2] = weights[:, 2:6]  # only the kept pixels, from the identity channels
    np.testing.assert_array_equal(x.grad.numpy(), grad)

    same = minidnn.tensor(x_np)
    assert ZeroPadShortcut(4, 4, stride=1)(same) is same
    odd = ZeroPadShortcut(4, 7, stride=1)(same)  # uneven padding: one channel before, two after
    np.testing.assert_array_equal(odd.numpy()[:, 1:5], x_np)
    assert not odd.numpy()[:, [0, 5, 6]].any()
    with pytest.raises(ValueError):
        ZeroPadShortcut(8, 4, stride=1)


def test_resnet_initialisation_is_torchvisions():
    minidnn.manual_seed(0)
    model = resnet20()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert np.all(module.weight.numpy() == 1) and np.all(module.bias.numpy() == 0)
    # He normal with fan_out: std √(2 / (9·64)) for layer3.0.conv1, 32 -> 64 channels (18,432 weights, so the
    # sample std is within about 0.5 %); fan_in would give √2 times that.
    weights = model.layer3[0].conv1.weight.numpy()
    assert abs(weights.std() / np.sqrt(2 / (9 * 64)) - 1) < 0.03
    assert abs(weights.mean()) < 0.003
    # Linear keeps PyTorch's default, U(±1/√in_features).
    assert np.abs(model.fc.weight.numpy()).max() <= 1 / np.sqrt(64)


def test_zero_init_residual_makes_blocks_start_as_identity():
    model = resnet20(num_classes=10)
    assert all(np.all(block.bn2.weight.numpy() == 1) for block in model.layer1)
    model = CifarResNet(3, zero_init_residual=True).eval()
    assert all(np.all(block.bn2.weight.numpy() == 0) for stage in (model.layer1, model.layer2, model.layer3)
               for block in stage)
    x = minidnn.randn(2, 16, 8, 8)
    with minidnn.no_grad():
        np.testing.assert_array_equal(model.layer1[1](x).numpy(), np.maximum(x.numpy(), 0))
    bottlenecks = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, zero_init_residual=True)
    assert all(np.all(m.bn3.weight.numpy() == 0) and np.all(m.bn2.weight.numpy() == 1)
               for m in bottlenecks.modules() if isinstance(m, Bottleneck))


# ----------------------------------------------------------------------------------------------
# Against PyTorch (optional)
# ----------------------------------------------------------------------------------------------
def _torch_resnet(torch, bottleneck: bool, layers: list[int]):
    """torchvision's ResNet, or the same written out here (its names, v1.5 Bottleneck) if torchvision is missing."""
    try:
        import torchvision  # noqa: PLC0415
    except ImportError:
        torchvision = None
    if torchvision is not None:
        resnet = torchvision.models.resnet
        return resnet.ResNet(resnet.Bottleneck if bottleneck else resnet.BasicBlock, layers)
    tnn = torch.nn

    def conv_bn(name_conv: str, name_bn: str, module: tnn.Module, inplanes: int, planes: int, kernel: int,
                stride: int) -> None:
        module.add_module(name_conv, tnn.Conv2d(inplanes, planes, kernel, stride, kernel // 2, bias=False))
        module.add_module(name_bn, tnn.BatchNorm2d(planes))

    class Block(tnn.Module):
        expansion = 4 if bottleneck else 1

        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            if bottleneck:
                conv_bn("conv1", "bn1", self, inplanes, planes, 1, 1)
                conv_bn("conv2", "bn2", self, planes, planes, 3, stride)
                conv_bn("conv3", "bn3", self, planes, planes * 4, 1, 1)
            else:
                conv_bn("conv1", "bn1", self, inplanes, planes, 3, stride)
                conv_bn("conv2", "bn2", self, planes, planes, 3, 1)
            self.relu = tnn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or inplanes != planes * self.expansion:
                self.downsample = tnn.Sequential(tnn.Conv2d(inplanes, planes * self.expansion, 1, stride, bias=False),
                                                 tnn.BatchNorm2d(planes * self.expansion))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if bottleneck:
                out = self.bn3(self.conv3(self.relu(out)))
            return self.relu(out + identity)

    class Net(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = tnn.BatchNorm2d(64)
            self.relu = tnn.ReLU(inplace=True)
            self.maxpool = tnn.MaxPool2d(3, 2, 1)
            inplanes = 64
            for index, (planes, blocks) in enumerate(zip([64, 128, 256, 512], layers), start=1):
                stage = [Block(inplanes, planes, 1 if index == 1 else 2)]
                inplanes = planes * Block.expansion
                stage += [Block(inplanes, planes, 1) for _ in range(1, blocks)]
                self.add_module(f"layer{index}", tnn.Sequential(*stage))
            self.avgpool = tnn.AdaptiveAvgPool2d((1, 1))
            self.fc = tnn.Linear(inplanes, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return Net()


@pytest.mark.parametrize("layout", ["resnet18", "bottleneck"])
def test_resnet_matches_pytorch_in_float64(layout):
    """A PyTorch ResNet's state dict loads strictly; logits (eval), loss, gradients and running stats (train) agree.

    ResNet-18 itself, and a ResNet of one Bottleneck per stage for the other block type (ResNet-50's
    blocks at a fraction of its cost).
    """
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    if layout == "resnet18":
        reference, model = _torch_resnet(torch, False, [2, 2, 2, 2]), resnet18()
    else:
        reference, model = _torch_resnet(torch, True, [1, 1, 1, 1]), ResNet(Bottleneck, [1, 1, 1, 1])
    reference.double()
    with torch.no_grad():  # non-trivial batch norm: the defaults (0, 1, 1, 0) would hide a mix-up
        for module in reference.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    model.double()
    model.load_state_dict({k: v.numpy() for k, v in reference.state_dict().items()}, strict=True)

    # 32x32 leaves layer4 1x1: a batch of 4 gives its training-mode batch norm 4 values per channel
    # (with 2 the normalised values are ±1 whatever the input, and little gradient gets through).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 32, 32))
    reference.eval()
    model.eval()
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    with minidnn.no_grad():
        actual = model(minidnn.tensor(x)).numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=1e-10)

    target = np.array([3, 997, 0, 512])
    reference.train()
    model.train()
    expected_loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(target))
    expected_loss.backward()
    loss = nn.CrossEntropyLoss()(model(minidnn.tensor(x)), minidnn.tensor(target))
    loss.backward()
    np.testing.assert_allclose(loss.item(), expected_loss.item(), rtol=1e-10)
    theirs = dict(reference.named_parameters())
    for key, p in model.named_parameters():
        grad = theirs[key].grad.numpy()
        np.testing.assert_allclose(p.grad.numpy(), grad, rtol=1e-7, atol=1e-9 * np.abs(grad).max(), err_msg=key)
    ours, their_state = model.state_dict(), reference.state_dict()
    for key, value in their_state.items():
        if key.endswith(("running_mean", "running_var", "num_batches_tracked")):
            np.testing.assert_allclose(ours[key].numpy(), value.numpy(), rtol=1e-10, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("lrn_before_pool", [False, True])
def test_caffenet_features_match_pytorch_in_float64(lrn_before_pool):
    """conv1 ... pool5 (grouped convolutions, LRN, ceil-mode pooling) against the same layers in PyTorch."""
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    minidnn.manual_seed(0)
    features = caffenet_features(lrn_before_pool).double()
    pool = dict(kernel_size=3, stride=2, ceil_mode=True)
    lrn = dict(size=5, alpha=1e-4, beta=0.75, k=1.0)

    def pool_and_norm():
        return [tnn.LocalResponseNorm(**lrn), tnn.MaxPool2d(**pool)][::1 if lrn_before_pool else -1]

    reference = tnn.Sequential(
        tnn.Conv2d(3, 96, 11, stride=4), tnn.ReLU(), *pool_and_norm(),
        tnn.Conv2d(96, 256, 5, padding=2, groups=2), tnn.ReLU(), *pool_and_norm(),
        tnn.Conv2d(256, 384, 3, padding=1), tnn.ReLU(),
        tnn.Conv2d(384, 384, 3, padding=1, groups=2), tnn.ReLU(),
        tnn.Conv2d(384, 256, 3, padding=1, groups=2), tnn.ReLU(), tnn.MaxPool2d(**pool),
    ).double()
    # Load ours into theirs by position: both are conv1 ... pool5 in the same order.
    ours = [torch.from_numpy(v.numpy()) for v in features.state_dict().values()]
    reference.load_state_dict(dict(zip(reference.state_dict(), ours, strict=True)))
    # Scaled so the LRN's window sums matter next to k = 1 (with PyTorch-initialised weights they would not).
    x = np.random.default_rng(0).standard_normal((1, 3, 227, 227)) * 30
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    with minidnn.no_grad():
        actual = features(minidnn.tensor(x)).numpy()
    assert actual.shape == (1, 256, 6, 6)
    np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())


# ------------------------------------------------------------------ the registry: models.MODELS
class _ZerosGenerator:
    """Stands in for the random generator while building: only shapes matter to these checks, and
    drawing AlexNet's 61 M initial weights takes seconds."""

    def uniform(self, low, high, size):
        return np.zeros(size)

    normal = uniform


@pytest.mark.parametrize("name", list(models.MODELS))
def test_every_model_spec_rebuilds_its_model_and_names_its_classifier(name, monkeypatch):
    spec = models.MODELS[name]
    assert isinstance(spec, models.ModelSpec) and models.spec(name) is spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.input_size = 1
    monkeypatch.setattr(minidnn.nn.init.default_generator, "numpy", _ZerosGenerator())
    model = models.create(name, num_classes=7)
    assert isinstance(model, nn.Module) and type(model).input_size == spec.input_size == models.input_size(name)
    linears = [module_name for module_name, module in model.named_modules() if isinstance(module, nn.Linear)]
    assert linears[-1] == spec.classifier  # the last Linear: the head a fine-tune replaces
    assert dict(model.named_modules())[spec.classifier].weight.shape[0] == 7
    assert {f"{spec.classifier}.weight", f"{spec.classifier}.bias"} <= set(model.state_dict())


def test_an_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'vgg99'; choose one of shapes_cnn, tiny_cnn"):
        models.create("vgg99")
    with pytest.raises(ValueError, match="unknown model"):
        models.input_size("vgg99")
