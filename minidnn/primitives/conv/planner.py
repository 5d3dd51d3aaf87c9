"""μ-cuDNN's micro-batch planner: run a convolution's batch as micro-batches, each with its best algorithm.

The fast algorithms (im2col GEMM, Winograd, FFT) need workspace in proportion to the batch, so
under a workspace limit cuDNN falls back to a slow one for the whole batch. The same fast
algorithm on a micro-batch of b images needs about b/B of the workspace: splitting the batch
trades a little per-call efficiency for a faster algorithm, with the same arithmetic (Oyama et
al., μ-cuDNN, 2018). From the measured time and workspace of every algorithm at every candidate
micro-batch size (a cost table, ``{b: find(problem with N = b)}``) two planners choose the split:

* WR, workspace reuse (one limit per call): the fastest split whose every micro-batch fits the
  limit, T(b) = min(t*(b), min over b' ≤ b/2 of t*(b') + T(b − b')).
* WD, workspace division (one budget for the whole network): each kernel's Pareto front of
  (time, workspace) splits, then one split per kernel minimising the total time with the total
  workspace within the budget: a multiple-choice knapsack, solved exactly.

The dynamic programmes (:func:`wr_plan`, :func:`wd_front`, :func:`wd_solve`) are pure functions
of cost tables; :func:`plan` and :func:`solve_network` feed them from ``find`` and turn their
answers into :class:`plans.Plan`. docs/microbatching.md derives them and says why they are exact.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import warnings
from typing import Callable, Iterable, Sequence, TypeVar

import numpy as np

from ... import backend
from .._checks import check_int
from . import plans, registry, selection
from .problem import ConvProblem
from .selection import AlgoPerf

Kernel = tuple[ConvProblem, str]  # (problem, direction): one convolution call a network makes
CostTable = dict[int, list[AlgoPerf]]  # micro-batch size -> every algorithm's time and workspace at that size


@dataclasses.dataclass(frozen=True)
class Option:
    """One way to run a batch: ``segments`` of (images, algorithm name) in batch order, their summed
    predicted ``time_ms``, and ``workspace_bytes``, the most any segment needs (they run one after
    another and share one workspace)."""

    time_ms: float
    workspace_bytes: int
    segments: tuple[tuple[int, str], ...]

    def describe(self) -> str:
        """``"128 gemm + 2x64 winograd_4x4"``: runs of equal micro-batches as count x images."""
        runs: list[list] = []
        for segment in self.segments:
            if runs and runs[-1][1] == segment:
                runs[-1][0] += 1
            else:
                runs.append([1, segment])
        return " + ".join(f"{count}x{images} {name}" if count > 1 else f"{images} {name}"
                          for count, (images, name) in runs)


# ----------------------------------------------------------------------------------------------
# Pure functions of cost tables
# ----------------------------------------------------------------------------------------------
def candidate_sizes(batch: int, policy: str) -> list[int]:
    """The micro-batch sizes a plan may use, ascending: ``undivided`` {B}; ``powers_of_two``
    {1, 2, 4, …, 2^⌊log₂B⌋} ∪ {B}; ``all`` {1, …, B}."""
    check_int(batch, "batch", minimum=1)
    if policy == "undivided":
        return [batch]
    if policy == "powers_of_two":
        return sorted({1 << k for k in range(batch.bit_length())} | {batch})
    if policy == "all":
        return list(range(1, batch + 1))
    raise ValueError(f"batch_policy must be one of {', '.join(map(repr, registry.BATCH_POLICIES))}, got {policy!r}")


Point = TypeVar("Point", AlgoPerf, Option)


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """The points no other point beats: kept only if none is at least as fast with at most as much
    workspace (of identical points, the first given). Sorted by workspace, so time falls."""
    front: list[Point] = []
    for point in sorted(points, key=lambda p: (p.workspace_bytes, p.time_ms)):
        # Everything before `point` needs no more workspace; front[-1] is the fastest of them.
        if not front or point.time_ms < front[-1].time_ms:
            front.append(point)
    return front


def fastest_within(costs: CostTable, limit: int) -> dict[int, AlgoPerf]:
    """t*(b): for each size, its fastest algorithm within ``limit`` bytes (on a tie in time, the one
    with less workspace, then the first by name); sizes where nothing fits are left out."""
    fastest = {}
    for size, perfs in costs.items():
        fitting = [p for p in perfs if p.workspace_bytes <= limit]
        if fitting:
            fastest[size] = min(fitting, key=lambda p: (p.time_ms, p.workspace_bytes, p.algorithm))
    return fastest


def _best_split(fastest: dict[int, AlgoPerf], batch: int) -> Option | None:
    """WR's dynamic programme over b = 1 … batch, using only the sizes in ``fastest``; None if no
    sum of them makes ``batch``.

    best[b] = (time, micro-batches, workspace, first part) of the best way to run b images, compared
    in that order: fastest, then fewest micro-batches, then least workspace. A split b = b' + rest
    needs only b' ≤ b/2 (some part of any split is at most half), and the rest is best[b − b']:
    time and count add and workspace takes the max, all monotone, so a better rest never makes a
    worse whole. O(batch · sizes).
    """
    parts = [(size, fastest[size].time_ms, fastest[size].workspace_bytes) for size in sorted(fastest) if size <= batch]
    unreachable = (math.inf, 0, 0, 0)
    best = [unreachable] * (batch + 1)
    for b in range(1, batch + 1):
        whole = fastest.get(b)
        choice = (whole.time_ms, 1, whole.workspace_bytes, b) if whole is not None else unreachable
        for part, part_time, part_workspace in parts:
            if 2 * part > b:
                break
            rest_time, rest_count, rest_workspace, _ = best[b - part]
            time_ms = part_time + rest_time
            if time_ms > choice[0]:  # the common case, decided without building a tuple
                continue
            split = (time_ms, rest_count + 1, max(part_workspace, rest_workspace), part)
            if split < choice:
                choice = split
        best[b] = choice
    if best[batch] is unreachable:
        return None
    segments, remaining = [], batch
    while remaining:
        part = best[remaining][3]
        segments.append((part, fastest[part].algorithm))
        remaining -= part
    segments.sort(key=lambda segment: -segment[0])  # largest micro-batches first: reads like 128 + 64 + 64
    time_ms, _, workspace, _ = best[batch]
    return Option(time_ms, workspace, tuple(segments))


def wr_plan(costs: CostTable, batch: int, limit: int) -> Option:
    """WR: the fastest way to run ``batch`` images as micro-batches of the table's sizes, each call
    within ``limit`` workspace bytes (ties: fewer micro-batches, then less workspace).

    ``costs``: {micro-batch size: [AlgoPerf, ...]}; a size missing from it is not a candidate.
    """
    option = _best_split(fastest_within(costs, limit), batch)
    if option is None:
        raise ValueError(f"no split of a batch of {batch} into micro-batches of sizes {sorted(costs)} fits a "
                         f"workspace limit of {limit} bytes: some size has no algorithm within it")
    return option


def wd_front(costs: CostTable, batch: int, budget: int) -> list[Option]:
    """μ-cuDNN's D(B): the Pareto front of (time, workspace) over every split of ``batch`` into
    micro-batches and every choice of algorithm per micro-batch, each within ``budget`` bytes.

    A split's workspace is the largest of its parts', one of the workspaces in the table (of the
    per-size fronts: a dominated algorithm can always be swapped for the one that beats it). At
    each such value m, WR with limit m is the fastest split needing at most m, so the WR plans at
    all of them dominate every split, and their front is the front. Walking down from the budget,
    WR at m returns a plan needing some w ≤ m, and WR at every value from w to m returns that same
    plan, so the next limit to try is the largest value below w: one WR per front point, about.
    """
    fronts = {size: pareto_front(perfs) for size, perfs in costs.items()}
    limits = sorted({p.workspace_bytes for perfs in fronts.values() for p in perfs if p.workspace_bytes <= budget})
    options = []
    while limits:
        option = _best_split(fastest_within(fronts, limits[-1]), batch)
        if option is None:  # a smaller limit leaves fewer algorithms: no split there either
            break
        options.append(option)
        limits = limits[:bisect.bisect_left(limits, option.workspace_bytes)]
    return pareto_front(options)


def wd_solve(fronts: Sequence[Sequence[Option]], budget: int, counts: Sequence[int] | None = None) -> list[Option]:
    """WD: one option per kernel minimising Σ count·time subject to Σ count·workspace ≤ ``budget``.

    ``fronts[k]``: kernel k's options (its :func:`wd_front`); ``counts[k]``: how many calls of kernel
    k a step makes (default 1 each: e.g. layers of one shape share a plan).

    A multiple-choice knapsack, solved exactly by a DP over the kernels that keeps the Pareto front
    of partial solutions (total workspace, total time) over kernels 0 … k. A partial solution that
    another beats in both can be dropped: whatever options complete it complete the other at no
    more workspace and no more time, so the optimum survives without it. Partial solutions whose
    workspace leaves too little for the least-workspace options of the kernels still to come are
    dropped as well. The answer is the fastest point of the last front (on a tie in time, the one
    with less workspace).
    """
    budget = check_int(budget, "budget", minimum=0)
    counts = [1] * len(fronts) if counts is None else [check_int(c, "counts[k]", minimum=1) for c in counts]
    if len(counts) != len(fronts):
        raise ValueError(f"counts must have one entry per kernel ({len(fronts)}), got {len(counts)}")
    if not fronts or any(len(front) == 0 for front in fronts):
        raise ValueError("wd_solve needs at least one kernel, and at least one option for each")
    least = [count * min(o.workspace_bytes for o in front) for front, count in zip(fronts, counts)]
    if sum(least) > budget:
        raise ValueError(f"a total workspace budget of {budget} bytes is infeasible: the least-workspace plans "
                         f"of the {len(fronts)} kernels need {sum(least)} bytes together")
    still_needed = np.cumsum([0] + least[::-1])[::-1]  # still_needed[k]: least workspace of kernels k, k+1, …
    workspace, time = np.zeros(1, np.int64), np.zeros(1)
    steps = []  # per kernel: (index of the partial solution extended, option chosen) for each point kept
    for k, (front, count) in enumerate(zip(fronts, counts)):
        option_workspace = np.array([o.workspace_bytes for o in front], np.int64) * count
        option_time = np.array([o.time_ms for o in front]) * count
        total_workspace = (workspace[:, None] + option_workspace[None, :]).ravel()
        total_time = (time[:, None] + option_time[None, :]).ravel()
        order = np.lexsort((total_time, total_workspace))  # by workspace, then time; stable on ties
        order = order[total_workspace[order] <= budget - still_needed[k + 1]]
        times = total_time[order]
        faster_than_all_before = times < np.concatenate(([np.inf], np.minimum.accumulate(times)[:-1]))
        order = order[faster_than_all_before]
        steps.append(np.divmod(order, len(front)))
        workspace, time = total_workspace[order], total_time[order]
    point = len(time) - 1  # the front is sorted by workspace with falling time: the last point is fastest
    chosen = []
    for front, (parents, options) in zip(reversed(fronts), reversed(steps)):
        chosen.append(front[options[point]])
        point = parents[point]
    return chosen[::-1]


# ----------------------------------------------------------------------------------------------
# Wiring: find's measurements in, plans.Plan out
# ----------------------------------------------------------------------------------------------
def cost_table(problem: ConvProblem, direction: str, limit: int, policy: str) -> CostTable:
    """``find`` at every candidate micro-batch size of ``problem``'s batch (measured once, then cached)."""
    return {size: selection.find(problem.with_batch(size), direction, limit)
            for size in candidate_sizes(problem.N, policy)}


