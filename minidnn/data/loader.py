"""DataLoader: batches of a dataset, shuffled reproducibly, prepared by a background thread.

A producer thread fetches and collates the next batches (``prefetch`` of them) while the
training step runs on the current one, so the compute never waits on decoding. With
``num_workers > 1`` the producer decodes the samples of a batch in a thread pool (Pillow and
NumPy release the GIL for most of their work). The shuffled order of epoch ``e`` is a
permutation drawn from ``(seed, e)``: stopping and resuming at any epoch gives the same batches.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np

from ..tensor import Tensor
from .dataset import Dataset


def default_collate(samples: list[Any]) -> Any:
    """Stack a list of (input, target) samples into a tuple of batched Tensors."""
    first = samples[0]
    if isinstance(first, (tuple, list)):
        return tuple(default_collate([s[i] for s in samples]) for i in range(len(first)))
    if isinstance(first, Tensor):
        return Tensor(np.stack([s.numpy() for s in samples]))
    array = np.stack([np.asarray(s) for s in samples])
    if array.dtype == np.float64 and not isinstance(first, np.ndarray):
        array = array.astype(np.float32)  # Python floats, as minidnn.tensor does
    return Tensor(array)


class DataLoader:
    """``DataLoader(dataset, batch_size=1, shuffle=False, drop_last=False, seed=0, num_workers=0, prefetch=2)``."""

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, num_workers: int = 0, prefetch: int = 2,
                 collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        for name, value, low in (("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                                 ("prefetch", prefetch, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if len(dataset) == 0:
            raise ValueError("dataset is empty")
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, drop_last
        self.seed, self.num_workers, self.prefetch = seed, num_workers, prefetch
        self.collate_fn = collate_fn or default_collate
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffled order (and augmentation draws) the next iteration uses."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def batch_indices(self) -> list[np.ndarray]:
        """The index arrays of this epoch's batches, in order."""
        count = len(self.dataset)
        order = np.random.default_rng((self.seed, self.epoch)).permutation(count) if self.shuffle else np.arange(count)
        return [order[start:start + self.batch_size] for start in range(0, len(self) * self.batch_size, self.batch_size)]

    def __iter__(self) -> Iterator[Any]:
        return self.iterate()

    def iterate(self, start_batch: int = 0) -> Iterator[Any]:
        """This epoch's batches from number ``start_batch`` on (resuming mid-epoch skips the rest unread)."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        batches = self.batch_indices()[start_batch:]
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        pool = ThreadPoolExecutor(self.num_workers) if self.num_workers > 1 else None

        def fetch(indices: np.ndarray) -> Any:
            samples = list(pool.map(self.dataset.__getitem__, indices.tolist())) if pool else \
                [self.dataset[i] for i in indices.tolist()]
            return self.collate_fn(samples)

        def produce() -> None:
            try:
                for indices in batches:
                    if stop.is_set():
                        return
                    ready.put(("batch", fetch(indices)))
                ready.put(("done", None))
            except BaseException as error:  # hand decoding errors to the consumer, with the file name
                ready.put(("error", error))

        producer = threading.Thread(target=produce, name="minidnn-data", daemon=True)
        producer.start()
        try:
            while True:
                kind, item = ready.get()
                if kind == "done":
                    return
                if kind == "error":
                    raise item
                yield item
        finally:
            stop.set()
            while producer.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get(timeout=0.05)
                except queue.Empty:
                    pass
            if pool is not None:
                pool.shutdown(wait=True)
