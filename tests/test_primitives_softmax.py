"""Softmax, log-softmax, NLL and cross-entropy primitives against loop references, finite differences and PyTorch."""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from minidnn.primitives.softmax import (cross_entropy_backward, cross_entropy_forward, log_softmax_backward,
                                        log_softmax_forward, nll_loss_backward, nll_loss_forward, softmax_backward,
                                        softmax_forward)
from tests.helpers import FD_TOLERANCE, float32_tolerance, assert_close, numerical_gradient, to_numpy


# ----------------------------------------------------------------------------------------------
# Independent float64 references: plain loops with the math module
# ----------------------------------------------------------------------------------------------


def rows_along(array: np.ndarray, axis: int) -> np.ndarray:
    """The 1-D slices along ``axis`` as the rows of a 2-D float64 array (a copy)."""
    moved = np.moveaxis(np.asarray(array, dtype=np.float64), axis, -1)
    return moved.reshape(-1, moved.shape[-1]).copy()


def from_rows(rows: np.ndarray, shape: tuple, axis: int) -> np.ndarray:
    moved_shape = np.moveaxis(np.empty(shape), axis, -1).shape
    return np.moveaxis(rows.reshape(moved_shape), -1, axis)


def reference_log_softmax_row(row) -> list[float]:
    top = max(row)
    log_total = math.log(math.fsum(math.exp(v - top) for v in row))
    return [v - top - log_total for v in row]


def reference_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    rows = rows_along(x, axis)
    out = np.array([[math.exp(v) for v in reference_log_softmax_row(row)] for row in rows])
    return from_rows(out, x.shape, axis)


def reference_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    rows = rows_along(x, axis)
    return from_rows(np.array([reference_log_softmax_row(row) for row in rows]), x.shape, axis)


