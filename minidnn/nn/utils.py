"""Gradient clipping with PyTorch's names and results (``torch.nn.utils``): the total norm of all
gradients seen as one vector, scaling them in place to at most ``max_norm``, or clamping each value.

Everything is computed with tensor operations outside the graph (``no_grad``), so it runs on the
gradients' own devices; the total norm comes back as a 0-d tensor, as PyTorch returns it, which a
training loop can log or test for NaN.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

import numpy as np

from ..autograd import no_grad
from ..tensor import Tensor, cat, tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_"]

TensorOrTensors = "Tensor | Iterable[Tensor]"


def _as_list(tensors: Any, name: str) -> list[Tensor]:
    items = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    for item in items:
        if not isinstance(item, Tensor):
            raise TypeError(f"{name} must be a Tensor or an iterable of Tensors, got an element of type "
                            f"{type(item).__name__}")
    return items


def _norm_type(norm_type: Any) -> float:
    """p of the p-norm: a number > 0, or inf (also the string 'inf', as PyTorch takes it)."""
    try:
        value = float(norm_type)
    except (TypeError, ValueError):
        raise TypeError(f"norm_type must be a number > 0 or 'inf', got {norm_type!r}") from None
    if isinstance(norm_type, bool) or not value > 0:  # NaN fails the comparison too
        raise ValueError(f"norm_type must be a number > 0 or 'inf', got {norm_type!r}")
    return value


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def _vector_norm(values: Tensor, p: float) -> Tensor:
    """‖values‖_p of all elements, a 0-d tensor (0 for no elements)."""
    if values.numel() == 0:
        return tensor(0.0, dtype=values.dtype, device=values.device)
    if p == math.inf:
        return values.abs().max()
    if p == 2.0:
        return (values * values).sum().sqrt()
    if p == 1.0:
        return values.abs().sum()
    return (values.abs() ** p).sum() ** (1.0 / p)


def get_total_norm(tensors: TensorOrTensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: bool | None = None) -> Tensor:
    """The p-norm of ``tensors`` as if they were concatenated into one vector: the norm of their norms.

    A 0-d tensor on the first tensor's device (0.0 for no tensors). ``error_if_nonfinite``: a NaN or
    infinite norm raises ``RuntimeError``, as in PyTorch. ``foreach`` is accepted for PyTorch's
    signature; there is one implementation.
    """
    tensors = _as_list(tensors, "tensors")
    p = _norm_type(norm_type)
    if not tensors:
        return tensor(0.0)
    first = tensors[0].device
    with no_grad():
        norms = [_vector_norm(t.detach(), p).to(first).reshape(1) for t in tensors]
        total = _vector_norm(cat(norms), p)
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"The total norm of order {p} for gradients from `parameters` is non-finite, so it cannot "
                           "be clipped. To disable this error and scale the gradients by the non-finite norm anyway, "
                           "set `error_if_nonfinite=False`")
    return total


def clip_grads_with_norm_(parameters: TensorOrTensors, max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """Scale every gradient in place by min(max_norm / (total_norm + 1e-6), 1): only ever down."""
    max_norm = _real(max_norm, "max_norm")
    grads = [p.grad for p in _as_list(parameters, "parameters") if p.grad is not None]
    if not grads:
        return
    # A non-finite total norm scales by NaN (or 0) without a word, as in PyTorch: NumPy's warning is silenced.
    with no_grad(), np.errstate(invalid="ignore"):
        scale = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.device))


def clip_grad_norm_(parameters: TensorOrTensors, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Clip the gradients of ``parameters`` (a tensor or an iterable of them; those without a gradient
    are skipped) in place so that their total ``norm_type``-norm is at most ``max_norm``, and return
    that total norm before clipping, a 0-d tensor, as ``torch.nn.utils.clip_grad_norm_`` does:
    ``get_total_norm`` then ``clip_grads_with_norm_``."""
    parameters = _as_list(parameters, "parameters")
    max_norm = _real(max_norm, "max_norm")
    grads = [p.grad for p in parameters if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


def clip_grad_value_(parameters: TensorOrTensors, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` in place to [−clip_value, clip_value]."""
    clip_value = _real(clip_value, "clip_value")
    with no_grad():
        for p in _as_list(parameters, "parameters"):
            if p.grad is not None:
                p.grad.copy_(p.grad.clamp(-clip_value, clip_value))
