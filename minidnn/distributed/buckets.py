"""Gradient buckets: which parameters share one flat buffer, and so one all-reduce.

One all-reduce per parameter would pay NCCL's latency (tens of microseconds) hundreds of times a step; one for the
whole model could start only when backward is over. Buckets of about ``bucket_cap_mb`` sit between: a bucket's
all-reduce starts as soon as its last gradient is ready, while backward computes the next ones. Gradients appear in
about the reverse of the order the parameters were registered (the last layer's first), so the buckets are made as
PyTorch's first pass makes them: filled in registration order, each closed once it holds at least its cap (the
first bucket's cap is 1 MiB when the cap is the default), then listed in reverse, so that bucket 0 holds the last
layers and is reduced first, and the small bucket of the first layers is reduced last, leaving little to wait for
when backward ends. A bucket holds one dtype on one device.
"""
from __future__ import annotations

from typing import Hashable, Sequence

__all__ = ["compute_bucket_assignment_by_size", "bucket_order", "DEFAULT_BUCKET_CAP_MB", "FIRST_BUCKET_BYTES",
           "bucket_size_limits"]

DEFAULT_BUCKET_CAP_MB = 25.0
FIRST_BUCKET_BYTES = 1024 * 1024  # PyTorch's _DEFAULT_FIRST_BUCKET_BYTES


def bucket_size_limits(bucket_cap_mb: float | None) -> list[int]:
    """The byte limits the buckets are filled to: ``[1 MiB, 25 MiB]`` by default (the first bucket small, as
    PyTorch does it), ``[bucket_cap_mb MiB]`` when a cap is given."""
    if bucket_cap_mb is None:
        return [FIRST_BUCKET_BYTES, int(DEFAULT_BUCKET_CAP_MB * 1024 * 1024)]
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {bucket_cap_mb!r}")
    return [max(1, int(bucket_cap_mb * 1024 * 1024))]


def compute_bucket_assignment_by_size(sizes: Sequence[int], limits: Sequence[int],
                                      keys: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Group tensors 0..n-1 into buckets, PyTorch's ``_compute_bucket_assignment_by_size`` (dense tensors).

    ``sizes``: each tensor's bytes; ``keys``: what must match within a bucket (dtype, device), one per tensor
    (None: all alike). Tensors are taken in index order into the open bucket of their key; a bucket closes when it
    holds ``>= limit`` bytes, the limit being ``limits[k]`` for that key's k-th bucket (the last limit repeats).
    Returns the buckets' index lists, sorted by their smallest index.
    """
    if keys is not None and len(keys) != len(sizes):
        raise ValueError(f"keys must have one entry per tensor: {len(keys)} keys for {len(sizes)} sizes")
    if not limits or any(not isinstance(limit, int) or limit < 1 for limit in limits):
        raise ValueError(f"limits must be a non-empty list of positive byte counts, got {list(limits)!r}")
    result: list[list[int]] = []
    open_buckets: dict[Hashable, list] = {}  # key -> [indices, bytes, which limit]
    for index, size in enumerate(sizes):
        key = None if keys is None else keys[index]
        bucket = open_buckets.setdefault(key, [[], 0, 0])
        bucket[0].append(index)
        bucket[1] += int(size)
        if bucket[1] >= limits[bucket[2]]:
            result.append(bucket[0])
            open_buckets[key] = [[], 0, min(bucket[2] + 1, len(limits) - 1)]
    result.extend(bucket[0] for bucket in open_buckets.values() if bucket[0])
    result.sort(key=min)
    return result


def bucket_order(sizes: Sequence[int], limits: Sequence[int],
                 keys: Sequence[Hashable] | None = None) -> list[list[int]]:
    """The buckets DistributedDataParallel reduces, in the order it reduces them: the assignment of
    :func:`compute_bucket_assignment_by_size` over the parameters in registration order, listed in reverse (the
    bucket of the last-registered parameters first). Within a bucket the parameters keep registration order
    (their place in the flat buffer)."""
    return list(reversed(compute_bucket_assignment_by_size(sizes, limits, keys)))
