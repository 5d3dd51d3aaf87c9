"""A captured step's memory laid out ahead: one arena, every array of the step at an offset chosen from its lifetime.
A caching pool hands a captured step's arrays out as they come and keeps them for the graph's life: it holds the
step's peak plus its fragmentation. Recording one step's allocations first lets each be placed where no array
alive at the same time lies (greedy by size), so the arena is close to the peak itself.

How it is used (:func:`minidnn.cuda.graphs.capture`):

1. The last warm-up step runs under :func:`record`, which passes every allocation through to the pool and
   notes its size and when it was made and freed (a clock that ticks at each malloc and each free; an array
   still alive at the end lives forever). Convolution workspaces are allocated per call there, as in a capture.
2. :func:`place` gives each allocation an offset: the largest first, each at the lowest aligned offset that
   overlaps no placed allocation whose lifetime overlaps its own (the "greedy by size" offline placement of
   TFLite's and XLA's planners). The arena's size is the highest end.
3. The capture allocates through a :class:`PlannedAllocator`: the k-th request gets the k-th offset if it has
   the recorded size and every earlier allocation sharing its bytes is already freed; otherwise (the capture
   took another path) it and every later request come from the fallback pool, as without a plan. So a plan
   that does not fit can cost memory, never correctness.

Frees are seen through CuPy's ``UnownedMemory``: each array's memory holds an owner object, and when the last
reference to the array goes, the owner's ``__del__`` runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import numpy as np

from .. import backend
from ..primitives.conv import workspace as conv_workspace

# Offsets in the arena start on CuPy's allocation unit, so every array is as aligned as the pool's own.
ALIGNMENT = 512


def _aligned(size: int) -> int:
    return -(-max(size, 1) // ALIGNMENT) * ALIGNMENT


@dataclasses.dataclass
class Recording:
    """The allocations of one recorded step, in the order they were made: sizes in bytes, and the clock at
    their malloc (``starts``) and their free (``ends``; None while alive, read as the end of time)."""

    sizes: list[int] = dataclasses.field(default_factory=list)
    starts: list[int] = dataclasses.field(default_factory=list)
    ends: list[int | None] = dataclasses.field(default_factory=list)
    clock: int = 0

    def allocated(self, size: int) -> int:
        self.clock += 1
        self.sizes.append(size)
        self.starts.append(self.clock)
        self.ends.append(None)
        return len(self.sizes) - 1

    def freed(self, index: int) -> None:
        self.clock += 1
        self.ends[index] = self.clock

    def lifetimes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sizes, starts, ends) as int64 arrays, an allocation still alive ending after every other event."""
        forever = self.clock + 1
        return (np.asarray(self.sizes, dtype=np.int64), np.asarray(self.starts, dtype=np.int64),
                np.asarray([forever if end is None else end for end in self.ends], dtype=np.int64))


@dataclasses.dataclass
class Plan:
    """Where each recorded allocation goes: ``offsets[k]`` for the k-th, ``arena_bytes`` in all, and for each
    the earlier allocations that share some of its bytes (``predecessors[k]``), which must be freed first.
    ``peak_bytes``: the most (aligned) bytes alive at once in the recording, the least any arena could be."""

    sizes: np.ndarray
    offsets: np.ndarray
    arena_bytes: int
    predecessors: list[np.ndarray]
    peak_bytes: int


