"""The process group: which rank this process is, how many there are, and the collectives between them.

``init_process_group`` reads the rank and the world size from the environment the launcher sets (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), meets the other ranks through the rendezvous
store, and builds the backend: ``"nccl"`` (GPUs, through CuPy) or ``"tcp"`` (our CPU backend, NumPy arrays over
sockets). Both implement :class:`ProcessGroup`, so data-parallel training runs the same code on either.
"""
from __future__ import annotations

import datetime
import os
from typing import Any

import numpy as np

from ..autograd import Value, bump_version
from .group import ProcessGroup, ReduceOp, Work
from .store import TCPStore

__all__ = ["ReduceOp", "Work", "ProcessGroup", "init_process_group", "destroy_process_group", "is_initialized",
           "get_rank", "get_world_size", "get_backend", "all_reduce", "broadcast", "barrier", "default_group"]

DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)  # PyTorch's for NCCL: a collective that takes longer is a hang

_default: ProcessGroup | None = None
_store: TCPStore | None = None


def _environment(name: str, given: Any, default: Any = None) -> Any:
    if given is not None and given != -1:
        return given
    value = os.environ.get(name)
    if value is None:
        if default is not None:
            return default
        raise ValueError(f"init_process_group: the environment variable {name} is not set; start the script with "
                         f"python -m minidnn.distributed.run, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
    return value


def _int_at_least(name: str, value: Any, low: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or number < low:
        raise ValueError(f"init_process_group: {name} must be an integer >= {low}, got {value!r}")
    return number


def _seconds(timeout: Any) -> float:
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"init_process_group: timeout must be a datetime.timedelta or a positive number of seconds, "
                         f"got {timeout!r}")
    return float(timeout)


def init_process_group(backend: str = "nccl", init_method: str | None = None,
                       timeout: "datetime.timedelta | float" = DEFAULT_TIMEOUT, world_size: int = -1, rank: int = -1,
                       store: TCPStore | None = None, device_id: int | None = None) -> None:
    """Join the job's default process group.

    ``backend``: ``"nccl"`` (one GPU per process, through CuPy's NCCL) or ``"tcp"`` (our CPU backend; it also takes
    GPU arrays, through the host). ``init_method``: ``None`` or ``"env://"`` (``MASTER_ADDR``/``MASTER_PORT`` from
    the environment) or ``"tcp://host:port"``. ``rank``, ``world_size``: from ``RANK``/``WORLD_SIZE`` unless given.
    ``store``: a :class:`TCPStore` to meet through instead. ``timeout``: how long a collective (or the
    rendezvous) may take before it is declared hung and the job stopped. ``device_id`` (NCCL): the GPU this process
    drives, ``LOCAL_RANK`` by default; it becomes CuPy's current device.
    """
    global _default, _store
    if _default is not None:
        raise RuntimeError("trying to initialize the default process group twice; call destroy_process_group() first")
    if backend not in _BACKENDS:
        raise ValueError(f"init_process_group: backend must be one of {sorted(_BACKENDS)}, got {backend!r}")
    seconds = _seconds(timeout)
    rank = _int_at_least("rank (RANK)", _environment("RANK", rank), 0)
    world_size = _int_at_least("world_size (WORLD_SIZE)", _environment("WORLD_SIZE", world_size), 1)
    if rank >= world_size:
        raise ValueError(f"init_process_group: rank must be < world_size, got rank {rank} of world size {world_size}")
    if store is None:
        if init_method in (None, "env://"):
            host = _environment("MASTER_ADDR", None)
            port = _int_at_least("MASTER_PORT", _environment("MASTER_PORT", None), 1)
        elif isinstance(init_method, str) and init_method.startswith("tcp://"):
            host, _, port_text = init_method[len("tcp://"):].rpartition(":")
            port = _int_at_least("the port of init_method", port_text, 1)
        else:
            raise ValueError(f"init_process_group: init_method must be None, 'env://' or 'tcp://host:port', "
                             f"got {init_method!r}")
        store = _store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=seconds)
    local_rank = _int_at_least("LOCAL_RANK", os.environ.get("LOCAL_RANK", rank), 0)
    try:
        _default = _BACKENDS[backend](store, rank, world_size, seconds,
                                      local_rank if device_id is None else _int_at_least("device_id", device_id, 0))
    except BaseException:
        if _store is not None:  # ours: close it, so that a second attempt can listen on the port again
            _store.close()
            _store = None
        raise


