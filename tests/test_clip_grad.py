"""nn.utils gradient clipping against torch.nn.utils: the returned total norm, the clipped gradients, norm types,
non-finite norms and the arguments refused."""
import math

import numpy as np
import pytest

import minidnn
import minidnn.nn as nn

torch = pytest.importorskip("torch")


def parameters_with_grads(rng, shapes, dtype=np.float64, scale=1.0):
    """The same parameters with the same gradients in minidnn and torch; the first has no gradient."""
    ours, theirs = [], []
    for index, shape in enumerate(shapes):
        value, grad = rng.standard_normal(shape).astype(dtype), (rng.standard_normal(shape) * scale).astype(dtype)
        p, tp = minidnn.tensor(value, requires_grad=True), torch.tensor(value, requires_grad=True)
        if index:
            p.grad, tp.grad = minidnn.tensor(grad), torch.tensor(grad)
        ours.append(p)
        theirs.append(tp)
    return ours, theirs


SHAPES = [(3,), (4, 5), (2, 3, 1), (7,)]


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
@pytest.mark.parametrize("norm_type", [2.0, 1, 3.5, math.inf, "inf"])
def test_clip_grad_norm_matches_torch(rng, max_norm, norm_type):
    ours, theirs = parameters_with_grads(rng, SHAPES)
    total = nn.utils.clip_grad_norm_(iter(ours), max_norm, norm_type)
    their_total = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert isinstance(total, minidnn.Tensor) and total.shape == () and total.dtype == np.float64
    np.testing.assert_allclose(total.item(), their_total.item(), rtol=1e-12)
    assert ours[0].grad is None
    for p, tp in zip(ours[1:], theirs[1:]):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-12)


def test_float32_a_single_tensor_and_a_model(rng):
    ours, theirs = parameters_with_grads(rng, [(1,), (6, 5)], np.float32, scale=10.0)
    total = nn.utils.clip_grad_norm_(ours[1], 1.0)
    their_total = torch.nn.utils.clip_grad_norm_(theirs[1], 1.0)
    assert total.dtype == np.float32
    np.testing.assert_allclose(total.item(), their_total.item(), rtol=1e-6)
    np.testing.assert_allclose(ours[1].grad.numpy(), theirs[1].grad.numpy(), rtol=1e-6)
    model = nn.Linear(4, 3)
    (model(minidnn.randn(5, 4)) ** 2).sum().backward()
    before = math.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in model.parameters()))
    assert nn.utils.clip_grad_norm_(model.parameters(), before / 2).item() == pytest.approx(before, rel=1e-6)
    after = math.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in model.parameters()))
    assert after == pytest.approx(before / 2, rel=1e-5)


def test_no_gradients_give_a_zero_norm_and_nothing_to_clip():
    p = minidnn.zeros(3, requires_grad=True)
    total = nn.utils.clip_grad_norm_([p], 1.0)
    assert total.item() == torch.nn.utils.clip_grad_norm_([torch.zeros(3, requires_grad=True)], 1.0).item() == 0.0
    assert nn.utils.clip_grad_norm_([], 1.0).item() == 0.0


def test_non_finite_norms_scale_or_raise_as_in_torch(rng):
    for bad in (math.inf, math.nan):
        ours, theirs = parameters_with_grads(rng, SHAPES)
        ours[2].grad.data[1, 1], theirs[2].grad[1, 1] = bad, bad
        with pytest.raises(RuntimeError, match="non-finite"):
            torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
        with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
            nn.utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
        total = nn.utils.clip_grad_norm_(ours, 1.0)
        their_total = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        np.testing.assert_equal(total.item(), their_total.item())
        for p, tp in zip(ours[1:], theirs[1:]):
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-12)


def test_clip_grad_value_and_the_total_norm_helpers_match_torch(rng):
    ours, theirs = parameters_with_grads(rng, SHAPES)
    nn.utils.clip_grad_value_(ours, 0.3)
    torch.nn.utils.clip_grad_value_(theirs, 0.3)
    for p, tp in zip(ours[1:], theirs[1:]):
        np.testing.assert_array_equal(p.grad.numpy(), tp.grad.numpy())
    ours, theirs = parameters_with_grads(rng, SHAPES)
    total = nn.utils.get_total_norm([p.grad for p in ours[1:]], 3.0)
    their_total = torch.nn.utils.get_total_norm([p.grad for p in theirs[1:]], 3.0)
    np.testing.assert_allclose(total.item(), their_total.item(), rtol=1e-12)
    nn.utils.clip_grads_with_norm_(ours, 0.25, total)
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.25, their_total)
    for p, tp in zip(ours[1:], theirs[1:]):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-12)


def test_bad_arguments_are_refused():
    p = minidnn.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="norm_type must be a number > 0 or 'inf'"):
        nn.utils.clip_grad_norm_([p], 1.0, norm_type=0)
    with pytest.raises(TypeError, match="norm_type must be a number > 0 or 'inf'"):
        nn.utils.clip_grad_norm_([p], 1.0, norm_type="two")
    with pytest.raises(TypeError, match="max_norm must be a real number"):
        nn.utils.clip_grad_norm_([p], "1.0")
    with pytest.raises(TypeError, match="an element of type ndarray"):
        nn.utils.clip_grad_norm_([np.zeros(3)], 1.0)
    with pytest.raises(TypeError, match="clip_value must be a real number"):
        nn.utils.clip_grad_value_([p], None)


@pytest.mark.gpu
def test_gpu_clip_grad_norm_matches_the_cpu(rng):
    cpu, _ = parameters_with_grads(rng, SHAPES)
    gpu = []
    for p in cpu:
        q = minidnn.tensor(p.numpy(), device="cuda", requires_grad=True)
        q.grad = None if p.grad is None else minidnn.tensor(p.grad.numpy(), device="cuda")
        gpu.append(q)
    total_gpu, total_cpu = nn.utils.clip_grad_norm_(gpu, 0.5), nn.utils.clip_grad_norm_(cpu, 0.5)
    assert total_gpu.is_cuda
    np.testing.assert_allclose(total_gpu.item(), total_cpu.item(), rtol=1e-12)
    for p, q in zip(cpu[1:], gpu[1:]):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-12)
