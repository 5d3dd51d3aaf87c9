"""Tensor creation, the graph engine and the tensor operations (ops.py)."""
import gc
import weakref

import numpy as np
import pytest

import minidnn
from minidnn import backend
from tests.helpers import gradcheck


# --- creation ---------------------------------------------------------------------------------
def test_tensor_dtype_rules_follow_pytorch():
    assert minidnn.tensor(1.5).dtype == np.float32
    assert minidnn.tensor([1.0, 2.0]).dtype == np.float32
    assert minidnn.tensor([1, 2]).dtype == np.int64
    assert minidnn.tensor([True]).dtype == np.bool_
    assert minidnn.tensor(np.zeros(3, np.float64)).dtype == np.float64  # arrays keep their dtype
    assert minidnn.tensor(np.zeros(3, np.int64)).dtype == np.int64
    assert minidnn.tensor([1, 2], dtype=minidnn.float64).dtype == np.float64
    assert minidnn.tensor([1.0], dtype="float16").dtype == np.float16


def test_tensor_copies_its_data():
    source = np.ones(3)
    t = minidnn.tensor(source)
    source[0] = 5
    assert t.numpy()[0] == 1


def test_tensor_rejects_bad_input():
    with pytest.raises(TypeError, match="dtype"):
        minidnn.tensor([1.0], dtype="complex64")
    with pytest.raises(TypeError, match="numbers"):
        minidnn.tensor(["a"])
    with pytest.raises(TypeError, match="floating-point"):
        minidnn.tensor([1, 2], requires_grad=True)
    with pytest.raises(ValueError, match="device"):
        minidnn.tensor([1.0], device="tpu")


def test_factories():
    minidnn.manual_seed(3)
    a = minidnn.randn(2, 3)
    minidnn.manual_seed(3)
    b = minidnn.randn((2, 3))
    assert a.shape == (2, 3) and a.dtype == np.float32
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert minidnn.zeros(2, dtype=minidnn.float64).dtype == np.float64
    assert minidnn.arange(5).dtype == np.int64 and minidnn.arange(0.0, 1.0, 0.25).shape == (4,)
    assert minidnn.full((2, 2), 7.0).numpy().sum() == 28
    assert minidnn.ones_like(a).shape == (2, 3)


def test_properties_and_conversions():
    t = minidnn.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.shape == (2, 2) and t.ndim == 2 and t.numel() == 4 and len(t) == 2 and t.size(1) == 2
    assert t.device == minidnn.device("cpu") and str(t.device) == "cpu"
    assert t[1, 0].item() == 3.0 and float(t.sum()) == 10.0
    assert t.double().dtype == np.float64 and t.long().dtype == np.int64
    assert "tensor(" in repr(t)
    with pytest.raises(ValueError, match="one-element"):
        t.item()


