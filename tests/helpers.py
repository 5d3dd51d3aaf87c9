"""Test helpers: device transfer, tolerances and central-difference gradients."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minidnn import backend


def to_numpy(array: Any) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return backend.to_device(array, "cpu")


def assert_close(actual: Any, expected: Any, rtol: float = 1e-10, atol: float = 1e-12, name: str = "") -> None:
    actual, expected = to_numpy(actual), to_numpy(expected)
    assert actual.shape == expected.shape, f"{name} shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name)


def numerical_gradient(f: Callable[..., Any], inputs: list[np.ndarray], index: int, weights: np.ndarray,
                       eps: float = 1e-6) -> np.ndarray:
    """∂/∂inputs[index] of sum(f(*inputs) · weights) by central differences, in float64 on NumPy.

    ``f`` maps NumPy arrays to one NumPy array. Cost: two calls of ``f`` per input element, so keep
    the perturbed input small.
    """
    inputs = [np.array(a, dtype=np.float64, copy=True) if i == index else a for i, a in enumerate(inputs)]
    x = inputs[index]
    grad = np.zeros_like(x)
    flat, grad_flat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        original = flat[i]
        flat[i] = original + eps
        plus = np.sum(np.asarray(f(*inputs)) * weights)
        flat[i] = original - eps
        minus = np.sum(np.asarray(f(*inputs)) * weights)
        flat[i] = original
        grad_flat[i] = (plus - minus) / (2 * eps)
    return grad
