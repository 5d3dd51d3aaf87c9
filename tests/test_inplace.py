"""In-place safety as PyTorch has it: version counters on every tensor, checked by the backward of every node
that saved an array, so an in-place write can never make a gradient silently wrong."""
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import minidnn.nn as nn

torch = pytest.importorskip("torch")


def both(array, requires_grad=True):
    """The same float64 values as a minidnn tensor and a torch tensor."""
    return (minidnn.tensor(array.copy(), requires_grad=requires_grad),
            torch.tensor(array.copy(), requires_grad=requires_grad))


def test_the_issues_example_raises_as_pytorch_does():
    a = minidnn.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = a * 2
    c = (b * b).sum()
    b.mul_(10)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation \(mul_\).*MulFunction.*version 1; "
                                           r"expected version 0"):
        c.backward()
    ta = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    tb = ta * 2
    tc = (tb * tb).sum()
    tb.mul_(10)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tc.backward()


def test_a_leaf_changed_under_no_grad_after_the_forward_raises(rng):
    w = minidnn.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    x = minidnn.tensor(rng.standard_normal((5, 4)))
    loss = (x @ w).sum()
    with minidnn.no_grad():
        w.mul_(2)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation \(mul_\).*its input 1"):
        loss.backward()


def test_an_optimizer_step_between_forward_and_backward_raises(rng):
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 5, 4))
    optimizer = minidnn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = minidnn.tensor(rng.standard_normal((2, 2, 5, 5)).astype(np.float32))
    y = minidnn.tensor([1, 3])
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    loss = F.cross_entropy(model(x), y)
    optimizer.step()  # the weights the forward saved are updated in place before its backward
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation \(SGD.step\)"):
        loss.backward()


@pytest.mark.parametrize("method, argument", [("add_", "tensor"), ("add_", 1.5), ("sub_", "tensor"), ("sub_", 0.5),
                                              ("mul_", "tensor"), ("mul_", 3.0), ("div_", "tensor"), ("div_", 4.0)])
def test_arithmetic_in_place_on_a_graph_tensor_is_recorded_with_pytorchs_gradients(rng, method, argument):
    a_values, other_values = rng.standard_normal((3, 4)), rng.uniform(0.5, 2.0, (1, 4))  # broadcast along dim 0
    weights = rng.standard_normal((3, 4))
    grads = []
    for library in ("minidnn", "torch"):
        make = minidnn.tensor if library == "minidnn" else torch.tensor
        a = make(a_values.copy(), requires_grad=True)
        other = make(other_values.copy(), requires_grad=True) if argument == "tensor" else argument
        b = a * 2.0  # a graph tensor, not a leaf
        result = getattr(b, method)(other)
        assert result is b
        (b * make(weights)).sum().backward()
        grads.append((a.grad.numpy(), other.grad.numpy() if argument == "tensor" else None, b.detach().numpy()))
    for got, want in zip(*grads):
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_mul_in_place_keeps_the_old_values_its_backward_needs(rng):
    """b.mul_(c) with c requiring grad: dc needs b's values before the write, which the node keeps itself."""
    b_values, c_values = rng.standard_normal(5), rng.standard_normal(5)
    a, ta = both(b_values)
    c, tc = both(c_values)
    (a * 1.0).mul_(c).sum().backward()
    (ta * 1.0).mul_(tc).sum().backward()
    np.testing.assert_allclose(c.grad.numpy(), tc.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("write", [
    lambda t: t.add_(1.0), lambda t: t.sub_(1.0), lambda t: t.mul_(2.0), lambda t: t.div_(2.0), lambda t: t.relu_(),
    lambda t: t.zero_(), lambda t: t.fill_(3.0), lambda t: t.copy_(np.ones(4)), lambda t: t.__setitem__(0, 5.0),
])
def test_every_in_place_write_bumps_the_version(write):
    plain = minidnn.tensor(np.arange(4.0))
    view = plain.reshape(2, 2)
    detached = plain.detach()
    before = plain._version.value  # made when the view and the detached tensor shared it
    write(plain)
    assert plain._version.value == before + 1
    assert view._version is plain._version and detached._version is plain._version  # one counter for all


def test_writes_that_would_cut_a_graph_tensor_from_its_history_are_refused(rng):
    x = minidnn.tensor(rng.standard_normal(4), requires_grad=True)
    h = x * 2.0
    for write, name in [(lambda: h.zero_(), "zero_"), (lambda: h.fill_(1.0), "fill_"),
                        (lambda: h.copy_(np.ones(4)), "copy_"), (lambda: h.__setitem__(0, 1.0), "item assignment")]:
        with pytest.raises(RuntimeError, match=f"{name} on a tensor that is part of a graph"):
            write()
    plain = minidnn.tensor(np.zeros(4))
    with pytest.raises(RuntimeError, match="copy_ on a tensor that is part of a graph"):
        plain.copy_(x)  # the source's gradient would be lost


def test_a_write_to_a_saved_view_is_caught_through_its_base(rng):
    x = minidnn.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    base = minidnn.tensor(rng.standard_normal((2, 3)))
    view = base.reshape(3, 2)
    loss = (x.reshape(3, 2) * view).sum()  # the product saved view's array
    base.add_(1.0)  # written through the base
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation \(add_\)"):
        loss.backward()


def test_in_place_where_nothing_saved_the_old_values_trains_like_out_of_place(rng):
    """Conv -> ReLU(inplace=True) -> Linear: the convolution saves its input, not its output, so the
    in-place ReLU is safe and gives the out-of-place gradients bit for bit."""
    x = rng.standard_normal((2, 3, 6, 6))
    grads = []
    for inplace in (True, False):
        minidnn.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=inplace), nn.Flatten(), nn.Linear(64, 5))
        model.to(np.float64)
        F.cross_entropy(model(minidnn.tensor(x)), minidnn.tensor([0, 4])).backward()
        grads.append([p.grad.numpy() for p in model.parameters()])
    for got, want in zip(*grads):
        np.testing.assert_array_equal(got, want)


def test_retain_graph_backward_twice_still_checks_versions(rng):
    a = minidnn.tensor(rng.standard_normal(3), requires_grad=True)
    b = a * 1.0
    loss = (b * b).sum()
    loss.backward(retain_graph=True)
    b.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_inference_mode_records_no_graph_and_decorates(rng):
    w = minidnn.tensor(rng.standard_normal(3), requires_grad=True)
    with minidnn.inference_mode():
        assert not (w * 2).requires_grad

    @minidnn.inference_mode()
    def predict(t):
        return t * 2

    assert not predict(w).requires_grad
    with minidnn.inference_mode(False):
        assert (w * 2).requires_grad