# --- engine -----------------------------------------------------------------------------------
def test_gradients_accumulate_over_fan_out_and_calls():
    x = minidnn.tensor([2.0, 3.0], requires_grad=True)
    y = x * x + x  # x is used three times
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy() + 1)
    (x * 3).sum().backward()  # a second backward adds, as in PyTorch
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy() + 4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_relu_outputs_used_twice_sum_their_gradient_parts_in_relu_backward(rng, monkeypatch, device):
    """A ReLU's and an add_relu's output that feed two operations each: relu_backward gets the two parts (dy_other)
    instead of the engine's sum; of an output used three times it gets two parts too, the first two summed by the
    engine, and one that retains its gradient gets the engine's sum. The gradients, retained one included, are
    PyTorch's."""
    torch = pytest.importorskip("torch")
    if device == "cuda":
        pytest.importorskip("cupy")
    import minidnn.functional as F  # noqa: PLC0415
    from minidnn import primitives  # noqa: PLC0415

    calls = []
    original = primitives.relu_backward
    monkeypatch.setattr(primitives, "relu_backward", lambda dy, y, dy_other=None: (
        calls.append(dy_other is not None), original(dy, y, dy_other))[1])
    data = [rng.standard_normal((2, 3, 4, 5)) for _ in range(4)]

    def run(module, relu, add_relu, tensor):
        x, a, b, c = (tensor(v) for v in data)
        h = relu(x)  # used twice: h * a and add_relu's second input
        r = add_relu(h * a, h)  # used twice: r * b and relu(r)
        t = relu(x * c)  # used three times
        u = relu(b)  # used twice, retains its gradient
        u.retain_grad()
        loss = (r * b).sum() + (relu(r) * c).sum() + (t * a + t * b + t).sum() + (u * x + u).sum()
        loss.backward()
        return [x.grad, a.grad, b.grad, c.grad, u.grad]

    ours = run(minidnn, F.relu, F.add_relu, lambda v: minidnn.tensor(v, device=device, requires_grad=True))
    theirs = run(torch, torch.relu, lambda p, q: torch.relu(p + q), lambda v: torch.tensor(v, requires_grad=True))
    for name, got, want in zip("x a b c u".split(), ours, theirs):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    # relu(r) (one use) and u (retained) get one gradient; r, h and t (three uses) two parts.
    assert sorted(calls) == [False, False, True, True, True]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pooled_outputs_used_twice_sum_their_gradient_parts_in_the_pooling_backward(rng, monkeypatch, device,
                                                                                       channels_last):
    """A max pooling's output that feeds two operations (ResNet's stem pooling: the first block's convolution and
    its shortcut) hands max_pool2d_backward both parts (dy_other); one used once, or retaining its gradient, gets
    one. The gradients are PyTorch's, channels-last too."""
    torch = pytest.importorskip("torch")
    if device == "cuda":
        pytest.importorskip("cupy")
    import minidnn.functional as F  # noqa: PLC0415
    from minidnn import primitives  # noqa: PLC0415

    calls = []
    original = primitives.max_pool2d_backward
    monkeypatch.setattr(primitives, "max_pool2d_backward", lambda *args, dy_other=None: (
        calls.append(dy_other is not None), original(*args, dy_other=dy_other))[1])
    data = [rng.standard_normal((2, 3, 9, 7)), rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 5, 4))]

    def run(pool, tensor, laid_out):
        x, a, b = (tensor(v) for v in data)
        p = pool(laid_out(x), 3, 2, 1)  # used twice
        q = pool(laid_out(x * 2), 3, 2, 1)  # used once
        r = pool(laid_out(x * 3), 3, 2, 1)  # used twice, retains its gradient
        r.retain_grad()
        loss = (p * a).sum() + (p * b * b).sum() + (q * a).sum() + (r * b + r).sum()
        loss.backward()
        return [x.grad, a.grad, b.grad, r.grad]

    ours = run(F.max_pool2d, lambda v: minidnn.tensor(v, device=device, requires_grad=True),
               lambda t: t.to(memory_format=minidnn.channels_last) if channels_last else t)
    theirs = run(torch.nn.functional.max_pool2d, lambda v: torch.tensor(v, requires_grad=True),
                 lambda t: t.to(memory_format=torch.channels_last) if channels_last else t)
    for name, got, want in zip("x a b r".split(), ours, theirs):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    assert sorted(calls) == [False, False, True]


def test_shared_gradient_arrays_are_not_aliased():
    a = minidnn.tensor([1.0], requires_grad=True)
    b = minidnn.tensor([1.0], requires_grad=True)
    (a + b).sum().backward()  # the same gradient array reaches both leaves
    (a * 5).sum().backward()
    assert a.grad.item() == 6.0 and b.grad.item() == 1.0


def test_deep_graph_has_no_recursion_limit():
    x = minidnn.tensor(np.ones(4), requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0 + 0.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones(4))


def test_saved_arrays_are_released_after_backward():
    x = minidnn.tensor(np.ones((100, 100)), requires_grad=True)
    big = minidnn.tensor(np.full((100, 100), 2.0))
    watch = weakref.ref(big.data)
    y = (x * big).sum()
    del big
    gc.collect()
    assert watch() is not None  # kept alive by the Mul node for its backward
    y.backward()
    gc.collect()
    assert watch() is None  # released as soon as the node's backward ran
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = minidnn.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.numpy())