def to_plan(option: Option, problem: ConvProblem, direction: str, arena: object = None) -> plans.Plan:
    """The executable plan of ``option``; its workspace is what the algorithms themselves say they need."""
    segments = tuple((images, registry.get(name)) for images, name in option.segments)
    workspace = max(algorithm.workspace_bytes(problem.with_batch(images), direction) for images, algorithm in segments)
    return plans.Plan(segments, workspace, arena)


# WD's state: the kernels seen in "wd" mode (with the batch policy they ran under), the plans the
# last solve_network chose, and the kernels that appeared after it and were warned about.
_registered: dict[Kernel, str] = {}
_solved: dict[Kernel, plans.Plan] = {}
_warned: set[Kernel] = set()


def plan(problem: ConvProblem, direction: str, limit: int, mode: str, policy: str) -> plans.Plan:
    """The plan for one kernel (``api.make_plan`` calls this for ``algo="auto"`` when micro-batching).

    ``"wr"``: WR under ``limit``. ``"wd"``: the plan :func:`solve_network` chose for this kernel; before
    it has run, or for a kernel it did not see, the WR plan under ``limit``, and the kernel is
    registered for the next :func:`solve_network`. Both choose among the algorithms ``find`` offers,
    so in the deterministic mode only deterministic ones; a WD plan solved with the mode off that uses a
    non-deterministic one is not used with it on (the WR plan runs, with a warning, until
    solve_network() runs again).
    """
    if mode not in ("wr", "wd"):
        raise ValueError(f"mode must be 'wr' or 'wd', got {mode!r}")
    kernel = (problem, direction)
    if mode == "wd":
        solved = _solved.get(kernel)
        stale = solved is not None and not all(registry.permitted(algorithm, problem.with_batch(images), direction)
                                               for images, algorithm in solved.segments)
        if solved is not None and not stale:
            return solved
        if _solved and kernel not in _warned:
            _warned.add(kernel)
            why = ("has a WD plan with an algorithm the deterministic mode excludes" if stale
                   else "first ran after solve_network()")
            warnings.warn(f"conv2d {direction} of {problem.describe()} {why}: it uses its WR plan under the "
                          f"{limit}-byte limit per call until solve_network() runs again", RuntimeWarning,
                          stacklevel=5)
        _registered[kernel] = policy
    return to_plan(wr_plan(cost_table(problem, direction, limit, policy), problem.N, limit), problem, direction)


