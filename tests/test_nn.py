"""minidnn.nn: registration, state dicts, modes, devices, layers and their initialisation."""
import math

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import minidnn.nn as nn
from tests.helpers import numerical_gradient


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.layers = nn.Sequential(nn.ReLU(), nn.Conv2d(4, 2, 1))
        self.heads = nn.ModuleList([nn.Linear(2, 3), nn.Linear(3, 1)])
        self.scale = 2.0

    def forward(self, x):
        x = self.layers(self.bn1(self.conv1(x))).mean((2, 3))
        for head in self.heads:
            x = head(x)
        return x * self.scale


def test_registration_names_and_order():
    block = Block()
    assert [name for name, _ in block.named_parameters()] == [
        "conv1.weight", "bn1.weight", "bn1.bias", "layers.1.weight", "layers.1.bias",
        "heads.0.weight", "heads.0.bias", "heads.1.weight", "heads.1.bias"]
    assert list(block.state_dict()) == [
        "conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
        "layers.1.weight", "layers.1.bias", "heads.0.weight", "heads.0.bias", "heads.1.weight", "heads.1.bias"]
    assert [name for name, _ in block.named_modules()][:4] == ["", "conv1", "bn1", "layers"]
    assert len(list(block.children())) == 4
    assert block.bn1.num_batches_tracked.dtype == np.int64


def test_state_dict_names_match_pytorch():
    torch = pytest.importorskip("torch")

    class TorchBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(4)
            self.layers = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
            self.heads = torch.nn.ModuleList([torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)])

    theirs = TorchBlock().state_dict()
    ours = Block()
    assert list(ours.state_dict()) == list(theirs)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.items()})
    np.testing.assert_array_equal(ours.conv1.weight.numpy(), theirs["conv1.weight"].numpy())


def test_load_state_dict_reports_every_problem_at_once():
    block = Block()
    state = {k: v.numpy() for k, v in block.state_dict().items()}
    state.pop("bn1.running_var")
    state["extra.weight"] = np.zeros(3)
    state["heads.0.weight"] = np.zeros((5, 5))
    with pytest.raises(ValueError) as error:
        block.load_state_dict(state)
    message = str(error.value)
    assert "missing keys: bn1.running_var" in message
    assert "unexpected keys: extra.weight" in message
    assert "shape mismatch for heads.0.weight: checkpoint (5, 5), model (3, 2)" in message
    del state["heads.0.weight"]
    result = block.load_state_dict(state, strict=False)
    assert result.missing_keys == ["bn1.running_var", "heads.0.weight"] and result.unexpected_keys == ["extra.weight"]


def test_load_state_dict_copies_values_keeping_dtype():
    source, target = Block(), Block()
    target.load_state_dict({k: v.numpy().astype(np.float64) if v.dtype.kind == "f" else v.numpy()
                            for k, v in source.state_dict().items()})
    assert target.conv1.weight.dtype == np.float32
    np.testing.assert_array_equal(target.heads[1].bias.numpy(), source.heads[1].bias.numpy())


def test_train_eval_zero_grad_and_to():
    block = Block()
    assert block.eval() is block and not block.bn1.training and not block.layers[0].training
    block.train()
    assert block.heads[0].training
    out = block(minidnn.randn(2, 3, 5, 5))
    out.sum().backward()
    assert block.conv1.weight.grad is not None
    block.zero_grad()
    assert all(p.grad is None for p in block.parameters())
    block.double()
    assert block.conv1.weight.dtype == np.float64 and block.bn1.num_batches_tracked.dtype == np.int64


def test_setattr_rules():
    module = nn.Linear(2, 2)
    module.bias = None  # a registered parameter may be set to None
    assert "bias" not in dict(module.named_parameters())
    with pytest.raises(TypeError, match="expected a Parameter or None"):
        module.weight = minidnn.zeros(2, 2)
    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        class Broken(nn.Module):
            def __init__(self):
                self.layer = nn.Linear(1, 1)
        Broken()


def test_repr_reads_like_pytorch():
    text = repr(nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU()))
    assert "(0): Conv2d(3, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))" in text
    assert "(1): ReLU()" in text


def test_default_initialisation_bounds():
    minidnn.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3)
    bound = 1 / math.sqrt(16 * 9)
    assert np.abs(conv.weight.numpy()).max() <= bound and np.abs(conv.weight.numpy()).max() > 0.9 * bound
    assert np.abs(conv.bias.numpy()).max() <= bound
    linear = nn.Linear(100, 10)
    assert np.abs(linear.weight.numpy()).max() <= 0.1
    bn = nn.BatchNorm2d(5)
    assert bn.weight.numpy().tolist() == [1] * 5 and bn.running_var.numpy().tolist() == [1] * 5


