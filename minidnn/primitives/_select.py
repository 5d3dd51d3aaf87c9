"""Branch-free element selection for the NumPy code: ``np.where`` results, computed on the values' bits.

``np.where(mask, a, b)`` branches on every element, and the masks of a training step (ReLU gates, a
running maximum's "better" flags) are close to random, so the branch mispredicts about half the time.
Selecting through the bit patterns instead (b ^ ((a ^ b) & all-ones-where-mask)) is a few
vectorised integer passes with no branch, and it is exact: each result is one of the inputs' values,
bit for bit, signed zeros and NaN payloads included. NumPy arrays of one float dtype only; the GPU
code has its own kernels.
"""
from __future__ import annotations

import numpy as np

# The unsigned integer type of each float type's width: the view the bit operations run on.
_BITS = {np.dtype(np.float16): np.dtype(np.uint16), np.dtype(np.float32): np.dtype(np.uint32),
         np.dtype(np.float64): np.dtype(np.uint64)}


def _all_ones_where(mask: np.ndarray, bits: np.dtype) -> np.ndarray:
    """A new C-contiguous array of ``bits`` with every bit set where ``mask`` is True, else 0 (mask's shape)."""
    ones = mask.astype(bits)
    np.negative(ones, out=ones)  # 1 -> all ones (unsigned wrap-around), 0 -> 0
    return ones


def where_or_zero(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.where(mask, values, 0)`` (+0.0 where the mask is False) as a new array of values' shape and dtype.

    ``mask``: a boolean array of values' shape. A dtype without a bit view here takes ``np.where``.
    """
    bits = _BITS.get(values.dtype)
    if bits is None or mask.shape != values.shape:
        return np.where(mask, values, np.zeros((), dtype=values.dtype))
    selected = _all_ones_where(mask, bits)
    np.bitwise_and(selected, np.ascontiguousarray(values).view(bits), out=selected)
    return selected.view(values.dtype)


def select(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.where(mask, a, b)`` for a, b and mask of one shape (a and b of one dtype), as a new array."""
    bits = _BITS.get(a.dtype)
    if bits is None or a.dtype != b.dtype or not (mask.shape == a.shape == b.shape):
        return np.where(mask, a, b)
    b_bits = np.ascontiguousarray(b).view(bits)
    selected = _all_ones_where(mask, bits)
    selected &= np.bitwise_xor(np.ascontiguousarray(a).view(bits), b_bits)
    selected ^= b_bits
    return selected.view(a.dtype)