def solve_network(budget: int, counts: dict[Kernel, int] | None = None) -> dict[Kernel, Option]:
    """WD over every kernel registered since :func:`reset_network`: choose each one's plan, allocate
    one workspace arena per device, and make later convolutions use them.

    ``budget``: total workspace bytes, Σ over kernels of count × workspace (μ-cuDNN's meaning: what
    the kernels would hold with a buffer each). ``counts``: calls per training step of each
    (problem, direction), e.g. from the number of layers of that shape; registered kernels absent
    from it count once, and kernels in it that never registered are ignored.
    Since convolutions run one at a time, every kernel uses one shared arena from offset 0, so the
    arena is only as large as the largest plan's workspace (at most the budget).
    Returns each kernel's chosen option.
    """
    budget = check_int(budget, "budget", minimum=0)
    if not _registered:
        raise ValueError("solve_network: no convolution has run in 'wd' micro-batch mode since reset_network(); "
                         "run one forward and backward pass under conv.settings(microbatch='wd') first")
    counts = counts or {}
    kernels = list(_registered)
    fronts = [wd_front(cost_table(problem, direction, budget, _registered[(problem, direction)]), problem.N, budget)
              for problem, direction in kernels]
    chosen = wd_solve(fronts, budget, [counts.get(kernel, 1) for kernel in kernels])
    plans = {kernel: to_plan(option, *kernel) for kernel, option in zip(kernels, chosen)}
    arenas = {}
    for device in {problem.device for problem, _ in kernels}:
        size = max(plan.workspace_bytes for (problem, _), plan in plans.items() if problem.device == device)
        xp = np if device == "cpu" else backend.cupy()
        arenas[device] = xp.empty(size, dtype=np.uint8) if size else None
    _solved.clear()
    _solved.update({(problem, direction): dataclasses.replace(plan, arena=arenas[problem.device])
                    for (problem, direction), plan in plans.items()})
    _warned.clear()
    registry.clear_caches()  # plans made before the solve: drop them so every call asks plan() again
    return dict(zip(kernels, chosen))