def default_group() -> ProcessGroup:
    """The default process group, or PyTorch's ``ValueError`` when there is none."""
    if _default is None:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    return _default


def is_initialized() -> bool:
    return _default is not None


def get_rank(group: ProcessGroup | None = None) -> int:
    return (group or default_group()).rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    return (group or default_group()).size


def get_backend(group: ProcessGroup | None = None) -> str:
    return (group or default_group()).name


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Leave the default group (close its connections and the store); ``init_process_group`` may then run again."""
    global _default, _store
    group = group or _default
    if group is None:
        return
    try:
        group.shutdown()
    finally:
        if group is _default:
            _default = None
            if _store is not None:
                _store.close()
                _store = None


def _array_of(tensor: Any) -> Any:
    return tensor.data if isinstance(tensor, Value) else tensor


def _complete(work: Work, tensor: Any, operation: str, async_op: bool) -> Work | None:
    """What every in-place collective ends with: a Tensor's version counts the write (autograd must see
    it); then the Work, or a wait for it."""
    if isinstance(tensor, Value):
        bump_version(tensor, operation)
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(tensor: Any, op: "ReduceOp | str" = ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """Combine ``tensor`` (a Tensor or an array) across the ranks, in place: every rank ends with the same result.
    Returns a :class:`Work` with ``async_op=True`` (keep ``tensor`` alive and unread until it is waited on)."""
    group = group or default_group()
    op = ReduceOp(op) if isinstance(op, str) else op
    if not isinstance(op, ReduceOp):
        raise TypeError(f"all_reduce: op must be a ReduceOp or one of 'sum', 'avg', 'max', 'min', got {op!r}")
    array = _array_of(tensor)
    group.check_array(array, "all_reduce")
    if op is ReduceOp.AVG and array.dtype.kind != "f":
        raise TypeError(f"all_reduce: ReduceOp.AVG needs a floating-point array, got {array.dtype}")
    return _complete(group.all_reduce(array, op), tensor, "all_reduce", async_op)


def broadcast(tensor: Any, src: int, group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Copy rank ``src``'s ``tensor`` into every rank's ``tensor`` (same shape and dtype everywhere), in place."""
    group = group or default_group()
    if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or not 0 <= src < group.size:
        raise ValueError(f"broadcast: src must be a rank in 0..{group.size - 1}, got {src!r}")
    array = _array_of(tensor)
    group.check_array(array, "broadcast")
    return _complete(group.broadcast(array, int(src)), tensor, "broadcast", async_op)


def barrier(group: ProcessGroup | None = None) -> None:
    """Return once every rank has called it (the GPU work queued before it included, on NCCL)."""
    (group or default_group()).barrier()


def _tcp(store: TCPStore, rank: int, size: int, timeout: float, device_id: int) -> ProcessGroup:
    from .tcp import TcpProcessGroup  # noqa: PLC0415 - each backend loads with its first use

    return TcpProcessGroup(store, rank, size, timeout)


def _nccl(store: TCPStore, rank: int, size: int, timeout: float, device_id: int) -> ProcessGroup:
    from .nccl import NcclProcessGroup  # noqa: PLC0415 - CuPy is needed only here

    return NcclProcessGroup(store, rank, size, timeout, device_id)


_BACKENDS = {"tcp": _tcp, "nccl": _nccl}
