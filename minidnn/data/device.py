"""Feeding a GPU: each batch assembled in page-locked host buffers and copied to the device on a side
stream while the previous training step runs, then handed to the step's stream through an event.

* **Pinned slots.** A copy from pageable memory is staged by the driver and does not overlap anything;
  from page-locked ("pinned") memory it is one asynchronous DMA. A slot (:class:`Slot`) lays a batch's arrays
  out in one page-locked buffer (``cupyx.empty_pinned``), each at an aligned offset, and its device twin has
  the same layout: a batch of five arrays (images, labels, the transform's draws) moves in one copy, not
  five, and each copy costs the iterating thread a driver call. The loader (its background thread with worker
  processes, else the iterating thread itself) writes each batch straight into a slot: without workers an
  in-memory dataset gathers its samples into the slot's arrays (``get_batch(..., into=)``), so a batch is
  copied once on the host.
* **Side stream.** The host-to-device copy of batch i + 1 is queued on a stream of its own
  (``cupy.cuda.Stream(non_blocking=True)``, which does not wait for the legacy default stream) when
  batch i is handed out, so it runs while step i computes.
* **Events, no host waits.** The step's stream waits for an event recorded after the copy (a
  device-side wait: the host goes on queuing work); the copy into a device slot waits for an event
  recorded after the last use of that slot's previous batch, and the first copy into a new slot for
  the work queued on the step's stream when it was allocated (CuPy's pool reuses memory freed there
  at once, safe for that stream's later work only). A pinned slot is refilled only once its
  copy's event has completed: the loader polls the events when it hands out a batch and waits on
  one only when every slot is still in flight (the host is then ahead of the GPU anyway).
* **Fresh outputs.** What the loader returns is made on the step's stream from the device slot (the
  batch transform's result, or a device copy), so a batch the caller keeps is never overwritten by
  a later copy. A captured CUDA graph (:mod:`minidnn.cuda.graphs`) copies it into its static inputs,
  one device-to-device copy; a batch transform can also write into a given array (``out``).

Every CUDA call here is made by the thread iterating the loader, none by a background thread (which
only writes host memory), so nothing interferes with a graph being captured in between.
"""
from __future__ import annotations

import collections
import queue
import threading
from typing import Any, Callable

import numpy as np

from .. import backend


def cupyx_module() -> Any:
    backend.cupy()  # a clear error without CUDA
    import cupyx  # noqa: PLC0415 - comes with CuPy

    return cupyx


def is_pinned(array: Any) -> bool:
    """Whether a NumPy array lives in page-locked memory that CuPy allocated."""
    if backend.loaded_cupy() is None:
        return False
    from cupy.cuda.pinned_memory import PinnedMemoryPointer  # noqa: PLC0415 - CuPy is loaded

    base = array
    while base is not None:
        if isinstance(base, PinnedMemoryPointer):
            return True
        base = getattr(base, "base", None)
    return False