def test_no_grad_records_nothing():
    x = minidnn.tensor([1.0], requires_grad=True)
    with minidnn.no_grad():
        y = x * 2
    assert not y.requires_grad and y.is_leaf
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()


def test_backward_needs_gradient_for_non_scalars_and_checks_its_shape():
    x = minidnn.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="one-element"):
        (x * 2).backward()
    with pytest.raises(ValueError, match="shape"):
        (x * 2).backward(minidnn.tensor([1.0]))


def test_detach_and_retain_grad():
    x = minidnn.tensor([3.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    z = y * y.detach()
    z.sum().backward()
    assert x.grad.item() == pytest.approx(2 * 6.0)  # d(2x · const 6)/dx
    assert y.grad.item() == pytest.approx(6.0)


def test_inplace_on_leaf_requiring_grad_is_refused():
    x = minidnn.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        x.add_(1.0)
    with minidnn.no_grad():
        x.add_(1.0)
    assert x.item() == 2.0


# --- operations: gradients against finite differences -----------------------------------------
@pytest.mark.parametrize("op", [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / (b * b + 1.0),
    lambda a, b: (a * a + 1.0) ** b, lambda a, b: 2.0 - a * 3.0 + 1.5 / (b * b + 1.0),
])
def test_binary_ops_with_broadcasting(op, rng):
    gradcheck(op, rng.standard_normal((3, 1, 4)), rng.standard_normal((5, 1)))


@pytest.mark.parametrize("op", [
    lambda a: a.exp(), lambda a: (a * a + 1).log(), lambda a: (a * a + 1).sqrt(), lambda a: abs(a),
    lambda a: -a, lambda a: a.clamp(-0.3, 0.4), lambda a: a.relu(), lambda a: a ** 3,
])
def test_unary_ops(op, rng):
    gradcheck(op, rng.standard_normal((4, 3)))


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)),
                                    ((5, 2, 3), (3, 4)), ((5, 2, 3), (1, 3, 4))])
def test_matmul_shapes(shapes, rng):
    gradcheck(lambda a, b: a @ b, rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1]))


@pytest.mark.parametrize("op", [
    lambda a: a.sum(), lambda a: a.sum(1), lambda a: a.sum((0, 2), keepdim=True), lambda a: a.mean(),
    lambda a: a.mean(-1), lambda a: a.max(), lambda a: a.max(1).values, lambda a: a.min(2, keepdim=True).values,
])
def test_reductions(op, rng):
    gradcheck(op, rng.standard_normal((2, 3, 4)))


def test_max_with_dim_returns_values_and_indices():
    t = minidnn.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    values, indices = t.max(1)
    np.testing.assert_array_equal(values.numpy(), [5.0, 7.0])
    np.testing.assert_array_equal(indices.numpy(), [1, 0])
    assert t.argmax(1).tolist() == [1, 0]


@pytest.mark.parametrize("op", [
    lambda a: a.reshape(4, 6), lambda a: a.view(-1), lambda a: a.permute(2, 0, 1), lambda a: a.transpose(0, 2),
    lambda a: a.flatten(1), lambda a: a.unsqueeze(1).squeeze(1), lambda a: a.T, lambda a: a[1:, ::2, -1],
    lambda a: a[:, [0, 0, 2]], lambda a: a[a.detach() > 0], lambda a: a[None, ..., 1],
    lambda a: a.expand(3, 2, 3, 4).sum(0),
])
def test_shape_and_indexing_ops(op, rng):
    gradcheck(op, rng.standard_normal((2, 3, 4)))


def test_cat_stack_where(rng):
    gradcheck(lambda a, b: minidnn.cat([a, b, a], dim=1), rng.standard_normal((2, 3)), rng.standard_normal((2, 1)))
    gradcheck(lambda a, b: minidnn.stack([a, b], dim=-1), rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))
    gradcheck(lambda a, b: minidnn.where(a > 0, a, b), rng.standard_normal((4,)), rng.standard_normal((4,)))


