"""Module hooks as PyTorch calls them: forward pre-hooks and forward hooks (replacing inputs and outputs, with
kwargs, prepended, removed), and full backward hooks and pre-hooks, their grad_input/grad_output against
torch's on the same modules, replacements included."""
import warnings

import numpy as np
import pytest

import minidnn
import minidnn.nn as nn

torch = pytest.importorskip("torch")


def pair_of_mlps(rng):
    """The same Linear-ReLU-Linear in minidnn and torch, float64."""
    ours = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    theirs = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def as_arrays(values):
    return [None if v is None else (v.numpy() if isinstance(v, minidnn.Tensor) else v.detach().numpy()) for v in values]


def assert_same_lists(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


class Scaled(torch.nn.Module):
    """torch twin of ``ScaledSum``: a·scale + b·b, with a non-tensor positional argument between."""

    def forward(self, a, scale, b):
        return a * scale + b * b


class ScaledSum(nn.Module):
    def forward(self, a, scale, b):
        return a * scale + b * b


# ----------------------------------------------------------------------------------------------
# Forward hooks
# ----------------------------------------------------------------------------------------------
def test_forward_pre_hooks_and_forward_hooks_replace_inputs_and_outputs_like_torch(rng):
    x = rng.standard_normal((2, 5))
    results = []
    for lib, model in zip((minidnn, torch), pair_of_mlps(rng)):
        calls = []
        first = model[0]
        first.register_forward_pre_hook(lambda m, args: calls.append("pre") or (args[0] * 2,))
        first.register_forward_pre_hook(lambda m, args: calls.append("pre, prepended"), prepend=True)
        first.register_forward_pre_hook(lambda m, args: args[0] + 1)  # a bare value: a 1-tuple, as torch does
        first.register_forward_hook(lambda m, args, out: calls.append(("hook sees", tuple(args[0].shape))))
        model[2].register_forward_hook(lambda m, args, out: out * 10)
        model[2].register_forward_hook(lambda m, args, kwargs, out: calls.append(("kwargs", kwargs)) or out - 1,
                                       with_kwargs=True)
        results.append((model(lib.tensor(x)).detach().numpy(), calls))
    (ours, our_calls), (theirs, their_calls) = results
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert our_calls == their_calls == ["pre, prepended", "pre", ("hook sees", (2, 5)), ("kwargs", {})]


def test_pre_hook_with_kwargs_and_handle_removal(rng):
    class Affine(nn.Module):
        def forward(self, x, *, shift=0.0):
            return x + shift

    module = Affine()
    handle = module.register_forward_pre_hook(lambda m, args, kwargs: (args, {"shift": kwargs["shift"] * 3}),
                                              with_kwargs=True)
    assert module(minidnn.tensor([1.0]), shift=2.0).item() == 7.0
    handle.remove()
    assert module(minidnn.tensor([1.0]), shift=2.0).item() == 3.0
    handle.remove()  # removing twice is harmless, as in torch
    seen = []
    with module.register_forward_hook(lambda m, args, out: seen.append(out.item())):
        module(minidnn.tensor([5.0]))
    module(minidnn.tensor([6.0]))
    assert seen == [5.0]
    with pytest.raises(TypeError, match="hook must be callable"):
        module.register_forward_hook("not a function")
    bad = module.register_forward_pre_hook(lambda m, args, kwargs: args, with_kwargs=True)
    with pytest.raises(TypeError, match=r"must return None or \(args, kwargs\)"):
        module(minidnn.tensor([1.0]))
    bad.remove()


# ----------------------------------------------------------------------------------------------
# Full backward hooks
# ----------------------------------------------------------------------------------------------
def record_backward(model, records):
    for index, layer in enumerate(model):
        layer.register_full_backward_hook(
            lambda m, gi, go, index=index: records.append((index, as_arrays(gi), as_arrays(go))))


def test_full_backward_hooks_see_torch_gradients_in_torch_order(rng):
    x, weights = rng.standard_normal((3, 5)), rng.standard_normal((3, 3))
    ours_model, theirs_model = pair_of_mlps(rng)
    ours_records, theirs_records = [], []
    record_backward(ours_model, ours_records)
    record_backward(theirs_model, theirs_records)
    ours_x, theirs_x = minidnn.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (ours_model(ours_x) * minidnn.tensor(weights)).sum().backward()
    (theirs_model(theirs_x) * torch.tensor(weights)).sum().backward()
    assert [r[0] for r in ours_records] == [r[0] for r in theirs_records] == [2, 1, 0]
    for (_, our_in, our_out), (_, their_in, their_out) in zip(ours_records, theirs_records):
        assert_same_lists(our_in, their_in)
        assert_same_lists(our_out, their_out)
    np.testing.assert_allclose(ours_x.grad.numpy(), theirs_x.grad.numpy(), rtol=1e-12)


def test_a_backward_hook_replaces_the_input_gradient_and_a_pre_hook_the_output_gradient(rng):
    x = rng.standard_normal((3, 5))
    grads = []
    for lib, model in zip((minidnn, torch), pair_of_mlps(rng)):
        model[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * 3,))
        model[0].register_full_backward_pre_hook(lambda m, go: (go[0] + 1,))
        leaf = lib.tensor(x, requires_grad=True)
        model(leaf).sum().backward()
        grads.append([leaf.grad.numpy()] + [p.grad.numpy() for p in model.parameters()])
    for ours, theirs in zip(*grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)


