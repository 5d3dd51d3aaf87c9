"""Argument checks shared by the primitives: each error names the argument and the expected form."""
from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from .. import backend
from . import layout

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


def check_float_or_half(array: Any, name: str) -> None:
    """``array`` must be float32, float64, or half-precision storage (float16; bfloat16 as ml_dtypes' dtype on
    the CPU, uint16 words on the GPU: primitives/convert.py)."""
    from . import convert  # noqa: PLC0415 - convert's own checks come from here

    dtype = getattr(array, "dtype", None)
    if dtype is not None and (dtype in FLOAT_DTYPES or convert.half_type_of(array) is not None):
        return
    raise TypeError(f"{name} must be a float32, float64, float16 or bfloat16 array, got "
                    f"{dtype if dtype is not None else type(array).__name__}")


def check_rank(array: Any, rank: int, name: str, layout: str) -> None:
    """``array`` must have ``rank`` dimensions laid out as ``layout`` (e.g. ``"(N, C, H, W)"``)."""
    if array.ndim != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(array.shape)}")


def check_same_dtype(a: Any, b: Any, name_a: str, name_b: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{name_a} and {name_b} must have the same dtype, got {a.dtype} and {b.dtype}")


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """A Python or NumPy integer (not a bool) in [minimum, maximum]; returns it as an int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return int(value)


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_real(value: Any, name: str, minimum: float | None = None, maximum: float | None = None,
               finite: bool = True) -> float:
    """A real number (not a bool), finite unless ``finite=False``, in [minimum, maximum]; returns a
    Python float (a NumPy float64 scalar would promote float32 results to float64)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if value != value or (finite and value in (float("inf"), float("-inf"))):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "-inf" if minimum is None else minimum
        high = "inf" if maximum is None else maximum
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return value


def normalise_axis(axis: Any, ndim: int, name: str) -> int:
    """``axis`` as a non-negative index of one of the ``ndim`` dimensions of ``name`` (negative counts
    from the end)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {name} with {ndim} dimension(s) "
                         f"(expected -{ndim} <= axis < {ndim})")
    return int(axis) % ndim


def check_like(a: Any, b: Any, name_a: str, name_b: str) -> None:
    """``a`` and ``b`` must be float arrays of one shape and one dtype (a gradient and its tensor)."""
    check_float(a, name_a)
    check_float(b, name_b)
    check_same_dtype(a, b, name_a, name_b)
    check_same_shape(a, b, name_a, name_b)


def check_gradient_part(part: Any, gradient: Any, name: str, gradient_name: str, half: bool = False) -> None:
    """``part``, a second part of ``gradient`` (of an output that fed two operations), must be a float array (with
    ``half``: or a half one) of the gradient's shape and dtype, on its device."""
    (check_float_or_half if half else check_float)(part, name)
    check_same_dtype(part, gradient, name, gradient_name)
    check_same_shape(part, gradient, name, gradient_name)
    backend.get_array_module(gradient, part)  # one device, or a clear ValueError


def check_same_shape(array: Any, like: Any, name: str, like_name: str) -> None:
    """``array`` must have the shape of ``like``."""
    if tuple(array.shape) != tuple(like.shape):
        raise ValueError(f"{name} must have {like_name}'s shape {tuple(like.shape)}, got {tuple(array.shape)}")


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

def check_dense(array: Any, name: str) -> None:
    """``array`` must be C-contiguous or channels-last (primitives/layout.py): a kernel walks it as a buffer."""
    if not (array.flags.c_contiguous or layout.is_channels_last(array)):
        raise ValueError(f"{name} must be a C-contiguous or channels-last array, got one with strides {array.strides}")


def check_contiguous(array: Any, name: str) -> None:
    """``array`` must be C-contiguous: a GPU kernel sees only its base pointer."""
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be a C-contiguous array, got one with strides {array.strides}")


def check_number(value: Any, name: str, in_range: Callable[[float], bool], expected: str) -> float:
    """A real number (not a bool) for which ``in_range`` holds; ``expected`` words the range for the error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not in_range(value):  # NaN fails every comparison, so it lands here too
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value
