"""Random numbers: one global generator with two streams, both reproducible from a seed.

* A host stream (NumPy's PCG64) for parameter initialisation and other draws made on the CPU.
* A counter stream for dropout masks: each call takes ``(seed, offset)`` and advances the offset
  by the number of elements it draws. The mask itself is a hash of (seed, offset + i)
  (see :mod:`minidnn.primitives.dropout`), so the same numbers come out on the CPU and the GPU,
  and a GPU kernel needs no generator state in memory: the whole state is two integers.

``manual_seed`` resets both; ``get_rng_state``/``set_rng_state`` round-trip through JSON-able
dictionaries (checkpoints store them without pickling).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from .primitives.dropout import DeviceOffset

DEFAULT_SEED = 0


class Generator:
    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        self._device_start: Any = None  # set while a CUDA graph is captured
        self._device_base = 0
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "Generator":
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
        self.seed = int(seed)
        self.offset = 0
        self.numpy = np.random.Generator(np.random.PCG64(self.seed))
        return self

    def next_offset(self, count: int) -> "int | DeviceOffset":
        """Reserve ``count`` numbers of the counter stream; returns the first offset (while a CUDA
        graph is captured, as a :class:`DeviceOffset` relative to the offset the graph's replays
        will write to the device before each replay)."""
        offset = self.offset
        self.offset += int(count)
        if self._device_start is not None:
            return DeviceOffset(self._device_start, offset - self._device_base)
        return offset

    @contextlib.contextmanager
    def offsets_on_device(self, start: Any) -> Iterator[None]:
        """Inside the block, draws read their start from ``start[0]`` on the device (see
        :mod:`minidnn.cuda.graphs`); offsets count from the generator's offset at entry."""
        self._device_start, self._device_base = start, self.offset
        try:
            yield
        finally:
            self._device_start = None

    def get_state(self) -> dict[str, Any]:
        return {"seed": self.seed, "offset": self.offset, "numpy": self.numpy.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or set(state) != {"seed", "offset", "numpy"}:
            raise ValueError("state must be a dict with keys 'seed', 'offset' and 'numpy' from get_state()")
        self.seed, self.offset = int(state["seed"]), int(state["offset"])
        bit_generator = np.random.PCG64()
        bit_generator.state = state["numpy"]
        self.numpy = np.random.Generator(bit_generator)


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the global generator (initialisation, dropout, shuffling in the examples)."""
    return default_generator.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    return default_generator.get_state()


def set_rng_state(state: dict[str, Any]) -> None:
    default_generator.set_state(state)