def test_several_inputs_with_a_non_tensor_between_and_a_replacement(rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    records, grads = [], []
    for lib, module in ((minidnn, ScaledSum()), (torch, Scaled())):
        calls = []
        module.register_full_backward_hook(
            lambda m, gi, go, calls=calls: calls.append((as_arrays(gi), as_arrays(go))) or (gi[0], None, gi[2] * -1))
        ta, tb = lib.tensor(a, requires_grad=True), lib.tensor(b, requires_grad=True)
        (module(ta, 2.5, tb) ** 2).sum().backward()
        records.append(calls)
        grads.append((ta.grad.numpy(), tb.grad.numpy()))
    (ours,), (theirs,) = records
    assert ours[0][1] is None and theirs[0][1] is None  # the number's entry
    assert_same_lists(ours[0], theirs[0])
    assert_same_lists(ours[1], theirs[1])
    for mine, their in zip(*grads):
        np.testing.assert_allclose(mine, their, rtol=1e-12)


def test_without_inputs_requiring_grad_the_hook_fires_on_the_output_gradient(rng):
    x = rng.standard_normal((2, 5))
    seen = []
    for model in pair_of_mlps(rng):
        calls = []
        model[0].register_full_backward_hook(lambda m, gi, go, calls=calls: calls.append((gi, as_arrays(go))))
        lib = minidnn if isinstance(model, nn.Module) else torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(lib.tensor(x)).sum().backward()
        assert any("no inputs require gradients" in str(w.message) for w in caught)
        seen.append(calls)
    (ours,), (theirs,) = seen
    assert ours[0] == theirs[0] == (None,)
    assert_same_lists(ours[1], theirs[1])
    module = pair_of_mlps(rng)[0][0]
    module.register_full_backward_hook(lambda m, gi, go: (minidnn.zeros(2, 5),))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="must return None"):
        module(minidnn.tensor(x)).sum().backward()


def test_backward_hooks_are_quiet_without_a_graph_and_check_what_they_return(rng):
    model = pair_of_mlps(rng)[0]
    calls = []
    handle = model[0].register_full_backward_hook(lambda m, gi, go: calls.append(1))
    with minidnn.no_grad():
        model(minidnn.tensor(rng.standard_normal((2, 5))))
    assert calls == []
    handle.remove()
    model(minidnn.tensor(rng.standard_normal((2, 5)), requires_grad=True)).sum().backward()
    assert calls == []
    model[2].register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(ValueError, match="returned 2 grad_input entries, expected 1"):
        model(minidnn.tensor(rng.standard_normal((2, 5)), requires_grad=True)).sum().backward()


@pytest.mark.parametrize("layer", [0, 1])  # Linear, whose output is already a view; ReLU, whose output is not
def test_in_place_on_the_output_of_a_module_with_backward_hooks_is_refused_as_in_torch(rng, layer):
    x = rng.standard_normal((2, 5))
    for lib, model in zip((minidnn, torch), pair_of_mlps(rng)):
        model[layer].register_full_backward_hook(lambda m, gi, go: None)
        hidden = model[layer](lib.tensor(x, requires_grad=True) * 1.0)
        with pytest.raises(RuntimeError):
            hidden.mul_(2)
