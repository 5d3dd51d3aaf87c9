"""DistributedSampler: each rank's share of a dataset's indices, disjoint across ranks, reshuffled per epoch.

Every rank draws the same permutation (from the seed and the epoch, so nothing is communicated), pads it by
repeating its head until its length divides by the number of ranks (or drops the tail, with ``drop_last``), and
takes every ``num_replicas``-th index from its rank on: PyTorch's rule, so each rank sees the same number of
samples and the shards together cover the dataset. The permutation comes from NumPy's generator seeded with
``(seed, epoch)``, as :class:`minidnn.data.DataLoader` draws its own; PyTorch's comes from ``torch.randperm``, so
the shuffled orders differ, the padding and striding do not.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import numpy as np

from .process_group import default_group, is_initialized

__all__ = ["DistributedSampler", "shard"]


def _per_rank(length: int, num_replicas: int, drop_last: bool) -> int:
    """How many indices each rank gets (PyTorch's count): the tail dropped, or padded up to a full round."""
    if drop_last and length % num_replicas:
        return math.ceil((length - num_replicas) / num_replicas)
    return math.ceil(length / num_replicas)


def shard(order: Sequence[int], num_replicas: int, rank: int, drop_last: bool = False) -> list[int]:
    """Rank ``rank``'s indices of ``order`` (a permutation of the dataset's indices), PyTorch's way: padded with
    its own head to a multiple of ``num_replicas`` (or, with ``drop_last``, cut down to one), then strided.
    ``np.resize`` does both: it repeats the order from its head as often as needed, or cuts it."""
    total = _per_rank(len(order), num_replicas, drop_last) * num_replicas
    return np.resize(np.asarray(order, dtype=np.int64), total)[rank::num_replicas].tolist()


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"DistributedSampler: {name} must be an int >= {low}, got {value!r}")
    return int(value)


class DistributedSampler:
    """``DistributedSampler(dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False)``.

    Iterating gives this rank's dataset indices for the current epoch; ``len()`` is how many (the same on every
    rank). ``num_replicas``/``rank`` default to the default process group's world size and rank. Call
    ``set_epoch(e)`` before each epoch, on every rank: the shuffled order is drawn from ``(seed, e)``, so the same
    epoch gives the same shards (a resumed run included) and every epoch new ones.
    """

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            if not is_initialized():
                raise RuntimeError("DistributedSampler: pass num_replicas and rank, or call init_process_group first")
            group = default_group()
            num_replicas = group.size if num_replicas is None else num_replicas
            rank = group.rank if rank is None else rank
        self.num_replicas = _check_int("num_replicas", num_replicas, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"DistributedSampler: invalid rank {rank}, rank should be in the interval "
                             f"[0, {self.num_replicas - 1}]")
        self.dataset, self.shuffle, self.seed, self.drop_last = dataset, bool(shuffle), int(seed), bool(drop_last)
        length = len(dataset)
        self.num_samples = _per_rank(length, self.num_replicas, self.drop_last)
        if self.num_samples == 0:
            raise ValueError(f"DistributedSampler: a dataset of {length} samples leaves nothing to each of "
                             f"{self.num_replicas} ranks with drop_last=True")
        self.total_size = self.num_samples * self.num_replicas
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _check_int("epoch", epoch, 0)

    def order(self) -> np.ndarray:
        """This epoch's order of the whole dataset, the same on every rank."""
        length = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng((self.seed, self.epoch)).permutation(length)
        return np.arange(length)

    def __iter__(self) -> Iterator[int]:
        return iter(shard(self.order(), self.num_replicas, self.rank, self.drop_last))

    def __len__(self) -> int:
        return self.num_samples