def test_layers_equal_their_functional_forms(rng):
    x = minidnn.tensor(rng.standard_normal((2, 4, 8, 8)), dtype=minidnn.float32)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    np.testing.assert_array_equal(conv(x).numpy(), F.conv2d(x, conv.weight, conv.bias, 2, 1, 1, 2).numpy())
    pool = nn.MaxPool2d(3, 2, ceil_mode=True)
    np.testing.assert_array_equal(pool(x).numpy(), F.max_pool2d(x, 3, 2, ceil_mode=True).numpy())
    lrn = nn.LocalResponseNorm(5)
    np.testing.assert_array_equal(lrn(x).numpy(), F.local_response_norm(x, 5).numpy())
    assert nn.Flatten()(x).shape == (2, 256) and nn.Identity()(x) is x
    assert nn.AdaptiveAvgPool2d((1, 1))(x).shape == (2, 4, 1, 1)


def test_layer_parameter_gradients_by_finite_differences(rng):
    minidnn.manual_seed(0)
    f64 = minidnn.float64
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, dtype=f64), nn.BatchNorm2d(3, dtype=f64), nn.Tanh(),
                          nn.AvgPool2d(2), nn.Flatten(), nn.Linear(12, 2, dtype=f64))
    x = minidnn.tensor(rng.standard_normal((3, 2, 4, 4)))
    weights = rng.standard_normal((3, 2))
    model(x).backward(minidnn.tensor(weights))
    for name, p in model.named_parameters():
        def output_with(value, p=p):
            saved, p.data = p.data, value
            with minidnn.no_grad():
                out = model(x).numpy()
            p.data = saved
            return out

        expected = numerical_gradient(output_with, [p.data.copy()], 0, weights)
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-6, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batchnorm2d_counts_training_batches_only(rng, device):
    """A fixed momentum: the batch is counted by the normalisation's kernel (no launch of its own); eval()
    and track_running_stats=False count nothing."""
    bn = nn.BatchNorm2d(3).to(device)
    x = minidnn.tensor(rng.standard_normal((4, 3, 2, 2)).astype(np.float32)).to(device)
    for _ in range(3):
        bn(x)
    assert bn.num_batches_tracked.item() == 3
    bn.eval()
    bn(x)
    assert bn.num_batches_tracked.item() == 3
    untracked = nn.BatchNorm2d(3, track_running_stats=False).to(device)
    untracked(x)
    assert untracked.num_batches_tracked is None


def test_batchnorm2d_modes(rng):
    bn = nn.BatchNorm2d(3, momentum=None, dtype=minidnn.float64)
    first, second = rng.standard_normal((4, 3, 2, 2)), rng.standard_normal((4, 3, 2, 2)) + 3
    bn(minidnn.tensor(first))
    bn(minidnn.tensor(second))
    assert bn.num_batches_tracked.item() == 2
    expected_mean = (first.mean(axis=(0, 2, 3)) + second.mean(axis=(0, 2, 3))) / 2  # cumulative average
    np.testing.assert_allclose(bn.running_mean.numpy(), expected_mean)
    bn.eval()
    y = bn(minidnn.tensor(first)).numpy()
    expected = (first - expected_mean[:, None, None]) / np.sqrt(bn.running_var.numpy()[:, None, None] + 1e-5)
    np.testing.assert_allclose(y, expected)
    untracked = nn.BatchNorm2d(3, track_running_stats=False).eval()
    assert untracked.running_mean is None
    out = untracked(minidnn.tensor(second, dtype=minidnn.float32)).numpy()
    np.testing.assert_allclose(out.mean(axis=(0, 2, 3)), 0, atol=1e-5)  # batch statistics even in eval
    with pytest.raises(ValueError, match="4-D"):
        bn(minidnn.zeros(2, 3))


def test_dropout_module_respects_training_mode():
    drop = nn.Dropout(0.5)
    x = minidnn.ones(100)
    assert (drop(x).numpy() == 0).any()
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match="probability"):
        nn.Dropout(-0.1)


@pytest.mark.parametrize("make, match", [
    (lambda: nn.Conv2d(3, 4, 3, groups=2), "groups=2 must divide"),
    (lambda: nn.Conv2d(0, 4, 3), "in_channels must be a positive int"),
    (lambda: nn.Conv2d(3, 4, 2.5), "kernel_size must be an int or a pair"),
    (lambda: nn.Conv2d(3, 4, 3, padding_mode="reflect"), "padding_mode"),
    (lambda: nn.Linear(3, -1), "out_features"),
    (lambda: nn.CrossEntropyLoss(reduction="avg"), "reduction"),
])
def test_constructor_errors(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_linear_checks_its_input():
    with pytest.raises(ValueError, match=r"linear: x has in_features=5 .* but weight expects in_features=3"):
        nn.Linear(3, 2)(minidnn.zeros(4, 5))


def test_cross_entropy_loss_module(rng):
    logits = minidnn.tensor(rng.standard_normal((4, 5)))
    target = minidnn.tensor(np.array([1, 0, 4, 2]))
    loss = nn.CrossEntropyLoss(label_smoothing=0.1)(logits, target)
    np.testing.assert_allclose(loss.item(), F.cross_entropy(logits, target, label_smoothing=0.1).item())
