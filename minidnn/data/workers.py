"""Worker processes for ``DataLoader(num_workers=N)``, as PyTorch's: each fetches whole batches by index
(decoding image files in parallel, free of the training process's GIL) and hands back arrays through
shared memory.

* **Start.** Processes start from a clean interpreter, never by ``fork`` of the training process
  (which would copy it mid-way through its threads and its CUDA context): by default from
  ``forkserver`` (a clean server process, started once, that has imported minidnn and forks each
  worker from itself), or ``spawn`` (a new interpreter per worker, importing everything again). Either
  way the dataset is pickled to each worker once, at start, so it must be picklable (module-level
  classes and functions, no lambdas). Each worker ignores SIGINT (Ctrl-C reaches the whole process
  group, and the training process decides what it means) and keeps SIGTERM's default action, so a
  SIGTERM ends it at once, also in the middle of a read that never returns. A watchdog thread ends a
  worker as soon as the loader's process is gone (the pipe multiprocessing keeps to it closes).
* **Order.** Batch ``b`` goes to a worker with room (at most ``prefetch`` batches queued per worker);
  results are handed on in batch order whatever the workers' timing, and an error is raised at the
  batch it belongs to. A batch's content depends only on the dataset, the epoch and its indices.
* **Shared memory.** A worker writes a batch's arrays into one of its own shared-memory blocks and
  sends their layout; the loader copies them out (into page-locked buffers when it feeds a GPU) and
  tells the worker, with its next task, that the block is free again. Blocks are reused, so no page
  is faulted in twice. A worker unlinks its blocks when it ends; the loader unlinks those of a
  worker that was killed.
* **Shutdown.** :meth:`WorkerPool.shutdown` (at the end of an iteration, or of the loader's life with
  ``persistent_workers=True``, and at exit) asks each worker to stop, then terminates and finally
  kills those still running after a second: a worker blocked in a read is ended, never waited for.
"""
from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import threading
import time
import traceback
import weakref
from multiprocessing import shared_memory
from typing import Any, Callable, Iterator

import numpy as np

from .batch import fetch

START_METHODS = tuple(m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods())
DEFAULT_START_METHOD = START_METHODS[0]
_POLL_SECONDS = 0.1  # how often a wait checks for a stop request and for dead workers
_JOIN_SECONDS = 1.0  # how long shutdown waits for a worker at each step (stop, terminate, kill)
_ALIGN = 64


class WorkerError(RuntimeError):
    """A worker process ended while the loader needed it; ``exitcode`` is its exit status (-N: signal N)."""

    def __init__(self, message: str, exitcode: int | None = None) -> None:
        super().__init__(message)
        self.exitcode = exitcode


# ----------------------------------------------------------------------------------------------
# The worker's side
# ----------------------------------------------------------------------------------------------
def _watch_parent(blocks: dict) -> None:
    """End this worker as soon as the loader's process is gone (it would otherwise wait for tasks forever,
    or finish a read no one wants): multiprocessing's sentinel of the parent becomes readable then."""
    multiprocessing.connection.wait([multiprocessing.parent_process().sentinel])
    _release_blocks(blocks)
    os._exit(1)


def _release_blocks(blocks: dict) -> None:
    for block in list(blocks.values()):
        try:
            block.close()
            block.unlink()
        except (OSError, BufferError):
            pass


def _portable_error(error: BaseException, worker: int, indices: list[int]) -> bytes:
    """The error pickled with its type and attributes, for the loader to raise again; an exception
    type that cannot be pickled travels as a RuntimeError with its message."""
    where = (f"in DataLoader worker process {worker}, fetching the batch of samples "
             f"{indices[:8]}{'...' if len(indices) > 8 else ''}:\n{''.join(traceback.format_exception(error))}")
    payload = ("error", type(error), error.args, dict(getattr(error, "__dict__", {})), where)
    try:
        return pickle.dumps(payload)
    except Exception:  # noqa: BLE001 - anything unpicklable in the error
        return pickle.dumps(("error", RuntimeError, (f"{type(error).__name__}: {error}",), {}, where))


