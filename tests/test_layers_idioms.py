"""The layers of newer networks (LayerNorm, GELU, LeakyReLU, SiLU, BatchNorm1d, Dropout2d, Identity) and their
functional forms against PyTorch: outputs, gradients of inputs and parameters, state dicts, in-place forms, errors."""
import warnings

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import minidnn.nn as nn
from tests.helpers import gradcheck

torch = pytest.importorskip("torch")


def twin(ours, theirs):
    """Give ``ours`` the parameters and buffers of the torch module ``theirs`` (float64 both)."""
    theirs.double()
    ours.double().load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def run_both(ours, theirs, x, rng):
    """Forward and a weighted backward through both modules; returns (our input, torch input)."""
    mine, their = minidnn.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, ty = ours(mine), theirs(their)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = rng.standard_normal(y.shape)
    (y * minidnn.tensor(weights)).sum().backward()
    (ty * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(mine.grad.numpy(), their.grad.numpy(), rtol=1e-10, atol=1e-12)
    for (name, p), (their_name, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == their_name
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    return mine, their


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, normalized, options", [
    ((3, 7), 7, {}), ((2, 3, 4, 5), (4, 5), {"eps": 1e-3}), ((2, 5, 3), [3], {"elementwise_affine": False}),
    ((4, 2, 6), (6,), {"bias": False}),
])
def test_layer_norm_module_matches_torch(rng, shape, normalized, options):
    ours, theirs = twin(nn.LayerNorm(normalized, **options), torch.nn.LayerNorm(normalized, **options))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():  # non-trivial affine parameters
        for p in theirs.parameters():
            p.copy_(torch.tensor(rng.standard_normal(tuple(p.shape))))
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    run_both(ours, theirs, rng.standard_normal(shape) * 2 + 0.5, rng)


def test_layer_norm_defaults_functional_form_and_errors(rng):
    layer = nn.LayerNorm((2, 3))
    np.testing.assert_array_equal(layer.weight.numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(layer.bias.numpy(), np.zeros((2, 3)))
    assert repr(layer) == "LayerNorm((2, 3), eps=1e-05, elementwise_affine=True)"
    gradcheck(lambda x, w, b: F.layer_norm(x, (3,), w, b, eps=1e-2), rng.standard_normal((2, 4, 3)),
              rng.standard_normal(3), rng.standard_normal(3))
    with pytest.raises(RuntimeError):
        torch.nn.functional.layer_norm(torch.zeros(2, 3), (4,))
    with pytest.raises(ValueError, match=r"expected x of shape \[\*, 4\]"):
        F.layer_norm(minidnn.zeros(2, 3), (4,))
    with pytest.raises(ValueError, match="normalized_shape must be a positive int"):
        nn.LayerNorm(0)


# ----------------------------------------------------------------------------------------------
# Activations
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda lib: lib.GELU(), lambda lib: lib.GELU(approximate="tanh"), lambda lib: lib.LeakyReLU(),
    lambda lib: lib.LeakyReLU(0.3), lambda lib: lib.LeakyReLU(-0.5), lambda lib: lib.SiLU(), lambda lib: lib.Identity(),
])
def test_activation_modules_match_torch(rng, make):
    x = rng.standard_normal((2, 3, 5)) * 3
    x[0, 0, :2] = 0.0  # the kinks and ties at exactly 0
    ours, theirs = make(nn), make(torch.nn)
    run_both(ours, theirs, x, rng)


@pytest.mark.parametrize("name, options", [("leaky_relu", {"negative_slope": 0.2}), ("silu", {})])
def test_in_place_activations_write_over_their_input_with_torch_gradients(rng, name, options):
    x = rng.standard_normal((3, 4)) * 2
    ours_leaf, their_leaf = minidnn.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ours_hidden, their_hidden = ours_leaf * 1.5, their_leaf * 1.5
    ours = getattr(F, name)(ours_hidden, inplace=True, **options)
    theirs = getattr(torch.nn.functional, name)(their_hidden, inplace=True, **options)
    assert ours is ours_hidden  # written over the product, recorded in the graph
    np.testing.assert_allclose(ours_hidden.numpy(), their_hidden.detach().numpy(), rtol=1e-13)
    (ours * ours).sum().backward()
    (theirs * theirs).sum().backward()
    np.testing.assert_allclose(ours_leaf.grad.numpy(), their_leaf.grad.numpy(), rtol=1e-12)
    plain = minidnn.tensor(x)  # no graph: in place always
    assert getattr(F, name)(plain, inplace=True, **options) is plain
    np.testing.assert_allclose(plain.numpy(), getattr(torch.nn.functional, name)(torch.tensor(x), **options).numpy(),
                               rtol=1e-13)


@pytest.mark.parametrize("name", ["leaky_relu", "silu"])
def test_in_place_activation_over_values_a_node_saved_refuses_the_backward_as_torch_does(rng, name):
    x = rng.standard_normal((2, 3))
    for lib, functional in ((minidnn, F), (torch, torch.nn.functional)):
        leaf = lib.tensor(x, requires_grad=True)
        hidden = leaf * 2
        squared = hidden * hidden  # saves hidden for its backward
        getattr(functional, name)(hidden, inplace=True)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            squared.sum().backward()