def solve_step(step: Callable[[], object], limit: int) -> int:
    """Run ``step()`` (one training step, in "wd" mode) while counting its convolution calls per
    (problem, direction), then :func:`solve_network` within :func:`network_budget`. Returns the budget."""
    calls: dict[Kernel, int] = {}
    observer = plans.call_observer

    def count(direction: str, problem: ConvProblem, plan: plans.Plan) -> None:
        calls[problem, direction] = calls.get((problem, direction), 0) + 1
        if observer is not None:
            observer(direction, problem, plan)

    plans.call_observer = count
    try:
        step()
    finally:
        plans.call_observer = observer
    budget = network_budget(limit, calls)
    solve_network(budget, calls)
    return budget


def network_budget(limit: int, counts: dict[Kernel, int]) -> int:
    """The WD budget that keeps every WR plan under ``limit`` affordable: the per-call limit times the
    number of convolution calls a step makes (``counts``: calls per (problem, direction))."""
    return limit * sum(counts.values())


def reset_network() -> None:
    """Forget the registered kernels and the solved plans (and their arenas)."""
    _registered.clear()
    _solved.clear()
    _warned.clear()
    registry.clear_caches()


def total_time(options: Iterable[Option], counts: Iterable[int]) -> float:
    """Σ count × predicted time: a step's convolution time under these options."""
    return math.fsum(option.time_ms * count for option, count in zip(options, counts))