def reference_softmax_backward(dy: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """dx_j = Σ_i dy_i · ∂y_i/∂x_j with the explicit Jacobian ∂y_i/∂x_j = y_i·([i = j] − y_j)."""
    y_rows, dy_rows = rows_along(reference_softmax(x, axis), axis), rows_along(dy, axis)
    dx = np.zeros_like(y_rows)
    for r, (y, g) in enumerate(zip(y_rows, dy_rows)):
        for j in range(len(y)):
            dx[r, j] = math.fsum(g[i] * y[i] * ((i == j) - y[j]) for i in range(len(y)))
    return from_rows(dx, x.shape, axis)


def reference_log_softmax_backward(dy: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """dx_j = Σ_i dy_i · ([i = j] − p_j), with p the softmax."""
    p_rows, dy_rows = rows_along(reference_softmax(x, axis), axis), rows_along(dy, axis)
    dx = np.zeros_like(p_rows)
    for r, (p, g) in enumerate(zip(p_rows, dy_rows)):
        for j in range(len(p)):
            dx[r, j] = math.fsum(g[i] * ((i == j) - p[j]) for i in range(len(p)))
    return from_rows(dx, x.shape, axis)


def _weights(weight, num_classes):
    return [1.0] * num_classes if weight is None else [float(w) for w in weight]


def reference_nll(log_probs, target, weight=None, ignore_index=-100, reduction="mean"):
    """PyTorch's F.nll_loss, one row at a time."""
    n_rows, n_classes = log_probs.shape
    w = _weights(weight, n_classes)
    rows, denominator = [], 0.0
    for i in range(n_rows):
        t = int(target[i])
        if t == ignore_index:
            rows.append(0.0)
            continue
        rows.append(-w[t] * float(log_probs[i, t]))
        denominator += w[t]
    return _reference_reduce(rows, denominator, reduction)


def reference_nll_backward(grad_loss, target, shape, weight=None, ignore_index=-100, reduction="mean"):
    n_rows, n_classes = shape
    w = _weights(weight, n_classes)
    denominator = sum(w[int(t)] for t in target if int(t) != ignore_index)
    grad = np.zeros(shape)
    for i in range(n_rows):
        t = int(target[i])
        if t == ignore_index:
            continue
        upstream = float(grad_loss[i]) if reduction == "none" else float(grad_loss)
        grad[i, t] = -w[t] * (upstream / denominator if reduction == "mean" else upstream)
    return grad


def reference_cross_entropy(logits, target, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """PyTorch's F.cross_entropy with class indices, written out from its definition:
    row i costs (1 − ε)·(−w[t_i]·logp[i, t_i]) + (ε/C)·Σ_c(−w[c]·logp[i, c]); the mean divides
    the sum by Σ w[t_i] over rows not ignored."""
    n_rows, n_classes = logits.shape
    w, eps = _weights(weight, n_classes), label_smoothing
    rows, denominator = [], 0.0
    for i in range(n_rows):
        t = int(target[i])
        if t == ignore_index:
            rows.append(0.0)
            continue
        logp = reference_log_softmax_row([float(v) for v in logits[i]])
        smooth = math.fsum(-w[c] * logp[c] for c in range(n_classes))
        rows.append((1 - eps) * (-w[t] * logp[t]) + eps / n_classes * smooth)
        denominator += w[t]
    return _reference_reduce(rows, denominator, reduction)


def reference_cross_entropy_backward(grad_loss, logits, target, weight=None, ignore_index=-100, label_smoothing=0.0,
                                     reduction="mean"):
    """By the chain rule through log-softmax, not in the fused form: ∂loss/∂logp[i, c] first
    (−scale_i·((1 − ε)·w[t_i]·[c = t_i] + ε/C·w[c])), then ∂logp[i, c]/∂z[i, j] = [c = j] − p[i, j]."""
    n_rows, n_classes = logits.shape
    w, eps = _weights(weight, n_classes), label_smoothing
    denominator = sum(w[int(t)] for t in target if int(t) != ignore_index)
    grad = np.zeros((n_rows, n_classes))
    for i in range(n_rows):
        t = int(target[i])
        if t == ignore_index:
            continue
        upstream = float(grad_loss[i]) if reduction == "none" else float(grad_loss)
        scale = upstream / denominator if reduction == "mean" else upstream
        d_logp = [-scale * ((1 - eps) * w[t] * (c == t) + eps / n_classes * w[c]) for c in range(n_classes)]
        p = [math.exp(v) for v in reference_log_softmax_row([float(v) for v in logits[i]])]
        for j in range(n_classes):
            grad[i, j] = math.fsum(d_logp[c] * ((c == j) - p[j]) for c in range(n_classes))
    return grad


def _reference_reduce(rows, denominator, reduction):
    if reduction == "none":
        return np.array(rows)
    total = math.fsum(rows)
    return np.array(total if reduction == "sum" else (total / denominator if denominator else math.nan))


# ----------------------------------------------------------------------------------------------
# Softmax and log-softmax
# ----------------------------------------------------------------------------------------------
AXIS_CASES = [((1, 5), -1), ((4,), 0), ((3, 4, 5), 1), ((2, 3, 1, 4), 0), ((2, 3, 5), -3), ((1, 7, 3), 2)]
SOFTMAXES = {
    "softmax": (softmax_forward, softmax_backward, reference_softmax, reference_softmax_backward),
    "log_softmax": (log_softmax_forward, log_softmax_backward, reference_log_softmax, reference_log_softmax_backward),
}


@pytest.mark.parametrize("name", list(SOFTMAXES))
@pytest.mark.parametrize("shape, axis", AXIS_CASES)
def test_softmax_matches_reference_float64(xp, rng, name, shape, axis):
    forward, backward, reference, reference_backward = SOFTMAXES[name]
    x, dy = rng.standard_normal(shape) * 3, rng.standard_normal(shape)
    y = forward(xp.asarray(x), axis=axis)
    assert y.dtype == xp.float64
    assert_close(y, reference(x, axis), rtol=1e-12, atol=1e-14, name=f"{name} forward")
    dx = backward(xp.asarray(dy), y, axis=axis)
    assert_close(dx, reference_backward(dy, x, axis), rtol=1e-11, atol=1e-13, name=f"{name} backward")


@pytest.mark.parametrize("name", list(SOFTMAXES))
@pytest.mark.parametrize("shape, axis", [((1, 5), -1), ((2, 3, 2), 1), ((3, 2), 0)])
def test_softmax_backward_matches_finite_differences(xp, rng, name, shape, axis):
    forward, backward = SOFTMAXES[name][:2]
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    expected = numerical_gradient(lambda a: forward(a, axis=axis), [x], 0, dy)
    dx = backward(xp.asarray(dy), forward(xp.asarray(x), axis=axis), axis=axis)
    assert_close(dx, expected, **FD_TOLERANCE, name=f"{name} finite differences")


@pytest.mark.parametrize("name", list(SOFTMAXES))
def test_softmax_float32_matches_float64_reference(xp, rng, name):
    forward, backward, reference, reference_backward = SOFTMAXES[name]
    x = (rng.standard_normal((3, 7, 2)) * 4).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y = forward(xp.asarray(x), axis=1)
    dx = backward(xp.asarray(dy), y, axis=1)
    assert y.dtype == xp.float32 and dx.dtype == xp.float32
    assert_close(y, reference(x, 1), **float32_tolerance(xp, rtol=2e-6, atol=1e-6), name=f"{name} float32 forward")
    assert_close(dx, reference_backward(dy.astype(np.float64), x, 1), rtol=1e-5, atol=1e-5,
                 name=f"{name} float32 backward")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_of_huge_logits_stays_finite(xp, dtype):
    x = xp.asarray(np.array([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4], [-1e4, -1e4 + 1, -1e4]], dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow RuntimeWarning would fail the test
        y, log_y = to_numpy(softmax_forward(x)), to_numpy(log_softmax_forward(x))
    assert y.dtype == dtype and log_y.dtype == dtype
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(log_y))
    np.testing.assert_allclose(y[0], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(y[1], [1 / 3] * 3, rtol=1e-6)
    e = math.e
    np.testing.assert_allclose(y[2], [1 / (2 + e), e / (2 + e), 1 / (2 + e)], rtol=1e-6)
    np.testing.assert_allclose(log_y[0], [0.0, -1e4, -2e4])  # exact logs, where log(softmax) would give −inf


# One warp per row: rows beyond one pass of the grid (8 rows per block, 132·32 blocks), C of one
# lane step, many steps and a partial one; one thread per (outer, inner): more positions than one pass.
GPU_SOFTMAX_CASES = [((40000, 10), -1), ((128, 3000), -1), ((300, 33), 1), ((64, 1000, 7), 1),
                     ((2, 3, 1000, 700), 1), ((50, 2, 11), 0)]


@pytest.mark.parametrize("name", list(SOFTMAXES))
@pytest.mark.parametrize("shape, axis", GPU_SOFTMAX_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_softmax_large_shapes_match_numpy_twin(xp, rng, name, shape, axis, dtype):
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    forward, backward = SOFTMAXES[name][:2]
    x, dy = (rng.standard_normal(shape) * 4).astype(dtype), rng.standard_normal(shape).astype(dtype)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    if name == "log_softmax" and dtype == np.float32:
        # log_softmax = x − max − log Σ e^(x − max): each side rounds the log-sum (up to ~15 here) to
        # float32, an absolute error of a few 1e-6 that is large relative to entries near 0.
        tol = dict(rtol=1e-5, atol=1e-5)
    y = forward(xp.asarray(x), axis=axis)
    assert_close(y, forward(x, axis=axis), **tol, name=f"{name} forward")
    y = to_numpy(y)
    if dtype == np.float32:
        # dx = dy − e^y·Σdy (or y·(dy − Σdy·y)) cancels: each side's float32 rounding of the row sum
        # (the twin sums in float32, the GPU in float64) shows at about 1e-7·|Σ|.
        row_sum = dy.astype(np.float64) * (1 if name == "log_softmax" else y.astype(np.float64))
        tol = dict(rtol=1e-5, atol=1e-6 * (1 + np.abs(row_sum.sum(axis=axis)).max()))
    assert_close(backward(xp.asarray(dy), xp.asarray(y), axis=axis), backward(dy, y, axis=axis), **tol,
                 name=f"{name} backward")


def test_softmax_errors_name_the_argument(xp):
    x = xp.ones((2, 3))
    with pytest.raises(ValueError, match=r"axis 2 is out of range for x with 2 dimension\(s\)"):
        softmax_forward(x, axis=2)
    with pytest.raises(TypeError, match="axis must be an int"):
        log_softmax_forward(x, axis=1.0)
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        softmax_forward(xp.ones((2, 3), dtype=xp.int64))
    with pytest.raises(ValueError, match="dy must have y.s shape"):
        softmax_backward(xp.ones((2, 3)), xp.ones((3, 2)))
    with pytest.raises(TypeError, match="dy and y must have the same dtype"):
        log_softmax_backward(xp.ones((2, 3), dtype=xp.float32), x)
    with pytest.raises(ValueError, match="is out of range for"):
        log_softmax_backward(x, x, axis=-3)


# ----------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------
REDUCTIONS = ["mean", "sum", "none"]
# weight × ignored rows × label smoothing × reduction
LOSS_CASES = list(itertools.product([False, True], [False, True], [0.0, 0.3], REDUCTIONS))
LOSS_IDS = [f"{'w' if w else 'nw'}-{'ign' if i else 'all'}-ls{ls}-{r}" for w, i, ls, r in LOSS_CASES]


def draw_loss_problem(rng, n_rows, n_classes, use_weight, ignore_some, reduction, ignore_index=-100):
    """Logits, targets (two rows ignored when asked, batch 1 never fully), weight and grad_loss."""
    logits = rng.standard_normal((n_rows, n_classes)) * 2
    target = rng.integers(0, n_classes, size=n_rows)
    if ignore_some:
        target[rng.choice(n_rows, size=min(2, n_rows - 1), replace=False)] = ignore_index
    weight = rng.uniform(0.2, 2.0, size=n_classes) if use_weight else None
    grad_loss = rng.standard_normal(n_rows) if reduction == "none" else np.array(rng.uniform(0.5, 2.0))
    return logits, target, weight, grad_loss


def on(xp, array):
    return None if array is None else xp.asarray(array)


@pytest.mark.parametrize("use_weight, ignore_some, label_smoothing, reduction", LOSS_CASES, ids=LOSS_IDS)
def test_cross_entropy_matches_reference_float64(xp, rng, use_weight, ignore_some, label_smoothing, reduction):
    logits, target, weight, grad_loss = draw_loss_problem(rng, 7, 5, use_weight, ignore_some, reduction)
    options = dict(weight=weight, label_smoothing=label_smoothing, reduction=reduction)
    xp_options = {**options, "weight": on(xp, weight)}
    loss, log_probs = cross_entropy_forward(xp.asarray(logits), xp.asarray(target), **xp_options)
    assert isinstance(loss, xp.ndarray) and loss.dtype == xp.float64
    assert loss.shape == ((7,) if reduction == "none" else ())
    assert_close(loss, reference_cross_entropy(logits, target, **options), rtol=1e-12, atol=1e-14, name="loss")
    assert_close(log_probs, reference_log_softmax(logits, 1), rtol=1e-12, atol=1e-14, name="log_probs")
    grad = cross_entropy_backward(xp.asarray(grad_loss), log_probs, xp.asarray(target), **xp_options)
    assert_close(grad, reference_cross_entropy_backward(grad_loss, logits, target, **options), rtol=1e-11,
                 atol=1e-13, name="grad_logits")


@pytest.mark.parametrize("use_weight, ignore_some, label_smoothing, reduction", LOSS_CASES, ids=LOSS_IDS)
def test_cross_entropy_backward_matches_finite_differences(xp, rng, use_weight, ignore_some, label_smoothing,
                                                           reduction):
    logits, target, weight, grad_loss = draw_loss_problem(rng, 4, 3, use_weight, ignore_some, reduction)
    options = dict(weight=weight, label_smoothing=label_smoothing, reduction=reduction)
    expected = numerical_gradient(lambda z: cross_entropy_forward(z, target, **options)[0], [logits], 0, grad_loss)
    xp_options = {**options, "weight": on(xp, weight)}
    _, log_probs = cross_entropy_forward(xp.asarray(logits), xp.asarray(target), **xp_options)
    grad = cross_entropy_backward(xp.asarray(grad_loss), log_probs, xp.asarray(target), **xp_options)
    assert_close(grad, expected, **FD_TOLERANCE, name="cross-entropy finite differences")


@pytest.mark.parametrize("use_weight, ignore_some, reduction",
                         list(itertools.product([False, True], [False, True], REDUCTIONS)))
def test_nll_loss_matches_reference_and_finite_differences(xp, rng, use_weight, ignore_some, reduction):
    logits, target, weight, grad_loss = draw_loss_problem(rng, 6, 4, use_weight, ignore_some, reduction)
    log_probs = -rng.uniform(0.1, 4.0, size=logits.shape)  # any (N, C) array works for the NLL
    options = dict(weight=weight, reduction=reduction)
    xp_options = {**options, "weight": on(xp, weight)}
    loss = nll_loss_forward(xp.asarray(log_probs), xp.asarray(target), **xp_options)
    assert isinstance(loss, xp.ndarray) and loss.shape == ((6,) if reduction == "none" else ())
    assert_close(loss, reference_nll(log_probs, target, **options), rtol=1e-13, atol=1e-14, name="nll loss")
    grad = nll_loss_backward(xp.asarray(grad_loss), xp.asarray(target), log_probs.shape, **xp_options)
    assert_close(grad, reference_nll_backward(grad_loss, target, log_probs.shape, **options), rtol=1e-13,
                 atol=1e-14, name="nll grad")
    expected = numerical_gradient(lambda lp: nll_loss_forward(lp, target, **options), [log_probs], 0, grad_loss)
    assert_close(grad, expected, **FD_TOLERANCE, name="nll finite differences")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_float32_matches_float64_reference(xp, rng, reduction, label_smoothing):
    logits, target, weight, grad_loss = draw_loss_problem(rng, 9, 6, True, True, reduction)
    logits32, weight32, grad32 = (a.astype(np.float32) for a in (logits, weight, grad_loss))
    options = dict(label_smoothing=label_smoothing, reduction=reduction)
    loss, log_probs = cross_entropy_forward(xp.asarray(logits32), xp.asarray(target), xp.asarray(weight32), **options)
    grad = cross_entropy_backward(xp.asarray(grad32), log_probs, xp.asarray(target), xp.asarray(weight32), **options)
    nll = nll_loss_forward(log_probs, xp.asarray(target), xp.asarray(weight32), reduction=reduction)
    nll_grad = nll_loss_backward(xp.asarray(grad32), xp.asarray(target), log_probs.shape, xp.asarray(weight32),
                                 reduction=reduction)
    for array in (loss, log_probs, grad, nll, nll_grad):
        assert array.dtype == xp.float32
    as64 = [a.astype(np.float64) for a in (logits32, weight32, grad32)]
    assert_close(loss, reference_cross_entropy(as64[0], target, as64[1], **options),
                 **float32_tolerance(xp, rtol=2e-6, atol=1e-6))
    assert_close(grad, reference_cross_entropy_backward(as64[2], as64[0], target, as64[1], **options), rtol=1e-5,
                 atol=2e-6)
    reference_log_probs = reference_log_softmax(as64[0], 1)
    assert_close(nll, reference_nll(reference_log_probs, target, as64[1], reduction=reduction),
                 **float32_tolerance(xp, rtol=2e-6, atol=1e-6))
    assert_close(nll_grad, reference_nll_backward(as64[2], target, log_probs.shape, as64[1], reduction=reduction),
                 **float32_tolerance(xp, rtol=1e-6, atol=1e-7))


def test_cross_entropy_with_huge_logits_is_finite(xp):
    logits = xp.asarray(np.array([[1e4, 0.0, -1e4], [0.0, 1e4, 0.0]], dtype=np.float32))
    target = xp.asarray(np.array([0, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, log_probs = cross_entropy_forward(logits, target, reduction="none", label_smoothing=0.1)
        grad = cross_entropy_backward(xp.ones(2, dtype=xp.float32), log_probs, target, reduction="none",
                                      label_smoothing=0.1)
    loss, grad = to_numpy(loss), to_numpy(grad)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))
    # row 0: 0.9·0 + 0.1/3·(0 + 1e4 + 2e4); row 1: 0.9·1e4 + 0.1/3·(1e4 + 0 + 1e4)
    np.testing.assert_allclose(loss, [1e3, 9e3 + 2e4 / 30], rtol=1e-6)
    np.testing.assert_allclose(grad[0], [1 - (0.9 + 0.1 / 3), -0.1 / 3, -0.1 / 3], rtol=1e-5, atol=1e-7)


def test_ignore_index_may_be_a_class_and_targets_may_be_unsigned(xp, rng):
    logits = rng.standard_normal((5, 4))
    target = np.array([0, 2, 2, 3, 1], dtype=np.uint8)
    loss, log_probs = cross_entropy_forward(xp.asarray(logits), xp.asarray(target), ignore_index=2, label_smoothing=0.2)
    assert_close(loss, reference_cross_entropy(logits, target, ignore_index=2, label_smoothing=0.2), rtol=1e-12)
    grad = cross_entropy_backward(xp.asarray(np.array(1.0)), log_probs, xp.asarray(target), ignore_index=2,
                                  label_smoothing=0.2)
    assert_close(grad, reference_cross_entropy_backward(1.0, logits, target, ignore_index=2, label_smoothing=0.2),
                 rtol=1e-11, atol=1e-13)
    np.testing.assert_array_equal(to_numpy(grad)[1:3], 0.0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_all_rows_ignored_gives_nan_mean_and_zero_gradient(xp, rng, label_smoothing):
    """As PyTorch: the mean over no rows is 0/0 = NaN (without a warning), the sum is 0, the gradient 0."""
    logits, target = xp.asarray(rng.standard_normal((3, 4))), xp.asarray(np.full(3, -100))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, log_probs = cross_entropy_forward(logits, target, label_smoothing=label_smoothing)
        total, _ = cross_entropy_forward(logits, target, label_smoothing=label_smoothing, reduction="sum")
        grad = cross_entropy_backward(xp.asarray(np.array(1.0)), log_probs, target, label_smoothing=label_smoothing)
        nll_grad = nll_loss_backward(xp.asarray(np.array(1.0)), target, (3, 4))
    assert np.isnan(to_numpy(mean)) and to_numpy(total) == 0.0
    np.testing.assert_array_equal(to_numpy(grad), 0.0)
    np.testing.assert_array_equal(to_numpy(nll_grad), 0.0)


def test_ignored_row_with_minus_infinity_log_prob_contributes_zero(xp):
    log_probs = xp.asarray(np.array([[-np.inf, 0.0], [-0.5, -1.0]]))
    target = xp.asarray(np.array([-100, 1]))
    assert_close(nll_loss_forward(log_probs, target, reduction="none"), np.array([0.0, 1.0]))


def test_loss_errors_name_the_argument(xp):
    logits, target = xp.ones((3, 4)), xp.asarray(np.array([0, 1, 3]))
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        cross_entropy_forward(logits, target, reduction="avg")
    with pytest.raises(ValueError, match="reduction must be"):
        nll_loss_backward(xp.ones(()), target, (3, 4), reduction=None)
    with pytest.raises(TypeError, match="target must be an integer array of class indices"):
        cross_entropy_forward(logits, xp.asarray(np.array([0.0, 1.0, 3.0])))
    with pytest.raises(TypeError, match="target must be an integer array"):
        nll_loss_forward(logits, xp.asarray(np.array([True, False, True])))
    with pytest.raises(ValueError, match=r"target must have shape \(N,\) = \(3,\) .* got \(2,\)"):
        cross_entropy_forward(logits, xp.asarray(np.array([0, 1])))
    with pytest.raises(ValueError, match="target must have shape"):
        nll_loss_forward(logits, xp.asarray(np.zeros((3, 1), dtype=np.int64)))
    with pytest.raises(ValueError, match=r"logits must be 2-D \(N, C\)"):
        cross_entropy_forward(xp.ones((3, 4, 1)), target)
    with pytest.raises(TypeError, match="logits must be a float32 or float64 array"):
        cross_entropy_forward(xp.ones((3, 4), dtype=xp.int32), target)
    with pytest.raises(ValueError, match=r"weight must have shape \(C,\) = \(4,\), got \(3,\)"):
        cross_entropy_forward(logits, target, weight=xp.ones(3))
    with pytest.raises(TypeError, match="weight and logits must have the same dtype"):
        cross_entropy_forward(logits, target, weight=xp.ones(4, dtype=xp.float32))
    with pytest.raises(ValueError, match=r"label_smoothing must be a float in \[0, 1\], got 1.5"):
        cross_entropy_forward(logits, target, label_smoothing=1.5)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        nll_loss_forward(logits, target, ignore_index=None)
    with pytest.raises(ValueError, match=r"grad_loss must have the loss's shape \(3,\) for reduction='none'"):
        cross_entropy_backward(xp.ones(()), logits, target, reduction="none")
    with pytest.raises(ValueError, match=r"grad_loss must have the loss's shape \(\) for reduction='mean'"):
        nll_loss_backward(xp.ones(3), target, (3, 4))
    with pytest.raises(TypeError, match="grad_loss and log_probs must have the same dtype"):
        cross_entropy_backward(xp.ones((), dtype=xp.float32), logits, target)
    with pytest.raises(ValueError, match=r"num_classes_shape must be log_probs' shape \(N, C\)"):
        nll_loss_backward(xp.ones(()), target, 4)
    with pytest.raises(ValueError, match="target must have shape"):
        nll_loss_backward(xp.ones(()), target, (5, 4))


@pytest.mark.parametrize("shape", [(40000, 10), (256, 5000)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_losses_large_shapes_match_numpy_twin(xp, rng, shape, reduction, dtype):
    """Rows beyond one pass of the grid, C of many lane steps, reductions over many rows per thread."""
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    n_rows, n_classes = shape
    logits, target, weight, grad_loss = draw_loss_problem(rng, n_rows, n_classes, True, False, reduction)
    target[rng.choice(n_rows, size=n_rows // 10, replace=False)] = -100
    logits, weight, grad_loss = (a.astype(dtype) for a in (logits, weight, grad_loss))
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    options = dict(weight=weight, label_smoothing=0.1, reduction=reduction)
    xp_options = {**options, "weight": xp.asarray(weight)}
    loss, log_probs = cross_entropy_forward(xp.asarray(logits), xp.asarray(target), **xp_options)
    loss_twin, log_probs_twin = cross_entropy_forward(logits, target, **options)
    assert_close(loss, loss_twin, **tol, name="loss")
    assert_close(log_probs, log_probs_twin, **tol, name="log_probs")
    grad = cross_entropy_backward(xp.asarray(grad_loss), log_probs, xp.asarray(target), **xp_options)
    assert_close(grad, cross_entropy_backward(grad_loss, log_probs_twin, target, **options), **tol, name="grad")
    nll_options = dict(weight=weight, reduction=reduction)
    xp_nll_options = {**nll_options, "weight": xp.asarray(weight)}
    assert_close(nll_loss_forward(log_probs, xp.asarray(target), **xp_nll_options),
                 nll_loss_forward(log_probs_twin, target, **nll_options), **tol, name="nll")
    assert_close(nll_loss_backward(xp.asarray(grad_loss), xp.asarray(target), shape, **xp_nll_options),
                 nll_loss_backward(grad_loss, target, shape, **nll_options), **tol, name="nll grad")


def test_out_of_range_target_raises_on_numpy_and_gives_nan_on_gpu(xp, rng):
    """NumPy checks the targets' range. The GPU skips that check (it would be a host synchronisation
    per call) and never reads out of bounds: the row comes out NaN, loss and gradient, and with the
    mean the NaN reaches the loss and, through the denominator, every row's gradient."""
    logits = xp.asarray(rng.standard_normal((3, 4)))
    if xp is np:
        with pytest.raises(ValueError, match=r"target must hold class indices in \[0, 4\) or ignore_index=-100, got 4"):
            cross_entropy_forward(logits, np.array([0, 4, 1]))
        with pytest.raises(ValueError, match="target must hold class indices .* got -1"):
            nll_loss_forward(logits, np.array([0, -1, 1]))
        with pytest.raises(ValueError, match="target must hold class indices"):
            cross_entropy_backward(np.ones(()), logits, np.array([0, 1, 9]))
        with pytest.raises(ValueError, match="target must hold class indices"):
            nll_loss_backward(np.ones(()), np.array([0, 1, 9]), (3, 4))
        return
    good = np.array([0, 2])  # rows 0 and 2 are valid, row 1 is not
    for bad_target, weight, label_smoothing in [(4, None, 0.0), (-1, np.array([0.5, 1.0, 2.0, 1.5]), 0.1)]:
        target = xp.asarray(np.array([0, bad_target, 1]))
        options = dict(weight=on(xp, weight), label_smoothing=label_smoothing)
        loss, log_probs = cross_entropy_forward(logits, target, reduction="none", **options)
        loss = to_numpy(loss)
        assert np.isnan(loss[1])
        assert_close(loss[good], reference_cross_entropy(to_numpy(logits)[good], np.array([0, 1]), weight=weight,
                                                         label_smoothing=label_smoothing, reduction="none"),
                     rtol=1e-12, atol=1e-14, name="valid rows")
        assert_close(log_probs, reference_log_softmax(to_numpy(logits), 1), rtol=1e-12, atol=1e-14)
        for reduction in ("mean", "sum"):
            assert np.isnan(to_numpy(cross_entropy_forward(logits, target, reduction=reduction, **options)[0]))
            assert np.isnan(to_numpy(nll_loss_forward(log_probs, target, weight=options["weight"],
                                                      reduction=reduction)))
        grad = to_numpy(cross_entropy_backward(xp.ones(3), log_probs, target, reduction="none", **options))
        assert np.all(np.isnan(grad[1])) and np.all(np.isfinite(grad[good]))
        grad = to_numpy(cross_entropy_backward(xp.ones(()), log_probs, target, reduction="sum", **options))
        assert np.all(np.isnan(grad[1])) and np.all(np.isfinite(grad[good]))
        assert np.all(np.isnan(to_numpy(cross_entropy_backward(xp.ones(()), log_probs, target, **options))))
        nll = to_numpy(nll_loss_forward(log_probs, target, weight=options["weight"], reduction="none"))
        assert np.isnan(nll[1]) and np.all(np.isfinite(nll[good]))
        nll_grad = to_numpy(nll_loss_backward(xp.ones(3), target, (3, 4), weight=options["weight"], reduction="none"))
        assert np.all(np.isnan(nll_grad[1])) and np.all(np.isfinite(nll_grad[good]))


@pytest.mark.parametrize("use_weight, ignore_some, label_smoothing, reduction", LOSS_CASES, ids=LOSS_IDS)
def test_losses_match_torch(xp, rng, use_weight, ignore_some, label_smoothing, reduction):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    logits, target, weight, grad_loss = draw_loss_problem(rng, 8, 5, use_weight, ignore_some, reduction)
    torch_weight = None if weight is None else torch.tensor(weight)
    z = torch.tensor(logits, requires_grad=True)
    expected = functional.cross_entropy(z, torch.tensor(target), weight=torch_weight, reduction=reduction,
                                        label_smoothing=label_smoothing)
    expected.backward(torch.tensor(grad_loss))
    options = dict(weight=on(xp, weight), label_smoothing=label_smoothing, reduction=reduction)
    loss, log_probs = cross_entropy_forward(xp.asarray(logits), xp.asarray(target), **options)
    grad = cross_entropy_backward(xp.asarray(grad_loss), log_probs, xp.asarray(target), **options)
    assert_close(loss, expected.detach().numpy(), rtol=1e-12, atol=1e-14, name="cross-entropy vs torch")
    assert_close(grad, z.grad.numpy(), rtol=1e-11, atol=1e-14, name="cross-entropy grad vs torch")

    lp = torch.tensor(to_numpy(log_probs), requires_grad=True)
    expected_nll = functional.nll_loss(lp, torch.tensor(target), weight=torch_weight, reduction=reduction)
    expected_nll.backward(torch.tensor(grad_loss))
    nll = nll_loss_forward(log_probs, xp.asarray(target), weight=options["weight"], reduction=reduction)
    nll_grad = nll_loss_backward(xp.asarray(grad_loss), xp.asarray(target), log_probs.shape, weight=options["weight"],
                                 reduction=reduction)
    assert_close(nll, expected_nll.detach().numpy(), rtol=1e-12, atol=1e-14, name="nll vs torch")
    assert_close(nll_grad, lp.grad.numpy(), rtol=1e-12, atol=1e-14, name="nll grad vs torch")


@pytest.mark.parametrize("name", list(SOFTMAXES))
def test_softmax_matches_torch(xp, rng, name):
    torch = pytest.importorskip("torch")
    forward, backward = SOFTMAXES[name][:2]
    x, dy = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 3))
    tx = torch.tensor(x, requires_grad=True)
    ty = (torch.softmax if name == "softmax" else torch.log_softmax)(tx, dim=1)
    ty.backward(torch.tensor(dy))
    y = forward(xp.asarray(x), axis=1)
    assert_close(y, ty.detach().numpy(), rtol=1e-12, atol=1e-14, name=f"{name} vs torch")
    assert_close(backward(xp.asarray(dy), y, axis=1), tx.grad.numpy(), rtol=1e-11, atol=1e-14,
                 name=f"{name} grad vs torch")
