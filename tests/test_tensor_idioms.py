"""The tensor methods a PyTorch user reaches for (clone, var/std, from_numpy, clamp, where, argmax, topk, expand,
repeat) against PyTorch on fresh random inputs of odd shapes: values, gradients, and the bad arguments it refuses."""
import warnings

import numpy as np
import pytest

import minidnn
from tests.helpers import gradcheck

torch = pytest.importorskip("torch")


def both(array, requires_grad=True):
    """The same float64 data as a minidnn tensor and a torch tensor."""
    return (minidnn.tensor(array, requires_grad=requires_grad),
            torch.tensor(array, requires_grad=requires_grad))


def assert_same(ours, theirs, rtol=1e-12, atol=1e-12):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    ours = ours.numpy() if isinstance(ours, minidnn.Tensor) else np.asarray(ours)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)


def backward_both(ours, theirs, rng):
    """Back-propagate the same random weighting of both outputs."""
    weights = rng.standard_normal(ours.shape)
    (ours * minidnn.tensor(weights)).sum().backward()
    (theirs * torch.tensor(weights)).sum().backward()


def raises_like_torch(ours, theirs, our_error, match):
    """Both refuse: PyTorch with its own exception, minidnn with ``our_error`` whose message names the problem."""
    with pytest.raises((RuntimeError, TypeError, ValueError, IndexError)):
        theirs()
    with pytest.raises(our_error, match=match):
        ours()


# ----------------------------------------------------------------------------------------------
# clone, from_numpy
# ----------------------------------------------------------------------------------------------
def test_clone_copies_and_passes_the_gradient(rng):
    x, tx = both(rng.standard_normal((3, 5)))
    y, ty = x.clone(), tx.clone()
    assert not np.shares_memory(y.numpy(), x.numpy())
    backward_both(y * y, ty * ty, rng)
    assert_same(x.grad, tx.grad)
    assert minidnn.clone(x).shape == (3, 5)


def test_from_numpy_shares_memory_both_ways_and_keeps_the_dtype(rng):
    array = rng.standard_normal((2, 7))
    t, tt = minidnn.from_numpy(array), torch.from_numpy(array.copy())
    assert t.dtype == np.float64 and str(tt.dtype) == "torch.float64"
    array[1, 3] = 42.0
    assert t[1, 3].item() == 42.0
    t.add_(1.0)
    assert array[1, 3] == 43.0
    ints = np.arange(5, dtype=np.int32)
    assert minidnn.from_numpy(ints).dtype == np.int32
    raises_like_torch(lambda: minidnn.from_numpy([1.0, 2.0]), lambda: torch.from_numpy([1.0, 2.0]), TypeError,
                      "numpy.ndarray")
    raises_like_torch(lambda: minidnn.from_numpy(array[:, ::-1]), lambda: torch.from_numpy(array[:, ::-1]),
                      ValueError, "negative")


# ----------------------------------------------------------------------------------------------
# var and std
# ----------------------------------------------------------------------------------------------
VAR_CASES = [
    ((), {}), ((1,), {}), ((-1,), {"keepdim": True}), (((0, 2),), {}), (((0, 2),), {"keepdim": True}),
    ((), {"correction": 0}), ((1,), {"correction": 2}), ((2,), {"correction": 0.5}), ((False,), {}),
    ((0, True), {}), ((), {"dim": 1, "unbiased": False, "keepdim": True}),
]


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("args, kwargs", VAR_CASES)
def test_var_and_std_match_torch(rng, name, args, kwargs):
    x, tx = both(rng.standard_normal((3, 5, 4)) * 2 + 1)
    ours, theirs = getattr(x, name)(*args, **kwargs), getattr(tx, name)(*args, **kwargs)
    assert_same(ours, theirs)
    backward_both(ours, theirs, rng)
    assert_same(x.grad, tx.grad, rtol=1e-10)
    float32 = minidnn.tensor(x.numpy().astype(np.float32))
    assert getattr(float32, name)(*args, **kwargs).dtype == np.float32
    assert_same(getattr(float32, name)(*args, **kwargs), theirs, rtol=1e-5, atol=1e-6)


def test_var_gradient_by_finite_differences(rng):
    gradcheck(lambda x: x.var(1, correction=0), rng.standard_normal((3, 4)))
    gradcheck(lambda x: minidnn.std(x, (0, 1), keepdim=True), rng.standard_normal((2, 3, 2)))


def test_var_without_degrees_of_freedom_is_inf_or_nan_with_a_warning():
    for values, correction in (([1.0, 3.0], 2), ([1.0, 3.0], 3), ([2.0], 1), ([2.0, 2.0], 2)):
        with pytest.warns(UserWarning, match="degrees of freedom"):
            ours = minidnn.tensor(values).var(correction=correction)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = torch.tensor(values).var(correction=correction)
        assert_same(ours, theirs)