def test_activation_arguments_are_checked():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        nn.GELU("erf")
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        F.gelu(minidnn.zeros(2), approximate="erf")
    with pytest.raises(TypeError, match="negative_slope must be a real number"):
        nn.LeakyReLU("0.1")
    hidden = minidnn.zeros(3, requires_grad=True) * 2
    with pytest.raises(ValueError, match="inplace=True with a negative negative_slope"):
        F.leaky_relu(hidden, -0.1, inplace=True)
    # PyTorch refuses the same, at backward
    their = torch.zeros(3, requires_grad=True) * 2
    with pytest.raises(RuntimeError):
        torch.nn.functional.leaky_relu(their, -0.1, inplace=True).sum().backward()
    assert nn.Identity(54, unused="argument")(hidden) is hidden


# ----------------------------------------------------------------------------------------------
# BatchNorm1d
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 4), (5, 4, 3)])
@pytest.mark.parametrize("options", [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False}])
def test_batch_norm_1d_matches_torch_in_training_and_evaluation(rng, shape, options):
    ours, theirs = twin(nn.BatchNorm1d(4, **options), torch.nn.BatchNorm1d(4, **options))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for _ in range(2):
        run_both(ours, theirs, rng.standard_normal(shape) * 3 + 1, rng)
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key].numpy(), value.numpy(), rtol=1e-12, err_msg=key)
    ours.eval()
    theirs.eval()
    ours.zero_grad()
    theirs.zero_grad()
    run_both(ours, theirs, rng.standard_normal(shape), rng)


def test_batch_norm_1d_refuses_other_ranks_and_one_value_per_channel():
    layer, their = nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    for shape in ((2, 3, 4, 5), (3,)):
        with pytest.raises(ValueError):
            their(torch.zeros(shape))
        with pytest.raises(ValueError, match=r"BatchNorm1d expects 2-D \(N, C\) or 3-D \(N, C, L\) input"):
            layer(minidnn.zeros(shape))
    with pytest.raises(ValueError):
        their(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(minidnn.zeros(1, 3))


# ----------------------------------------------------------------------------------------------
# Dropout2d
# ----------------------------------------------------------------------------------------------
def test_dropout2d_zeroes_whole_channels_and_scales_the_rest(rng):
    x = rng.standard_normal((16, 8, 3, 5)) + 5.0  # no zeros of its own
    minidnn.manual_seed(3)
    layer = nn.Dropout2d(0.25)
    tensor = minidnn.tensor(x, requires_grad=True)
    y = layer(tensor)
    ratio = y.numpy() / x
    per_plane = ratio.reshape(16, 8, -1)
    np.testing.assert_allclose(per_plane.max(axis=2), per_plane.min(axis=2), rtol=1e-14)  # one per (sample, channel)
    factors = set(np.round(per_plane[:, :, 0].ravel(), 12))
    assert factors == {0.0, round(1 / 0.75, 12)}
    dropped = np.mean(per_plane[:, :, 0] == 0)
    assert 0.1 < dropped < 0.4
    y.sum().backward()
    np.testing.assert_allclose(tensor.grad.numpy(), ratio, rtol=1e-12)  # the gradient is the mask
    minidnn.manual_seed(3)
    np.testing.assert_array_equal(nn.Dropout2d(0.25)(minidnn.tensor(x)).numpy(), y.numpy())  # reproducible
    layer.eval()
    assert layer(tensor) is tensor
    # torch's scaling and structure are the same (its masks come from another generator)
    their = torch.nn.functional.dropout2d(torch.tensor(x), 0.25).numpy() / x
    assert set(np.round(their.reshape(16, 8, -1)[:, :, 0].ravel(), 12)) <= {0.0, round(1 / 0.75, 12)}


def test_dropout2d_in_place_three_d_warning_and_errors(rng):
    x = minidnn.tensor(rng.standard_normal((4, 6, 2, 2)) + 5.0)
    before = x.numpy().copy()
    assert F.dropout2d(x, 0.5, inplace=True) is x
    assert np.any(x.numpy() != before)
    with pytest.warns(UserWarning, match="3-D input"):
        y = F.dropout2d(minidnn.tensor(rng.standard_normal((4, 6, 5)) + 5.0), 0.5)
    per_channel = y.numpy().reshape(4, 6, 5)
    assert np.all((per_channel == 0).all(axis=2) | (per_channel != 0).all(axis=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError):
            torch.nn.functional.dropout2d(torch.zeros(2, 2), 1.5)
    with pytest.raises(ValueError, match="probability p must be in"):
        nn.Dropout2d(1.5)
    with pytest.raises(ValueError, match=r"input must be \(N, C, H, W\)"):
        F.dropout2d(minidnn.zeros(4), 0.5)


@pytest.mark.gpu
def test_gpu_layers_match_the_cpu(rng):
    """The new layers on CUDA tensors (the primitives' kernels) against the same layers on the CPU, float32."""
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    outputs = []
    for device in ("cpu", "cuda"):
        minidnn.manual_seed(0)
        model = nn.Sequential(nn.LayerNorm(5), nn.GELU(), nn.Linear(5, 5), nn.SiLU(), nn.LeakyReLU(0.1),
                              nn.BatchNorm1d(6), nn.GELU("tanh")).to(device)
        tensor = minidnn.tensor(x, device=device, requires_grad=True)
        model(tensor).sum().backward()
        outputs.append([tensor.grad.numpy()] + [p.grad.numpy() for p in model.parameters()])
    for cpu, gpu in zip(*outputs):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-5)
