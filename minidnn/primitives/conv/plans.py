"""A plan: how one convolution call runs, as segments of (images, algorithm) covering the batch in order.

One segment when the whole batch runs in one call; several for micro-batches, which share one workspace
(the largest any of them needs). :mod:`.api` makes and runs plans, :mod:`.planner` builds micro-batched ones,
and :data:`call_observer` lets a profiler or the planner see each call's plan as it runs.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from . import registry
from .problem import ConvProblem


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one convolution call runs: ``segments`` of (images, algorithm) covering the batch in
    order, the workspace they share (the largest any of them needs), and, when a whole-network
    plan gave it one, a preallocated ``arena`` buffer to use as that workspace."""

    segments: tuple[tuple[int, registry.ConvAlgorithm], ...]
    workspace_bytes: int
    arena: Any = None

    @property
    def algorithms(self) -> list[str]:
        return [algorithm.name for _, algorithm in self.segments]

    def describe(self) -> str:
        parts = [f"{images}x{algorithm.name}" for images, algorithm in self.segments]
        return f"{' + '.join(parts)} ({self.workspace_bytes / 2**20:.1f} MiB workspace)"


# A hook the profiler, the benchmark and the WD planner set to see every call: (direction, problem, plan).
call_observer: Callable[[str, ConvProblem, Plan], None] | None = None


def single(algorithm: registry.ConvAlgorithm, problem: ConvProblem, direction: str) -> Plan:
    """The plan that runs the whole batch in one call of ``algorithm``."""
    return Plan(((problem.N, algorithm),), algorithm.workspace_bytes(problem, direction))


def even_split(algorithm: registry.ConvAlgorithm, problem: ConvProblem, direction: str, limit: int) -> Plan:
    """The whole batch in as few equal micro-batches of ``algorithm`` as fit ``limit`` (the last may be smaller)."""
    if algorithm.workspace_bytes(problem.with_batch(1), direction) > limit:
        raise ValueError(f"algo {algorithm.name!r} needs {algorithm.workspace_bytes(problem.with_batch(1), direction)} "
                         f"workspace bytes per image for {direction}, over the limit of {limit} bytes")
    batch = problem.N
    while batch > 1 and algorithm.workspace_bytes(problem.with_batch(batch), direction) > limit:
        batch = min(batch - 1, max(1, batch * limit // max(algorithm.workspace_bytes(problem.with_batch(batch),
                                                                                         direction), 1)))
    sizes = [batch] * (problem.N // batch) + ([problem.N % batch] if problem.N % batch else [])
    return Plan(tuple((n, algorithm) for n in sizes), max(algorithm.workspace_bytes(problem.with_batch(n), direction)
                                                          for n in set(sizes)))
