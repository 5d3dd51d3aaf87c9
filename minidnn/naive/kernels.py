"""Launching the naive engine's own CUDA kernels (caffe_layers.cu beside this file; GPU only).

They compile through the primitives' one path, :func:`minidnn.primitives._cuda.function`, which
takes sources relative to ``minidnn/primitives``: :func:`~minidnn.primitives._cuda.package_source`
names this one. Every launch of the engine goes through :func:`launch`, so a test can count them.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..primitives import _cuda

SOURCE = _cuda.package_source("naive/caffe_layers.cu")


def launch(name: str, dtype: Any, count: int, args: Sequence[Any]) -> None:
    """Run kernel ``name``, compiled for ``dtype``, on ``count`` grid-stride threads; the arrays among
    ``args`` must be contiguous CuPy arrays and the scalars wrapped (``_cuda.i32``, ``_cuda.f64``)."""
    _cuda.launch(_cuda.function(SOURCE, name, dtype), count, args)
