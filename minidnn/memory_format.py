"""Memory formats, PyTorch's names: ``contiguous_format`` (NCHW in memory), ``channels_last`` (NHWC in memory,
the shape still (N, C, H, W)) and ``preserve_format`` (keep the tensor's own), for ``Tensor.to``,
``Tensor.contiguous``, ``Tensor.is_contiguous`` and ``Module.to``. The layouts themselves are the arrays'
strides: primitives/layout.py.
"""
from __future__ import annotations

from typing import Any

from .primitives import layout


class memory_format:  # noqa: N801 - PyTorch's name (torch.memory_format)
    """One memory format; compare with ``is``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"minidnn.{self.name}"


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
preserve_format = memory_format("preserve_format")
FORMATS = (contiguous_format, channels_last, preserve_format)


def check(value: Any, name: str = "memory_format", allowed: tuple = FORMATS) -> memory_format:
    """``value`` when it is one of ``allowed``, else a TypeError naming them."""
    if not any(value is f for f in allowed):
        raise TypeError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def check_rank(shape: tuple, wanted: memory_format) -> None:
    """channels_last needs a 4-D (N, C, H, W) tensor."""
    if wanted is channels_last and len(shape) != 4:
        raise ValueError(f"memory_format=minidnn.channels_last needs a 4-D (N, C, H, W) tensor, got shape "
                         f"{tuple(shape)}")


def lay_out(array: Any, wanted: memory_format) -> Any:
    """A 4-D floating array in ``wanted`` (itself when it already is, or when ``wanted`` is preserve_format);
    any other array as it is: what ``Module.to(memory_format=...)`` does to each parameter and buffer."""
    if wanted is preserve_format or getattr(array, "ndim", 0) != 4 or array.dtype.kind != "f":
        return array
    return layout.like(array, wanted is channels_last)