def test_shape_errors_name_the_problem():
    t = minidnn.zeros(2, 3)
    with pytest.raises(ValueError, match="cannot reshape"):
        t.reshape(4, 2)
    with pytest.raises(ValueError, match="permutation"):
        t.permute(0, 0)
    with pytest.raises(IndexError, match="out of range"):
        t.sum(3)
    with pytest.raises(ValueError, match="differ outside dim"):
        minidnn.cat([t, minidnn.zeros(3, 3)], dim=1)


def test_comparisons_give_bool_tensors_outside_the_graph():
    a = minidnn.tensor([1.0, 2.0], requires_grad=True)
    mask = a > 1.5
    assert mask.dtype == np.bool_ and not mask.requires_grad
    assert (a == minidnn.tensor([1.0, 0.0])).tolist() == [True, False]


def test_to_changes_dtype_differentiably():
    x = minidnn.tensor([1.0, 2.0], dtype=minidnn.float64, requires_grad=True)
    y = x.to(minidnn.float32) * 2
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


@pytest.mark.gpu
def test_moving_between_devices_and_mixing_is_an_error():
    x = minidnn.tensor([1.0, 2.0], requires_grad=True)
    y = x.to("cuda")
    assert str(y.device) == "cuda:0" and backend.is_cuda_array(y.data)
    (y * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
    with pytest.raises(ValueError, match="same device"):
        x + y


# --- in-place ReLU: written over its input; a backward that needed the old values refuses ----------
def test_relu_in_place_on_a_fresh_output_writes_over_it(rng):
    x = minidnn.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    h = x @ minidnn.tensor(rng.standard_normal((4, 5)))
    before = h.data
    out = h.relu_()
    assert out is h and out.data is before  # the product's array now holds the ReLU
    assert np.all(out.numpy() >= 0)
    assert type(out._node).__name__ == "ReLUFunction"


def test_relu_in_place_matches_out_of_place_gradients(rng):
    data_x, data_w = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    weights = rng.standard_normal((3, 5))
    grads = []
    for inplace in (True, False):
        x, w = minidnn.tensor(data_x, requires_grad=True), minidnn.tensor(data_w, requires_grad=True)
        y = minidnn.functional.relu(x @ w, inplace=inplace)
        (y * minidnn.tensor(weights)).sum().backward()
        grads.append((x.grad.numpy(), w.grad.numpy(), y.numpy()))
    for got, want in zip(grads[0], grads[1]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("producer", ["used_elsewhere", "saves_output"])
def test_relu_in_place_over_a_value_a_node_saved_refuses_the_backward(rng, producer):
    """As in PyTorch: the write goes ahead, and the backward that would read the old values refuses."""
    x = minidnn.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    if producer == "used_elsewhere":  # h is also an input of the product, which saved it
        h = x * 1.0
        other = (h * h).sum()
    else:  # exp's backward reads its own output
        h = x.exp()
        other = h.sum()
    assert h.relu_() is h and np.all(h.numpy() >= 0)  # written in place
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation \(relu_\).*(MulFunction|ExpFunction)"):
        (h.sum() + other).backward()


def test_relu_in_place_on_a_view_in_the_graph_is_refused(rng):
    x = minidnn.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    base = x * 1.0
    view = base.reshape(4, 3)  # shares base's memory
    for target in (view, base):
        with pytest.raises(RuntimeError, match="shares its memory with a view"):
            target.relu_()
    with minidnn.no_grad():  # outside a graph the write is allowed, and reaches both
        view.relu_()
    assert np.all(base.numpy() >= 0)


def test_relu_in_place_on_a_leaf(rng):
    leaf = minidnn.tensor(rng.standard_normal(5), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        leaf.relu_()
    plain = minidnn.tensor(rng.standard_normal(5))
    array = plain.data
    assert plain.relu_() is plain and plain.data is array and np.all(array >= 0)
