"""Which library computes the operations: minidnn's primitives (the default) or the naive engine.

:mod:`minidnn.functional` and :mod:`minidnn.optim` call ``P.<function>``, where ``P`` forwards to
the current engine, so the same model code runs on either; the benchmark switches engines to
compare them in one process.
"""
from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any, Iterator

ENGINES = {"minidnn": "minidnn.primitives", "naive": "minidnn.naive"}
_current = "minidnn"


def get_engine() -> str:
    return _current


def set_engine(name: str) -> None:
    """Select ``"minidnn"`` (the primitives library) or ``"naive"`` (Caffe-style baseline) for every later op."""
    global _current
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {name!r}")
    _current = name


@contextlib.contextmanager
def engine(name: str) -> Iterator[None]:
    """``with minidnn.engine("naive"): ...`` runs the block on that engine."""
    before = _current
    set_engine(name)
    try:
        yield
    finally:
        set_engine(before)


def current() -> ModuleType:
    return importlib.import_module(ENGINES[_current])


class _CurrentEngine:
    """``P.conv2d_forward`` is the current engine's ``conv2d_forward``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(current(), name)


P = _CurrentEngine()
