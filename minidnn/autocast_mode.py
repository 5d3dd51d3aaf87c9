"""Autocast: inside ``with minidnn.autocast(device_type, dtype):`` the operations on its list run in a half
type (PyTorch's ``torch.autocast``, with a shorter list).

The half-precision list: ``conv2d``, ``linear`` and ``matmul`` (``@``). Their float32 tensor arguments on
the autocast's device are cast to the half type (a graph node each: the gradient is cast back, so float32
parameters get float32 gradients, the master weights), they run on the half-precision primitives (float32
sums, one rounding) and return half tensors. What follows them takes those half tensors as the
operation says (``Function.half_inputs`` in :mod:`minidnn.autograd`): batch norm, ReLU, ``add_relu``,
pooling and dropout compute in float and return the half type; every other operation (softmax, the losses,
reductions, arithmetic) widens a half input to float32 first and returns float32, where PyTorch keeps some
in the half type: ours rounds less. float64 tensors are never cast.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import numpy as np

from . import backend
from .primitives import convert

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype", "lower_precision"]

_DEVICE_TYPES = ("cuda", "cpu")


class _AutocastState(threading.local):
    def __init__(self) -> None:
        self.dtypes: dict[str, Any] = {}  # device type -> the half dtype its operations run in, while on


_state = _AutocastState()


def _half_dtype(dtype: Any) -> np.dtype:
    try:
        name = convert.half_type(dtype)
    except ValueError:
        raise TypeError(f"autocast: dtype must be minidnn.bfloat16 or minidnn.float16, got {dtype!r}") from None
    return convert.bfloat16() if name == "bfloat16" else np.dtype(np.float16)


class autocast:  # noqa: N801 - PyTorch's name
    """``with minidnn.autocast(device_type="cuda", dtype=minidnn.bfloat16):`` or as a decorator.

    ``device_type``: ``"cuda"`` or ``"cpu"``: only tensors on that device are cast. ``dtype``: the half type;
    PyTorch's defaults when None (float16 on ``"cuda"``, bfloat16 on ``"cpu"``). ``enabled=False`` switches
    autocast off inside (for a region that needs float32). Nested regions restore the outer one on exit.
    """

    def __init__(self, device_type: str, dtype: Any = None, enabled: bool = True) -> None:
        if device_type not in _DEVICE_TYPES:
            raise ValueError(f"autocast: device_type must be 'cuda' or 'cpu', got {device_type!r}")
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast: enabled must be a bool, got {enabled!r}")
        if dtype is None:
            dtype = np.float16 if device_type == "cuda" else convert.bfloat16()
        self.device_type, self.fast_dtype, self.enabled = device_type, _half_dtype(dtype), enabled
        self._outer: list[Any] = []

    def __enter__(self) -> "autocast":
        outer = _state.dtypes.get(self.device_type)
        self._outer.append(outer)
        if self.enabled:
            _state.dtypes[self.device_type] = self.fast_dtype
        elif outer is not None:  # switches an outer region off; with none, the state stays empty (the fast path)
            _state.dtypes[self.device_type] = None
        return self

    def __exit__(self, *exc_info: Any) -> None:
        outer = self._outer.pop()
        if outer is None:
            _state.dtypes.pop(self.device_type, None)
        else:
            _state.dtypes[self.device_type] = outer

    def __call__(self, function: Callable) -> Callable:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.device_type, self.fast_dtype, self.enabled):
                return function(*args, **kwargs)
        return run


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    return _state.dtypes.get(device_type) is not None


def get_autocast_dtype(device_type: str) -> Any:
    """The half dtype of the autocast region on ``device_type``, or None outside one."""
    if device_type not in _DEVICE_TYPES:
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    return _state.dtypes.get(device_type)


def lower_precision(*tensors: Any) -> tuple:
    """``tensors`` (None allowed) as an operation on the half-precision list takes them: inside an autocast
    region for the first one's device, each float32 or other-half-type tensor cast to the region's type;
    otherwise unchanged (one dictionary read)."""
    if not _state.dtypes:
        return tensors
    dtype = _state.dtypes.get("cuda" if backend.is_cuda_array(tensors[0].data) else "cpu")
    if dtype is None:
        return tensors
    return tuple(t if t is None or t.dtype == dtype or t.dtype == np.float64 or not t.is_floating_point()
                 else t.to(dtype) for t in tensors)