def test_var_refuses_what_torch_refuses():
    x = minidnn.zeros(3)
    raises_like_torch(lambda: minidnn.tensor([1, 2]).var(), lambda: torch.tensor([1, 2]).var(), TypeError,
                      "floating-point")
    raises_like_torch(lambda: x.var(unbiased=True, correction=1), lambda: torch.zeros(3).var(unbiased=True, correction=1),
                      TypeError, "either unbiased or correction")
    raises_like_torch(lambda: x.std(3), lambda: torch.zeros(3).std(3), IndexError, "out of range")


# ----------------------------------------------------------------------------------------------
# clamp and where
# ----------------------------------------------------------------------------------------------
def boundary_input(rng, shape):
    """Normal draws with some elements exactly on the bounds ±0.5 and 0 (PyTorch's tie rules)."""
    x = rng.standard_normal(shape)
    x.reshape(-1)[:3] = [-0.5, 0.5, 0.0]
    return x


@pytest.mark.parametrize("low, high", [(-0.5, 0.5), (0.5, -0.5), (0.0, 0.0), (-0.5, None), (None, 0.5)])
def test_clamp_with_number_bounds_matches_torch(rng, low, high):
    x, tx = both(boundary_input(rng, (3, 7)))
    ours, theirs = x.clamp(low, high), tx.clamp(low, high)
    assert_same(ours, theirs)
    backward_both(ours, theirs, rng)
    assert_same(x.grad, tx.grad)


@pytest.mark.parametrize("case", ["both", "crossed", "equal", "min only", "max only"])
def test_clamp_with_tensor_bounds_gives_torch_gradients_to_all_three(rng, case):
    shape = (3, 1, 5)
    low_values = rng.standard_normal((4, 1)) - 0.5  # broadcast against x
    high_values = {"both": low_values + 1.0, "crossed": low_values - 1.0, "equal": low_values,
                   "min only": None, "max only": low_values + 1.0}[case]
    low_values = None if case == "max only" else low_values
    x, tx = both(rng.standard_normal(shape))
    low, tlow = both(low_values) if low_values is not None else (None, None)
    high, thigh = both(high_values) if high_values is not None else (None, None)
    ours, theirs = minidnn.clamp(x, low, high), torch.clamp(tx, tlow, thigh)
    assert_same(ours, theirs)
    backward_both(ours, theirs, rng)
    for mine, their in ((x, tx), (low, tlow), (high, thigh)):
        if mine is not None:
            assert_same(mine.grad, their.grad)


def test_clamp_gradients_by_finite_differences_and_its_aliases(rng):
    x = rng.uniform(-2, 2, (3, 4))
    gradcheck(lambda x, low, high: x.clamp(low, high), x, np.full((4,), -1.0) + rng.uniform(0, 0.5, 4),
              np.full((3, 1), 1.0) + rng.uniform(0, 0.5, (3, 1)))
    t = minidnn.tensor(x)
    assert_same(t.clamp_min(0.25), torch.tensor(x).clamp_min(0.25))
    assert_same(t.clamp_max(-0.25), torch.tensor(x).clamp_max(-0.25))
    assert_same(t.clip(-1, 1), torch.tensor(x).clip(-1, 1))
    raises_like_torch(lambda: t.clamp(), lambda: torch.tensor(x).clamp(), ValueError, "at least one of 'min' or 'max'")


def test_where_forms_match_torch(rng):
    a, ta = both(rng.standard_normal((2, 3, 4)))
    b, tb = both(rng.standard_normal((3, 1)))
    condition = rng.standard_normal((2, 3, 4)) > 0
    ours, theirs = minidnn.where(minidnn.tensor(condition), a, b), torch.where(torch.tensor(condition), ta, tb)
    assert_same(ours, theirs)
    backward_both(ours, theirs, rng)
    assert_same(a.grad, ta.grad)
    assert_same(b.grad, tb.grad)
    assert_same(a.where(minidnn.tensor(condition), 0.5), ta.where(torch.tensor(condition), 0.5))
    for mine, their in zip(minidnn.where(minidnn.tensor(condition)), torch.where(torch.tensor(condition))):
        assert mine.dtype == np.int64
        assert_same(mine, their)
    raises_like_torch(lambda: minidnn.where(a, a, b), lambda: torch.where(ta, ta, tb), TypeError, "bool")


# ----------------------------------------------------------------------------------------------
# argmax, argmin, topk
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim, keepdim", [(None, False), (None, True), (0, False), (-1, True), (1, False)])
def test_argmax_and_argmin_match_torch(rng, dim, keepdim):
    values = rng.standard_normal((3, 5, 2))
    for name in ("argmax", "argmin"):
        ours = getattr(minidnn.tensor(values), name)(dim=dim, keepdim=keepdim)
        theirs = getattr(torch.tensor(values), name)(dim=dim, keepdim=keepdim)
        assert ours.dtype == np.int64
        assert_same(ours, theirs)
    assert_same(minidnn.argmax(minidnn.tensor(values), 1), torch.argmax(torch.tensor(values), 1))


