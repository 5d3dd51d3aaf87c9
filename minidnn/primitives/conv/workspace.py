"""The workspace an eager GPU convolution runs in: one buffer per device and stream, kept between calls.
A step then allocates no workspace, and an algorithm keeps the typed views it carves from the buffer
(:func:`carved`) instead of carving them again every call. Captured calls and CPU calls allocate their own.

Convolutions on one stream run one after another, so one buffer serves them all, as cuDNN's users share
one workspace: it grows to the largest plan's workspace and stays at that size. A buffer that grows is
freed on the stream that used it, so CuPy's pool hands its memory out again only behind that work. A call
being captured into a CUDA graph gets a buffer of its own from the graph's pool: the graph keeps reading
it at every replay, which a shared buffer replaced by a larger one would not survive.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np

from ... import backend

# (device index, stream pointer) -> the buffer; id(buffer) -> {key: views carved from it}.
_buffers: dict[tuple[int, int], Any] = {}
_views: dict[int, dict] = {}
_per_call = False  # per_call(): every call allocates its own, as while capturing


def workspace(nbytes: int) -> Any:
    """A uint8 GPU array of at least ``nbytes`` bytes (``nbytes`` > 0) for a call on the current stream:
    the stream's shared buffer, or a fresh one while the stream is being captured (or inside per_call)."""
    cupy = backend.cupy()
    stream = cupy.cuda.get_current_stream()
    if _per_call or stream.is_capturing():
        return cupy.empty(nbytes, dtype=np.uint8)
    key = (cupy.cuda.runtime.getDevice(), stream.ptr)
    buffer = _buffers.get(key)
    if buffer is None or buffer.size < nbytes:
        if buffer is not None:  # let the smaller one go, and the views that hold it
            del _buffers[key]
            _views.pop(id(buffer), None)
        buffer = cupy.empty(nbytes, dtype=np.uint8)  # a MemoryError here is the caller's to handle
        _buffers[key] = buffer
        _views[id(buffer)] = {}
    return buffer


def carved(buffer: Any, key: tuple, carve: Callable[[], Any]) -> Any:
    """``carve()``'s views of ``buffer``, made once per ``key`` while ``buffer`` is a shared workspace; for
    any other buffer (a CPU one, a graph's, an arena) ``carve()`` every call."""
    views = _views.get(id(buffer)) if buffer is not None else None
    if views is None:
        return carve()
    found = views.get(key)
    if found is None:
        found = views[key] = carve()
    return found


def release() -> None:
    """Drop every shared buffer and its views (their memory goes back to CuPy's pool)."""
    _buffers.clear()
    _views.clear()


@contextlib.contextmanager
def per_call() -> Iterator[None]:
    """Inside the block every call gets a buffer of its own, as a captured call does: a step recorded for a
    captured step's memory plan (:mod:`minidnn.cuda.memory_plan`) then allocates as the capture will."""
    global _per_call
    before, _per_call = _per_call, True
    try:
        yield
    finally:
        _per_call = before