def place(sizes: Any, starts: Any, ends: Any) -> Plan:
    """Offsets for allocations of ``sizes`` bytes alive over [starts[k], ends[k]) (clock ticks), such that two
    whose lifetimes overlap never share a byte: largest first, each at the lowest :data:`ALIGNMENT`-aligned
    offset clear of every placed allocation alive at the same time."""
    sizes = np.asarray(sizes, dtype=np.int64)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not (sizes.shape == starts.shape == ends.shape) or sizes.ndim != 1:
        raise ValueError("place: sizes, starts and ends must be 1-D and of one length")
    if np.any(sizes < 0) or np.any(ends <= starts):
        raise ValueError("place: sizes must be >= 0 and every allocation must end after it starts")
    count = sizes.size
    aligned = np.asarray([_aligned(int(s)) for s in sizes], dtype=np.int64)
    offsets = np.full(count, -1, dtype=np.int64)
    placed = np.zeros(count, dtype=bool)
    # Largest first; among equals the earlier allocation first, so the placement is a function of the recording.
    for k in sorted(range(count), key=lambda i: (-aligned[i], i)):
        clashing = placed & (starts < ends[k]) & (starts[k] < ends)
        offset = 0
        for lower, upper in sorted(zip(offsets[clashing], offsets[clashing] + aligned[clashing])):
            if offset + aligned[k] <= lower:
                break  # the gap below this one holds it
            offset = max(offset, int(upper))
        offsets[k], placed[k] = offset, True
    arena = int(np.max(offsets + aligned)) if count else 0
    predecessors = []
    for k in range(count):
        earlier = np.arange(k)
        shares = (offsets[:k] < offsets[k] + aligned[k]) & (offsets[k] < offsets[:k] + aligned[:k])
        predecessors.append(earlier[shares])
    events = np.concatenate([starts, ends])
    change = np.concatenate([aligned, -aligned])
    order = np.argsort(events, kind="stable")  # every malloc and free has a tick of its own
    peak = int(np.max(np.cumsum(change[order]))) if count else 0
    return Plan(sizes=sizes, offsets=offsets, arena_bytes=arena, predecessors=predecessors, peak_bytes=peak)


class _Lifetime:
    """The owner of one allocation's memory: its ``__del__`` runs when the last array on that memory goes."""

    __slots__ = ("on_free", "index", "keep")

    def __init__(self, on_free: Any, index: int, keep: Any) -> None:
        self.on_free, self.index, self.keep = on_free, index, keep

    def __del__(self) -> None:
        self.on_free(self.index)


def _owned(pointer: int, size: int, owner: _Lifetime, device_id: int) -> Any:
    """A MemoryPointer to ``size`` bytes at ``pointer`` on device ``device_id`` (given: a zero-byte request's
    pointer may be null, which CuPy cannot place on a device) whose memory holds ``owner``."""
    cupy = backend.cupy()
    memory = cupy.cuda.memory.UnownedMemory(pointer, size, owner, device_id)
    return cupy.cuda.memory.MemoryPointer(memory, 0)


@contextlib.contextmanager
def record() -> Iterator[Recording]:
    """Note every GPU allocation made inside the block (sizes, malloc and free times) while passing each to the
    allocator in place; convolution workspaces are allocated per call inside it, as in a capture. This thread's
    allocations only, as the capture's (CuPy's ``using_allocator`` is thread-local)."""
    cupy = backend.cupy()
    recording = Recording()
    allocator = cupy.cuda.get_allocator()

    def malloc(size: int) -> Any:
        memory = allocator(size)
        return _owned(memory.ptr, size, _Lifetime(recording.freed, recording.allocated(size), memory), memory.device_id)

    with cupy.cuda.using_allocator(malloc), conv_workspace.per_call():
        yield recording


class PlannedAllocator:
    """Hands out ``plan``'s offsets in ``arena`` (a MemoryPointer of at least plan.arena_bytes) request by
    request while the requests follow the recording (module docstring); from ``fallback`` (a malloc
    function) once one does not. ``fallbacks`` counts the requests that went there."""

    def __init__(self, plan: Plan, arena: Any, fallback: Any) -> None:
        self.plan, self.arena, self.fallback = plan, arena, fallback
        self.next = 0
        self.following = True
        self.alive = np.zeros(plan.sizes.size, dtype=bool)
        self.fallbacks = 0

    def _freed(self, index: int) -> None:
        self.alive[index] = False

    def malloc(self, size: int) -> Any:
        k = self.next
        if self.following and (k >= self.plan.sizes.size or size != self.plan.sizes[k]
                               or np.any(self.alive[self.plan.predecessors[k]])):
            self.following = False
        if not self.following:
            self.fallbacks += 1
            return self.fallback(size)
        self.next += 1
        self.alive[k] = True
        pointer = self.arena.ptr + int(self.plan.offsets[k])
        return _owned(pointer, size, _Lifetime(self._freed, k, self.arena), self.arena.device_id)