@pytest.mark.parametrize("k, dim, largest", [(3, -1, True), (2, 0, False), (1, 1, True), (0, 2, True), (5, 1, False)])
def test_topk_values_indices_and_gradient_match_torch(rng, k, dim, largest):
    x, tx = both(rng.standard_normal((4, 5, 3)))
    ours, theirs = x.topk(k, dim, largest), tx.topk(k, dim, largest)
    assert_same(ours.values, theirs.values)
    assert_same(ours.indices, theirs.indices)
    assert ours.indices.dtype == np.int64
    backward_both(ours.values, theirs.values, rng)
    assert_same(x.grad, tx.grad)


def test_topk_unsorted_scalar_function_form_and_finite_differences(rng):
    values = rng.standard_normal((3, 6))
    ours = minidnn.topk(minidnn.tensor(values), 4, sorted=False)
    theirs = torch.topk(torch.tensor(values), 4, sorted=False)
    assert_same(np.sort(ours.values.numpy(), 1), np.sort(theirs.values.numpy(), 1))
    scalar, tscalar = minidnn.tensor(2.5).topk(1), torch.tensor(2.5).topk(1)
    assert scalar.values.shape == () and scalar.values.item() == tscalar.values.item()
    gradcheck(lambda x: x.topk(2, dim=0, largest=False).values, values)


def test_topk_refuses_what_torch_refuses():
    x, tx = minidnn.zeros(2, 3), torch.zeros(2, 3)
    raises_like_torch(lambda: x.topk(4), lambda: tx.topk(4), ValueError, "k must be in")
    raises_like_torch(lambda: x.topk(-1), lambda: tx.topk(-1), ValueError, "k must be in")
    raises_like_torch(lambda: x.topk(1, dim=2), lambda: tx.topk(1, dim=2), IndexError, "out of range")


# ----------------------------------------------------------------------------------------------
# expand and repeat
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, target", [((3, 1), (3, 4)), ((1, 5), (2, 3, -1, 5)[1:]), ((2, 1, 3), (4, -1, 5, 3)),
                                           ((), (2, 3)), ((1,), (0,))])
def test_expand_matches_torch(rng, shape, target):
    x, tx = both(rng.standard_normal(shape))
    ours, theirs = x.expand(*target), tx.expand(*target)
    assert_same(ours, theirs)
    backward_both(ours, theirs, rng)
    assert_same(x.grad, tx.grad)
    assert x.expand_as(minidnn.zeros(ours.shape)).shape == ours.shape


def test_expand_refuses_what_torch_refuses():
    x, tx = minidnn.zeros(2, 3), torch.zeros(2, 3)
    raises_like_torch(lambda: x.expand(3), lambda: tx.expand(3), ValueError, "number of sizes provided")
    raises_like_torch(lambda: x.expand(2, 4), lambda: tx.expand(2, 4), ValueError, "must match the existing size")
    raises_like_torch(lambda: x.expand(-1, 2, 3), lambda: tx.expand(-1, 2, 3), ValueError, "leading, non-existing")


@pytest.mark.parametrize("shape, sizes", [((2, 3), (2, 1)), ((3,), (2, 1, 2)), ((2, 1, 3), (1, 4, 2)), ((2,), (0,)),
                                          ((), (3,))])
def test_repeat_matches_torch(rng, shape, sizes):
    x, tx = both(rng.standard_normal(shape))
    ours, theirs = x.repeat(*sizes), tx.repeat(*sizes)
    assert_same(ours, theirs)
    backward_both(ours, theirs, rng)
    assert_same(x.grad, tx.grad)


def test_repeat_gradient_by_finite_differences_and_errors(rng):
    gradcheck(lambda x: x.repeat(2, 1, 3), rng.standard_normal((2, 3)))
    x, tx = minidnn.zeros(2, 3), torch.zeros(2, 3)
    raises_like_torch(lambda: x.repeat(2), lambda: tx.repeat(2), ValueError, "can not be smaller")
    raises_like_torch(lambda: x.repeat(2, -1), lambda: tx.repeat(2, -1), ValueError, ">= 0")


@pytest.mark.gpu
def test_gpu_tensor_idioms_match_the_cpu(rng):
    """Every idiom above on a CUDA tensor gives the CPU's values and gradients."""
    values, bound = rng.standard_normal((3, 4, 5)), rng.standard_normal((4, 1))

    def run(device):
        x = minidnn.tensor(values, device=device, requires_grad=True)
        low = minidnn.tensor(bound, device=device, requires_grad=True)
        parts = [x.clone(), x.var(1, keepdim=True), x.std(correction=0), x.clamp(low, 0.5),
                 x.where(x > 0, 0.25), x.topk(2, dim=2).values, x[:, :1].expand(3, 4, 5), x.repeat(1, 2, 1)]
        total = sum((p * p).sum() for p in parts)
        total.backward()
        found = [minidnn.argmax(x, 1), x.topk(3, dim=0, largest=False).indices, *minidnn.where(x > 0.5)]
        return [p.numpy() for p in parts + found] + [x.grad.numpy(), low.grad.numpy()]

    for gpu, cpu in zip(run("cuda"), run("cpu")):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-12, atol=1e-12)
