"""What every backend of the process group implements (:class:`ProcessGroup`), the reductions it offers
(:class:`ReduceOp`) and the handle of a collective in flight (:class:`Work`). The backends (:mod:`.nccl`,
:mod:`.tcp`) build on this module alone; :mod:`.process_group` chooses among them.
"""
from __future__ import annotations

import enum
from typing import Any

import numpy as np

from .. import backend

__all__ = ["ReduceOp", "Work", "ProcessGroup"]


class ReduceOp(enum.Enum):
    """How :func:`all_reduce` combines the ranks' arrays (PyTorch's names). ``AVG``: the sum over the world size,
    floating-point arrays only."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"


class Work:
    """A collective in flight, as an ``async_op=True`` call returns it.

    ``wait()``: on the CPU, block until the collective has finished (raising its error, if any); on the GPU, make the
    current stream wait for it (the host does not block: later kernels queue behind it). ``is_completed()``: whether
    it has finished. A finished collective's Work waits at once.
    """

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class ProcessGroup:
    """What a backend implements: ``rank``, ``size`` (the world size), ``name``, ``device`` (the device its arrays
    must be on; None: any) and collectives on contiguous arrays, in place, each returning a :class:`Work`. Every
    rank must call the same collectives in the same order with arrays of the same size and dtype: a backend runs
    them in the order they were called."""

    name = "?"
    rank: int
    size: int
    device: backend.Device | None

    def all_reduce(self, array: Any, op: ReduceOp = ReduceOp.SUM) -> Work:
        raise NotImplementedError

    def broadcast(self, array: Any, src: int = 0) -> Work:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Release the connections, once every rank is done with the group."""

    def check_array(self, array: Any, operation: str) -> None:
        if not isinstance(array, np.ndarray) and not backend.is_cuda_array(array):
            raise TypeError(f"{operation}: expected a Tensor or a NumPy/CuPy array, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{operation}: the array must be C-contiguous (the collective works on its memory "
                             "in place); pass array.copy() and copy the result back")
