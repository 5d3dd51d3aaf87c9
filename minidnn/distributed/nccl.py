"""The ``"nccl"`` backend: collectives between GPUs through NCCL, as CuPy exposes it (``cupy.cuda.nccl``).

One process drives one GPU. Rank 0 draws NCCL's unique id and publishes it through the rendezvous store; every rank
then joins the communicator. All of the group's collectives run on one communication stream, in the order they were
called (the same on every rank, as NCCL requires; on one stream none can overtake another):
each waits for the work queued so far on the caller's stream (an event), and ``Work.wait()`` makes the caller's
stream wait for it in turn, so the host never blocks and the collective overlaps whatever the caller queues next.
The same calls are legal under CUDA-graph capture: the communication stream joins the capture through the first
event and is joined back by the wait.

A watchdog thread follows every collective issued outside a capture: one not finished after ``timeout`` seconds (a
peer died or hangs), or an asynchronous NCCL error, aborts the communicator and ends the process with a message,
since a rank stuck in a kernel cannot raise; the launcher then stops the job.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Any

import numpy as np

from .. import backend
from .group import ProcessGroup, ReduceOp, Work
from .store import TCPStore

__all__ = ["NcclProcessGroup", "nccl_dtype"]

WATCHDOG_EXIT_CODE = 1
_WATCHDOG_PERIOD = 0.1  # seconds between the watchdog's looks at the oldest collective


def nccl_dtype(dtype: np.dtype) -> int:
    """NCCL's code for ``dtype``, or a ``TypeError`` naming the dtypes NCCL reduces."""
    from cupy.cuda import nccl  # noqa: PLC0415

    codes = {"int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8, "int32": nccl.NCCL_INT32, "uint32": nccl.NCCL_UINT32,
             "int64": nccl.NCCL_INT64, "uint64": nccl.NCCL_UINT64, "float16": nccl.NCCL_FLOAT16,
             "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64, "bfloat16": nccl.NCCL_BFLOAT16}
    code = codes.get(np.dtype(dtype).name)
    if code is None:
        raise TypeError(f"nccl: cannot reduce arrays of dtype {np.dtype(dtype)}; NCCL reduces {', '.join(codes)}")
    return code


class NcclWork(Work):
    """A collective queued on the communication stream: ``done`` is recorded after it."""

    def __init__(self, done: Any, array: Any, description: str, captured: bool) -> None:
        self.done, self.array, self.description, self.captured = done, array, description, captured
        self.started = time.monotonic()

    def wait(self, timeout: float | None = None) -> bool:
        backend.cupy().cuda.get_current_stream().wait_event(self.done)
        return True

    def is_completed(self) -> bool:
        # An event recorded under capture is a graph node, not something to query.
        return True if self.captured else bool(self.done.done)


def _unique_id_argument(nccl: Any, raw: bytes) -> Any:
    """NCCL's unique id in the form this CuPy's NcclCommunicator takes, told apart by the type get_unique_id
    returns: the bytes themselves (CuPy 14), or, in older releases, a tuple of C chars (signed here; the
    caller retries unsigned where char is unsigned, as on ARM)."""
    if isinstance(nccl.get_unique_id(), (bytes, bytearray)):
        return bytes(raw)
    return tuple(v - 256 if v > 127 else v for v in raw)


class NcclProcessGroup(ProcessGroup):
    """The ``"nccl"`` backend: see the module's docstring. ``device_id``: the GPU this rank drives."""

    name = "nccl"

    def __init__(self, store: TCPStore, rank: int, size: int, timeout: float, device_id: int) -> None:
        cupy = backend.cupy()
        from cupy.cuda import nccl  # noqa: PLC0415

        count = cupy.cuda.runtime.getDeviceCount()
        if device_id >= count:
            raise ValueError(f"nccl: rank {rank} would drive GPU {device_id} (LOCAL_RANK), but this machine shows "
                             f"{count}; start at most {count} processes per node")
        cupy.cuda.Device(device_id).use()  # the primitives launch on the current device
        self.rank, self.size, self.timeout = rank, size, timeout
        self.device = backend.Device("cuda", device_id)
        self._nccl = nccl
        if rank == 0:
            store.set("nccl/unique_id", bytes(value & 0xFF for value in nccl.get_unique_id()))
        raw = store.get("nccl/unique_id")
        # Meet in the store first: a rank that never comes is then a timeout with a message, not a hang in NCCL.
        store.add("nccl/joined", 1)
        store.wait_for_count("nccl/joined", size)
        try:
            self.comm = nccl.NcclCommunicator(size, _unique_id_argument(nccl, raw), rank)
        except OverflowError:  # a tuple of unsigned chars (char is unsigned on ARM)
            self.comm = nccl.NcclCommunicator(size, tuple(raw), rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # ncclAvg exists from NCCL 2.10; before it, AVG is a sum divided on the communication stream.
        self._has_avg = nccl.get_version() >= 21000
        self._sequence = 0
        self._pending: collections.deque = collections.deque()
        self._captured: list[NcclWork] = []  # their events are nodes of a graph: kept as long as the group
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name=f"minidnn-nccl-watchdog-rank{rank}", daemon=True)
        self._watchdog.start()

    # --- issuing ----------------------------------------------------------------------------------
    def _issue(self, array: Any, description: str, call: Any) -> NcclWork:
        cupy = backend.cupy()
        if not backend.is_cuda_array(array) or array.device.id != self.device.index:
            raise ValueError(f"nccl: {description} needs an array on {self.device} (this rank's GPU), got one on "
                             f"{backend.device_of(array)}")
        caller = cupy.cuda.get_current_stream()
        captured = caller.is_capturing()
        ready = cupy.cuda.Event(disable_timing=True)
        ready.record(caller)
        self.stream.wait_event(ready)
        call(self.stream)
        done = cupy.cuda.Event(disable_timing=True)
        done.record(self.stream)
        work = NcclWork(done, array, f"#{self._sequence} {description}", captured)
        self._sequence += 1
        if captured:
            work.ready = ready
            self._captured.append(work)
        else:
            with self._lock:
                self._pending.append(work)  # holds the array until the collective is over (its memory stays put)
        return work

    def all_reduce(self, array: Any, op: ReduceOp = ReduceOp.SUM) -> Work:
        nccl = self._nccl
        code = {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.AVG: nccl.NCCL_AVG if self._has_avg else nccl.NCCL_SUM,
                ReduceOp.MAX: nccl.NCCL_MAX, ReduceOp.MIN: nccl.NCCL_MIN}[op]
        dtype = nccl_dtype(array.dtype)
        divide = op is ReduceOp.AVG and not self._has_avg

        def call(stream: Any) -> None:
            self.comm.allReduce(array.data.ptr, array.data.ptr, array.size, dtype, code, stream.ptr)
            if divide:  # in place, on the communication stream (``array /= ...`` would make array local here)
                with stream:
                    backend.cupy().divide(array, self.size, out=array)

        return self._issue(array, f"all_reduce {op.name} of {array.size} {array.dtype}", call)

    def broadcast(self, array: Any, src: int = 0) -> Work:
        def call(stream: Any) -> None:
            # As bytes: a broadcast copies memory, whatever the dtype.
            self.comm.broadcast(array.data.ptr, array.data.ptr, array.nbytes, self._nccl.NCCL_UINT8, src, stream.ptr)

        return self._issue(array, f"broadcast from rank {src} of {array.nbytes} bytes", call)

    def barrier(self) -> None:
        cupy = backend.cupy()
        token = cupy.zeros(1, dtype=cupy.int32)
        self.all_reduce(token).wait()
        cupy.cuda.get_current_stream().synchronize()  # the host waits too: that is what a barrier is for

    # --- the watchdog -----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._closed.wait(_WATCHDOG_PERIOD):
            with self._lock:
                while self._pending and self._pending[0].is_completed():
                    self._pending.popleft()  # in order: the oldest finishes first on the one stream
                oldest = self._pending[0] if self._pending else None
            problem = None
            try:
                self.comm.check_async_error()
            except Exception as error:  # noqa: BLE001 - an NCCL error on the communicator
                problem = f"NCCL reported an asynchronous error ({error})"
            if problem is None and oldest is not None and time.monotonic() - oldest.started > self.timeout:
                problem = (f"collective {oldest.description} did not finish within {self.timeout:g}s: a peer rank "
                           f"died, hangs, or issued other collectives")
            if problem is not None:
                self._fail(problem)
                return

    def _fail(self, problem: str) -> None:
        sys.stderr.write(f"minidnn.distributed: rank {self.rank}: {problem}; aborting the NCCL communicator and "
                         f"ending this process (exit code {WATCHDOG_EXIT_CODE})\n")
        sys.stderr.flush()
        try:
            self.comm.abort()
        finally:
            os._exit(WATCHDOG_EXIT_CODE)  # the main thread may be stuck in a kernel wait: it cannot raise

    def shutdown(self) -> None:
        self.stream.synchronize()
        self._closed.set()
        self._watchdog.join(timeout=1.0)
        self.comm.destroy()
