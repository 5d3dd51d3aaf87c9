"""Argument checks shared by the primitives: each error names the argument and the expected form."""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def pair(value: Any, name: str, minimum: int = 0) -> tuple[int, int]:
    """``3 -> (3, 3)``, ``(2, 3) -> (2, 3)``; integers at least ``minimum``, else a clear error."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(values) != 2 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(values[0]), int(values[1])


def check_float(array: Any, name: str) -> None:
    """``array`` must be a float32 or float64 array."""
    dtype = getattr(array, "dtype", None)
    # `dtype is None` first: NumPy compares np.dtype("float64") == None as True.
    if dtype is None or dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float32 or float64 array, got {dtype if dtype is not None else type(array).__name__}")


def check_rank(array: Any, rank: int, name: str, layout: str) -> None:
    """``array`` must have ``rank`` dimensions laid out as ``layout`` (e.g. ``"(N, C, H, W)"``)."""
    if array.ndim != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(array.shape)}")


def check_same_dtype(a: Any, b: Any, name_a: str, name_b: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{name_a} and {name_b} must have the same dtype, got {a.dtype} and {b.dtype}")


def check_same_shape(a: Any, b: Any, name_a: str, name_b: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def check_bool(value: Any, name: str) -> bool:
    """``value`` must be a bool (Python's or NumPy's; not 0 or 1); returns it as a Python bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_out(out: Any, like: Any, like_name: str) -> None:
    """``out``, an output buffer given by the caller, must be a C-contiguous array of ``like``'s shape and
    dtype (kernels write through its base pointer); ``out is like`` asks for the operation in place."""
    dtype = getattr(out, "dtype", None)
    # `dtype is None` first: NumPy compares np.dtype("float64") == None as True.
    if dtype is None or dtype != like.dtype or tuple(out.shape) != tuple(like.shape) or not out.flags.c_contiguous:
        layout = "" if dtype is None or out.flags.c_contiguous else "non-contiguous "
        got = type(out).__name__ if dtype is None else f"{layout}{dtype} {tuple(out.shape)}"
        raise ValueError(f"out must be a C-contiguous {like.dtype} array of {like_name}'s shape {tuple(like.shape)}, "
                         f"got {got}")