def pinned_copy(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` in page-locked memory (``pin_memory=True`` without a device)."""
    out = cupyx_module().empty_pinned(array.shape, array.dtype)
    out[...] = array
    return out


ALIGN = 256  # bytes: where each array of a slot starts (CuPy's own allocations are aligned so; any vector access is)


def _layout(arrays: list[np.ndarray]) -> tuple[int, tuple]:
    """(bytes, ((offset, shape, dtype), ...)): ``arrays`` laid out one after another in one buffer."""
    placed, offset = [], 0
    for array in arrays:
        placed.append((offset, tuple(array.shape), array.dtype))
        offset += -(-array.nbytes // ALIGN) * ALIGN
    return max(offset, ALIGN), tuple(placed)


class Slot:
    """One batch's arrays in one buffer (page-locked on the host, or its twin on the device), each at an offset
    aligned to ALIGN bytes, so that a batch moves to the device in one copy. ``arrays``: the full-size views;
    a batch uses their leading rows (:meth:`rows`)."""

    def __init__(self, layout: tuple[int, tuple], buffer: Any) -> None:
        self.layout, self.buffer = layout, buffer
        self.arrays = [buffer[offset:offset + int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)
                       for offset, shape, dtype in layout[1]]
        self._rows: dict[tuple[int, ...], list[Any]] = {}

    def fits(self, arrays: list[Any]) -> bool:
        """Whether ``arrays`` fit the leading rows of the slot's arrays: same count, dtypes and trailing shapes."""
        return len(self.arrays) == len(arrays) and all(
            b.dtype == a.dtype and b.shape[1:] == a.shape[1:] and a.ndim >= 1 and b.shape[0] >= a.shape[0]
            for b, a in zip(self.arrays, arrays))

    def rows(self, counts: tuple[int, ...]) -> list[Any]:
        """The views of each array's leading ``counts[i]`` rows: made once per ``counts``, so that a later call
        gives the same view objects (the fill knows an array gathered into the slot by identity)."""
        views = self._rows.get(counts)
        if views is None:
            views = self._rows[counts] = [array[:count] for array, count in zip(self.arrays, counts)]
        return views


class HostBatch:
    """A batch on its way to the device: its host ``arrays`` (views of a pinned ``slot``'s arrays, or
    plain arrays when no slot fitted), how to rebuild it (``tree``) and how many trailing arrays are the
    batch transform's parameters (``extra``)."""

    def __init__(self, arrays: list[np.ndarray], tree: Any, extra: int, slot: Slot | None) -> None:
        self.arrays, self.tree, self.extra, self.slot = arrays, tree, extra, slot


class _Copy:
    """A batch whose copy to the device is queued: its device views and the event that ends the copy."""

    def __init__(self, batch: HostBatch, device_arrays: list[Any], copied: Any, ring_index: int) -> None:
        self.batch, self.device_arrays, self.copied, self.ring_index = batch, device_arrays, copied, ring_index


class DeviceFeeder:
    """The pinned slots, device slots and copy stream of one pass over a loader (see the module docstring).

    ``slots`` pinned slots (the filling thread fills free ones), ``depth`` device slots (copies in
    flight at most). :meth:`fill` is the filling thread's (the loader's background thread with worker processes,
    else the iterating thread, after :meth:`wait_for_slot`); the rest is the iterating thread's.
    """

    def __init__(self, device: backend.Device, slots: int, depth: int = 3) -> None:
        self.cupy = backend.cupy()
        self.device, self.slot_count, self.depth = device, slots, depth
        with self.cupy.cuda.Device(device.index):
            self.stream = self.cupy.cuda.Stream(non_blocking=True)
        self.free: queue.Queue = queue.Queue()  # pinned slots the filling thread may fill
        self.made = 0  # pinned slots allocated so far
        self.in_flight: collections.deque = collections.deque()  # (slot, copied event) not yet released
        self.ring: list[Slot | None] = [None] * depth  # device slots
        self.consumed: list[Any] = [None] * depth  # event after the last use of each device slot
        self.copies = 0

    # --- the filling thread ---------------------------------------------------------------------
    def fill(self, arrays: list[np.ndarray], stop: threading.Event,
             slot: Slot | None = None) -> tuple[list[np.ndarray], Slot | None]:
        """Copy ``arrays`` into ``slot`` (else a free pinned slot) if they fit it: (views of the slot, the slot).
        An array already gathered into the slot's view is not copied again. Returns (arrays, None) when no slot
        exists yet or it does not fit (the iterating thread then makes one)."""
        if slot is None:
            slot = self._free_slot(stop)
            if slot is None:
                return arrays, None
        if not slot.fits(arrays):
            self.free.put(slot)
            return arrays, None
        views = slot.rows(tuple(array.shape[0] for array in arrays))
        for view, array in zip(views, arrays):
            if view is not array:
                np.copyto(view, array)
        return views, slot

    def _free_slot(self, stop: threading.Event) -> Slot | None:
        """A free pinned slot, waited for until ``stop``; None while none exists yet."""
        while self.made and not stop.is_set():
            try:
                return self.free.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    # --- the iterating thread -------------------------------------------------------------------
    def take_free(self) -> Slot | None:
        """A free pinned slot for the iterating thread to fill itself (after :meth:`wait_for_slot`), else None."""
        try:
            return self.free.get_nowait()
        except queue.Empty:
            return None

    def _new_slot(self, arrays: list[np.ndarray]) -> Slot:
        layout = _layout(arrays)
        self.made += 1
        return Slot(layout, cupyx_module().empty_pinned((layout[0],), np.uint8))

    def release_finished(self) -> None:
        """Give back to the filling thread every pinned slot whose copy has completed."""
        while self.in_flight and self.in_flight[0][1].done:
            self.free.put(self.in_flight.popleft()[0])

    def wait_for_slot(self) -> None:
        """When every pinned slot is in flight, wait for the oldest copy (the GPU is behind the host)."""
        self.release_finished()
        if self.made >= self.slot_count and self.free.empty() and self.in_flight:
            slot, copied = self.in_flight.popleft()
            copied.synchronize()
            self.free.put(slot)

    def start_copy(self, batch: HostBatch) -> _Copy:
        """Queue the batch's host-to-device copy on the side stream (after the device slot's last use): one copy of
        the whole slot."""
        cupy = self.cupy
        with cupy.cuda.Device(self.device.index):
            if batch.slot is None:  # the first batch, or one that fits no slot: a new slot, kept for reuse
                slot = self._new_slot(batch.arrays)
                views = slot.rows(tuple(a.shape[0] for a in batch.arrays))
                for view, array in zip(views, batch.arrays):
                    np.copyto(view, array)
                batch.arrays, batch.slot = views, slot
                while self.made < self.slot_count:  # the others, for the filling thread
                    self.free.put(self._new_slot(batch.arrays))
            index = self.copies % self.depth
            self.copies += 1
            twin = self.ring[index]
            if twin is None or twin.layout != batch.slot.layout:
                twin = self.ring[index] = Slot(batch.slot.layout, cupy.empty((batch.slot.layout[0],), np.uint8))
                # The pool hands out memory freed on the step's stream, where kernels queued earlier may still
                # read or write it; the pool orders reuse on that stream only, so the side stream's first copy
                # into the new slot waits for them on the device.
                allocated = cupy.cuda.Event(block=False, disable_timing=True)
                allocated.record(cupy.cuda.get_current_stream())
                self.stream.wait_event(allocated)
            if self.consumed[index] is not None:
                self.stream.wait_event(self.consumed[index])
            twin.buffer.set(batch.slot.buffer, stream=self.stream)
            copied = cupy.cuda.Event(block=False, disable_timing=True)
            copied.record(self.stream)
        self.in_flight.append((batch.slot, copied))
        return _Copy(batch, twin.rows(tuple(a.shape[0] for a in batch.arrays)), copied, index)

    def finish(self, copy: _Copy, transform: Callable | None) -> list[Any]:
        """The batch's arrays on the device, made on the current stream after its copy: the first array
        through ``transform`` (with the trailing parameter arrays), the others copied."""
        cupy = self.cupy
        with cupy.cuda.Device(self.device.index):
            compute = cupy.cuda.get_current_stream()
            compute.wait_event(copy.copied)
            arrays, extra = copy.device_arrays, copy.batch.extra
            kept = arrays[:len(arrays) - extra]
            outputs = [transform(a, *arrays[len(kept):]) if transform is not None and position == 0 else a.copy()
                       for position, a in enumerate(kept)]
            consumed = cupy.cuda.Event(block=False, disable_timing=True)
            consumed.record(compute)
            self.consumed[copy.ring_index] = consumed
        return outputs

    def close(self) -> None:
        """Wait for the copies still in flight (once per pass), so no pinned buffer is freed under one."""
        for _, copied in self.in_flight:
            copied.synchronize()
        self.in_flight.clear()