def _write_batch(arrays: list[np.ndarray], blocks: dict, free: set, worker: int) -> tuple[str, list]:
    """Copy ``arrays`` into a free shared-memory block of this worker (a new one if none is big enough)."""
    layout, offset = [], 0
    for array in arrays:
        layout.append((offset, array.shape, array.dtype.str))
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
    name = next((n for n in sorted(free) if blocks[n].size >= offset), None)
    if name is None:
        block = shared_memory.SharedMemory(create=True, size=max(offset, _ALIGN) + max(offset, _ALIGN) // 4)
        blocks[block.name] = block
        name = block.name
    free.discard(name)
    buffer = blocks[name].buf
    for array, (start, shape, dtype) in zip(arrays, layout):
        np.ndarray(shape, dtype, buffer=buffer, offset=start)[...] = array
    return name, layout


def worker_main(worker: int, dataset: Any, collate_fn: Callable | None, tasks: Any, results: Any) -> None:
    """A worker's loop: tasks ``(generation, batch, epoch, indices, released block names)`` in, results
    ``(generation, batch, pickled message)`` out, until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    blocks: dict[str, shared_memory.SharedMemory] = {}
    free: set[str] = set()
    threading.Thread(target=_watch_parent, args=(blocks,), name="minidnn-worker-watchdog", daemon=True).start()
    try:
        while True:
            task = tasks.get()
            if task is None:
                return
            generation, number, epoch, indices, released = task
            free.update(name for name in released if name in blocks)
            try:
                if hasattr(dataset, "set_epoch"):
                    dataset.set_epoch(epoch)
                arrays, tree = fetch(dataset, indices, collate_fn)
                arrays = [np.ascontiguousarray(a) for a in arrays]
                name, layout = _write_batch(arrays, blocks, free, worker)
                message = pickle.dumps(("batch", number, worker, name, layout, tree))
            except Exception as error:  # noqa: BLE001 - every error goes to the loader, in batch order
                message = _portable_error(error, worker, indices)
            results.put((generation, number, message))
    finally:
        _release_blocks(blocks)


# ----------------------------------------------------------------------------------------------
# The loader's side
# ----------------------------------------------------------------------------------------------
class WorkerBatch:
    """One batch in a worker's shared memory: ``arrays`` are views of it, valid until :meth:`release`."""

    def __init__(self, pool: "WorkerPool", worker: int, name: str, arrays: list[np.ndarray], tree: Any) -> None:
        self.pool, self.worker, self.name, self.arrays, self.tree = pool, worker, name, arrays, tree

    def release(self) -> None:
        """The views are no longer needed: the worker may reuse the block."""
        self.arrays = []
        self.pool.pending_release[self.worker].append(self.name)


def _rebuild_error(payload: tuple) -> BaseException:
    """The worker's exception, re-made without calling its __init__ (whose signature may differ from its args)."""
    _, kind, args, state, where = payload
    try:
        error = kind.__new__(kind)
        error.args = args
        error.__dict__.update(state)
    except Exception:  # noqa: BLE001 - an exception type that cannot be re-made this way
        error = RuntimeError(*args)
    error.add_note(where.rstrip())
    return error


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"was ended by signal {-code}"
    return f"exited with status {code}"


_live_pools: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


class WorkerPool:
    """``num_workers`` processes serving one dataset; see the module docstring."""

    def __init__(self, dataset: Any, num_workers: int, collate_fn: Callable | None, prefetch: int,
                 method: str = DEFAULT_START_METHOD) -> None:
        context = multiprocessing.get_context(method)
        if method == "forkserver":  # the server imports minidnn once, and every worker is forked from it
            context.set_forkserver_preload(["__main__", __name__])
        self.prefetch = prefetch
        self.results = context.Queue()
        self.tasks = [context.Queue() for _ in range(num_workers)]
        self.processes: list[Any] = []
        self.pending_release: list[list[str]] = [[] for _ in range(num_workers)]
        self.attached: dict[str, shared_memory.SharedMemory] = {}
        self.closed = False
        self.generation = 0  # one per call of batches(): results of an iteration left early are told apart
        _live_pools.add(self)
        try:
            for worker in range(num_workers):
                process = context.Process(target=worker_main, name=f"minidnn-data-worker-{worker}", daemon=True,
                                          args=(worker, dataset, collate_fn, self.tasks[worker], self.results))
                process.start()
                self.processes.append(process)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            self.shutdown()
            raise TypeError(f"num_workers > 0 sends the dataset (and collate_fn) to worker processes by pickling, "
                            f"and {type(dataset).__name__} cannot be pickled ({error}); define its classes and "
                            f"functions at module level (no lambdas), or use num_workers=0") from None

    def batches(self, epoch: int, batches: list[np.ndarray], stop: threading.Event) -> Iterator[Any]:
        """``batches`` (index arrays) fetched by the workers, in order: a :class:`WorkerBatch` each (an
        error of the worker raised at its batch); ends early when ``stop`` is set."""
        count, workers = len(batches), len(self.processes)
        self.generation += 1
        generation = self.generation
        queued = [0] * workers
        assigned: dict[int, int] = {}
        arrived: dict[int, tuple] = {}
        submitted = delivered = 0
        while delivered < count:
            while submitted < count and submitted - delivered < workers * self.prefetch:
                worker = min(range(workers), key=lambda w: (queued[w], w))
                if queued[worker] >= self.prefetch:
                    break
                released, self.pending_release[worker] = self.pending_release[worker], []
                self.tasks[worker].put((generation, submitted, epoch, batches[submitted].tolist(), released))
                queued[worker] += 1
                assigned[submitted] = worker
                submitted += 1
            while delivered not in arrived:
                if stop.is_set():
                    return
                try:
                    made, number, message = self.results.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    self._check_alive()
                    continue
                payload = pickle.loads(message)
                if made == generation:
                    arrived[number] = payload
                elif payload[0] == "batch":  # from an iteration left early (persistent workers): free its block
                    self.pending_release[payload[2]].append(payload[3])
            payload = arrived.pop(delivered)
            queued[assigned.pop(delivered)] -= 1
            delivered += 1
            if payload[0] == "error":
                raise _rebuild_error(payload)
            _, _, worker, name, layout, tree = payload
            yield WorkerBatch(self, worker, name, self._views(name, layout), tree)

    def _views(self, name: str, layout: list) -> list[np.ndarray]:
        block = self.attached.get(name)
        if block is None:
            block = self.attached[name] = shared_memory.SharedMemory(name=name)
        return [np.ndarray(shape, np.dtype(dtype), buffer=block.buf, offset=offset) for offset, shape, dtype in layout]

    def _check_alive(self) -> None:
        for worker, process in enumerate(self.processes):
            if not process.is_alive():
                code = process.exitcode
                hint = (" (SIGBUS: shared memory ran out; /dev/shm may be small, as a container's 64 MB default "
                        "is: enlarge it, or use fewer workers or smaller batches)" if code == -signal.SIGBUS else "")
                raise WorkerError(f"DataLoader worker process {worker} (pid {process.pid}) {_describe_exit(code)} "
                                  f"while the loader waited for its batch{hint}", code)

    def shutdown(self) -> None:
        """Stop every worker (asking, then terminating, then killing), and free the shared memory."""
        if self.closed:
            return
        self.closed = True
        for tasks in self.tasks:
            try:
                tasks.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + _JOIN_SECONDS
        while time.monotonic() < deadline and any(p.is_alive() for p in self.processes):
            try:  # read what is still in flight: a worker cannot exit while its results fill the pipe
                self.results.get(timeout=0.02)
            except (queue.Empty, OSError, ValueError, EOFError):
                pass
        for ending in ("terminate", "kill"):
            alive = [p for p in self.processes if p.is_alive()]
            if not alive:
                break
            for process in alive:
                getattr(process, ending)()
            deadline = time.monotonic() + _JOIN_SECONDS
            for process in alive:
                process.join(max(0.0, deadline - time.monotonic()))
        for name, block in self.attached.items():
            try:
                block.close()
            except BufferError:  # a view still alive somewhere: the mapping goes with the process
                pass
            try:
                block.unlink()  # a killed worker could not; normally the worker did and this finds nothing
            except FileNotFoundError:
                pass
        self.attached.clear()
        for channel in (*self.tasks, self.results):
            channel.cancel_join_thread()  # never wait at exit to flush a message no one will read
            channel.close()
        # The queues' feeder threads end here, not at some later moment: a feeder that fails in its last close
        # reports from its own thread while this one waits (a report racing the main thread's work can break
        # Python 3.11, whose traceback formatting and ast.parse share state across threads). Bounded: the
        # workers are gone, and what a feeder still holds is a few small task messages. multiprocessing offers
        # no public join with a timeout, hence its private _thread.
        for channel in self.tasks:
            feeder = getattr(channel, "_thread", None)
            if feeder is not None and feeder is not threading.current_thread():
                feeder.join(_JOIN_SECONDS)

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - at interpreter exit, modules may be half gone
            pass


@atexit.register
def _shut_down_all() -> None:
    for pool in list(_live_pools):
        pool.shutdown()
