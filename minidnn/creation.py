"""Tensor factories (``zeros``, ``randn``, ...) with PyTorch's signatures; float32 by default; and
``from_numpy``, a tensor on a NumPy array's own memory."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import backend
from .primitives import convert
from .tensor import Tensor, as_dtype, storage_dtype
from .random import default_generator


def _shape(size: tuple[Any, ...]) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    if not all(isinstance(n, (int, np.integer)) and n >= 0 for n in size):
        raise ValueError(f"size must be non-negative ints, got {size!r}")
    return tuple(int(n) for n in size)


def _make(array: np.ndarray, dtype: Any, device: Any, requires_grad: bool) -> Tensor:
    array = array.astype(np.float32 if dtype is None else as_dtype(dtype), copy=False)
    if device is not None:
        array = convert.to_device(array, device)
    return Tensor(array, requires_grad=requires_grad)


def _filled(size: tuple, value: float, dtype: Any, device: Any, requires_grad: bool) -> Tensor:
    """A constant array made on its device (no host array copied over: a model may make these inside
    a training step, even one captured as a CUDA graph)."""
    xp = np if device is None or backend.device(device).type == "cpu" else backend.cupy()
    dtype = np.float32 if dtype is None else as_dtype(dtype)
    with backend.on_device(device or "cpu"):
        if storage_dtype(dtype, xp) != dtype:  # the GPU's bfloat16 words, rounded from float32
            array = convert.cast(xp.full(_shape(size), value, dtype=np.float32), dtype)
        else:
            array = xp.full(_shape(size), value, dtype=dtype)
    return Tensor(array, requires_grad=requires_grad)


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return _filled(size, 0, dtype, device, requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return _filled(size, 1, dtype, device, requires_grad)


def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)


def full(size: Any, fill_value: float, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return _filled((size,), fill_value, dtype, device, requires_grad)


def zeros_like(other: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return zeros(other.shape, dtype=dtype or other.dtype, device=other.device, requires_grad=requires_grad)


def ones_like(other: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return ones(other.shape, dtype=dtype or other.dtype, device=other.device, requires_grad=requires_grad)


def rand(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Uniform [0, 1) from the global generator (drawn on the host, so equal on every device)."""
    return _make(default_generator.numpy.random(_shape(size)), dtype, device, requires_grad)


def randn(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Standard normal from the global generator (drawn on the host, so equal on every device)."""
    return _make(default_generator.numpy.standard_normal(_shape(size)), dtype, device, requires_grad)


def arange(start: float, end: float | None = None, step: float = 1, dtype: Any = None, device: Any = None) -> Tensor:
    """Like PyTorch: int64 when all arguments are ints, else float32."""
    values = np.arange(start, end, step) if end is not None else np.arange(start)
    if dtype is None:
        dtype = np.int64 if values.dtype.kind in "iu" else np.float32
    return _make(values, dtype, device, False)


def from_numpy(array: np.ndarray) -> Tensor:
    """A CPU tensor on ``array``'s own memory, as ``torch.from_numpy``: no copy, the array's dtype kept
    (float64 stays float64), and a change through either one shows in the other. ``array`` must be a
    NumPy array of a supported dtype; negative strides are refused, as PyTorch refuses them."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(array).__name__}")
    as_dtype(array.dtype)  # a clear TypeError for unsupported dtypes (complex, strings, objects)
    if any(stride < 0 for stride in array.strides):
        raise ValueError("from_numpy: at least one stride of the array is negative; pass array.copy()")
    return Tensor(array)
