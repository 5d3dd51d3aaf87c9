"""Choosing the convolution algorithms of an eager step for the whole step, not call by call.

An eager step takes the longer of two paths: the host's, issuing every launch, and the GPU's, running them. A call
cannot see which path is the longer, so once the step repeats, whole steps are timed under sets of choices that run
from the least GPU time to the least host time (``find``'s figures), and the fastest set is kept.

Why not choose per call: ``find`` gives each call's GPU time and its host time to issue it. Where the host's path is
the step's longer one, an algorithm that saves GPU time and costs host time (Winograd's several launches against
implicit GEMM's one) makes the step slower, though it wins its own call. And a call's host time inside a step is not
what ``find`` times on the call alone, so the step is timed, as ``find`` times a call.

The sets lie on one line (:func:`front`): for a weight λ from 0 to 1, each call takes the algorithm of least
(1 − λ)·GPU time + λ·host time. λ = 0 is a CUDA graph's rule (no host between the kernels), λ = 1 the least host
time, and each set in between trades GPU time for host time where the trade is cheapest: the lower-left edge of the
step's (host, GPU) times. Along it the host's path shortens and the GPU's lengthens, so the step's time, the longer
of the two, falls and then rises: a golden-section search (:func:`golden_section`) finds its least in a few sets.
The per-call rule's own set (:func:`.selection.fastest`) is timed first, and the fastest set timed is kept.

The trial (:class:`StepTrial`) counts steps by the step's first convolution, the anchor, which takes the checked
path until the trial ends, so that it sees each call. Each set runs one warm-up step (the changed calls plan again and
make their ready forms) and ``TIMED_STEPS`` steps timed between two synchronisations of the stream. After the trial
the anchor is kept like any call. A settings change that makes new plans (under a new
``registry._Settings.generation``) starts a new trial with them; a CUDA graph's planning takes no part. A network
whose first convolution comes again later in its step has its steps timed in parts, all alike.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Generator, Sequence

from ... import backend
from . import registry, selection
from .problem import ConvProblem
from .selection import AlgoPerf

Kernel = tuple[ConvProblem, str]  # (problem, direction): one convolution call of the step

TIMED_STEPS = 2  # timed steps per set, after its warm-up step


def weighted_choice(perfs: Sequence[AlgoPerf], weight: float) -> str:
    """The algorithm of least (1 − weight)·GPU time + weight·host time (then GPU time, then workspace)."""
    best = min(perfs, key=lambda p: ((1 - weight) * p.time_ms + weight * p.host_ms, p.time_ms, p.workspace_bytes))
    return best.algorithm


def front(perfs: Sequence[Sequence[AlgoPerf]]) -> list[tuple[str, ...]]:
    """perfs: each call's ``find`` results. Every distinct set of choices, one name per call, that a weight λ in
    [0, 1] makes (:func:`weighted_choice`), in the order of λ: from the least GPU time to the least host time.

    A call's choice changes only where two of its algorithms' weighted times cross, (1 − λ)·t₁ + λ·h₁ =
    (1 − λ)·t₂ + λ·h₂, so the sets are those at λ = 0, at 1 and between each two neighbouring crossings."""
    crossings = {0.0, 1.0}
    for call in perfs:
        for i, first in enumerate(call):
            for second in call[i + 1:]:
                slope = (first.host_ms - first.time_ms) - (second.host_ms - second.time_ms)
                if slope:
                    crossing = (second.time_ms - first.time_ms) / slope
                    if 0.0 < crossing < 1.0:
                        crossings.add(crossing)
    points = sorted(crossings)
    weights = [0.0, *((a + b) / 2 for a, b in zip(points, points[1:])), 1.0]
    sets: list[tuple[str, ...]] = []
    for weight in weights:
        chosen = tuple(weighted_choice(call, weight) for call in perfs)
        if chosen not in sets:
            sets.append(chosen)
    return sets


def golden_section(count: int) -> Generator[int, float, int]:
    """The search for the least of ``count`` values that fall and then rise: yields the index of each value it needs
    and is sent that value; returns the index of the least it saw. Each round keeps the part of the bracket on the
    lower of two inner points' side, a golden ratio of it, so that about log₁.₆₂(count) values are asked for."""
    known: dict[int, float] = {}
    low, high = 0, count - 1
    while high - low > 2:
        first = low + round(0.382 * (high - low))
        inner = (first, max(first + 1, low + round(0.618 * (high - low))))
        for index in inner:
            if index not in known:
                known[index] = yield index
        if known[inner[0]] <= known[inner[1]]:
            high = inner[1]
        else:
            low = inner[0]
    for index in range(low, high + 1):
        if index not in known:
            known[index] = yield index
    return min(known, key=known.__getitem__)


@dataclasses.dataclass
class StepTrial:
    """One trial of whole-step choices (see the module docstring), for one settings generation.

    ``find_results(kernel, limit)`` gives a kernel's ``find`` results; ``synchronize()`` waits for the GPU;
    ``clock()`` is seconds. :meth:`offer` is told of each eager call ``find`` plans, :meth:`saw` of each call that
    takes the checked path (the anchor always does while the trial runs)."""

    find_results: Callable[[Kernel, int], list[AlgoPerf]]
    synchronize: Callable[[], None]
    clock: Callable[[], float] = time.perf_counter
    generation: int = 0
    kernels: dict[Kernel, tuple[int, str]] = dataclasses.field(default_factory=dict)  # -> (limit, per-call choice)
    anchor: Kernel | None = None
    running: bool = True  # False once settled: the anchor is kept again and calls are no longer watched
    front: list[tuple[str, ...]] = dataclasses.field(default_factory=list)  # see front(); one name per kernel
    sets: list[tuple[str, ...]] = dataclasses.field(default_factory=list)  # the sets timed, in order: per-call first
    step_ms: list[float] = dataclasses.field(default_factory=list)  # each timed set's mean step
    chosen: int | None = None  # the index in ``sets`` of the set kept
    _assigned: dict[Kernel, str] = dataclasses.field(default_factory=dict)
    _search: Generator[int, float, int] | None = None
    _warming: bool = True
    _timed: int = 0
    _started: float = 0.0

    def offer(self, kernel: Kernel, limit: int, per_call: str) -> str:
        """A call ``find`` plans for an eager step: the algorithm it runs now (its per-call choice ``per_call``,
        unless a set being timed or kept assigns it another under the same limit)."""
        if self.anchor is None:  # the first call: a step has begun
            self.anchor = kernel
        known = self.kernels.get(kernel)
        if known is None:
            if not self.sets:  # still the first step: part of the trial
                self.kernels[kernel] = (limit, per_call)
            return per_call
        return self._assigned.get(kernel, per_call) if known[0] == limit else per_call

    def holds(self, kernel: Kernel) -> bool:
        """Whether ``kernel``'s call must not be kept as a ready form: the anchor, while the trial runs."""
        return self.running and kernel == self.anchor

    def saw(self, kernel: Kernel) -> set[Kernel]:
        """A call on the checked path. At the anchor, a step begins: the trial moves on. Returns the kernels whose
        algorithm changed with this step (to be planned again), usually none."""
        if not self.running or kernel != self.anchor:
            return set()
        if not self.sets:  # the first step is over: every call of the step has been offered
            order = list(self.kernels)
            self.sets = [tuple(self.kernels[kernel][1] for kernel in order)]
            self.front = front([self.find_results(kernel, self.kernels[kernel][0]) for kernel in order])
            return self._settle(0) if self.front == self.sets else set()  # else the per-call set's warm-up step
        if self._warming:
            self._warming = False
            self.synchronize()
            self._started, self._timed = self.clock(), 0
            return set()
        self._timed += 1
        if self._timed < TIMED_STEPS:
            return set()
        self.synchronize()
        self.step_ms.append(1000 * (self.clock() - self._started) / TIMED_STEPS)
        following = self._following()
        if following is None:
            return self._settle(min(range(len(self.sets)), key=self.step_ms.__getitem__))
        self.sets.append(following)
        self._warming = True
        return self._assign(following)

    def _following(self) -> tuple[str, ...] | None:
        """The next set of the front to time (the search is sent the last one's time), or None when it is done."""
        try:
            if self._search is None:  # the per-call set's time is in: the search begins
                self._search = golden_section(len(self.front))
                index = next(self._search)
            else:
                index = self._search.send(self.step_ms[-1])
            while self.front[index] in self.sets:  # timed already (the per-call set lies on the front)
                index = self._search.send(self.step_ms[self.sets.index(self.front[index])])
        except StopIteration:
            return None
        return self.front[index]

    def _assign(self, chosen: tuple[str, ...]) -> set[Kernel]:
        changed = set()
        for kernel, name in zip(self.kernels, chosen):
            if self._assigned.get(kernel, self.kernels[kernel][1]) != name:
                changed.add(kernel)
            self._assigned[kernel] = name
        return changed

    def _settle(self, index: int) -> set[Kernel]:
        self.running, self.chosen = False, index
        return self._assign(self.sets[index]) | {self.anchor}  # the anchor: to be kept from now on

    def abandon(self) -> set[Kernel]:
        """End the trial on the per-call choices; the kernels to plan again."""
        changed = {kernel for kernel, name in self._assigned.items() if name != self.kernels[kernel][1]}
        self._assigned.clear()
        self.running = False
        return changed | {self.anchor}


# The trial of the current settings generation, or None before the first eager call find plans.
trial: StepTrial | None = None


def _synchronize() -> None:
    """Wait for the work queued on the anchor's GPU (nothing to wait for on the CPU)."""
    if trial is None or trial.anchor is None or trial.anchor[0].device != "cuda":
        return
    stream = backend.cupy().cuda.get_current_stream()
    if stream.is_capturing():  # a CUDA graph being recorded outside graphs.capture: no waiting inside it
        raise _Capturing
    stream.synchronize()


_clock = time.perf_counter


class _Capturing(Exception):
    pass


def _find_results(kernel: Kernel, limit: int) -> list[AlgoPerf]:
    return selection.find(kernel[0], kernel[1], limit)


def offer(problem: ConvProblem, direction: str, limit: int, per_call: str) -> str:
    """make_plan's eager choice for a call that ``find`` plans: ``per_call`` (the per-call rule's), or the set the
    trial is timing or has kept."""
    global trial
    generation = registry._Settings.generation
    if trial is None or trial.generation != generation:
        trial = StepTrial(_find_results, lambda: _synchronize(), lambda: _clock(), generation)
    return trial.offer((problem, direction), limit, per_call)


def running() -> bool:
    """Whether a trial of the current settings is timing steps."""
    return trial is not None and trial.running and trial.generation == registry._Settings.generation


def saw(problem: ConvProblem, direction: str) -> set[Kernel]:
    """A call on the checked path (see :meth:`StepTrial.saw`); the kernels to plan again."""
    if not running():
        return set()
    try:
        return trial.saw((problem, direction))
    except _Capturing:  # a graph being recorded: no timing inside it
        return trial.abandon()


def holds(problem: ConvProblem, direction: str) -> bool:
    """Whether the call must not be kept as a ready form (the anchor, while its trial runs)."""
    return running() and trial.holds((problem, direction))


def clear() -> None:
    """Forget the trial (a new one starts with the next eager call find plans)."""
    global trial
    trial = None


registry.cache_clearers.append(clear)


def summary() -> dict[str, Any] | None:
    """The last trial's outcome: its (problem, direction) calls, the sets timed (each as how many of those calls take
    each algorithm, in the order timed, the per-call rule's first), each set's mean step in ms, and the index of the
    set kept (None while the trial runs)."""
    if trial is None or not trial.sets:
        return None
    return {"calls": len(trial.kernels), "sets": len(trial.sets),
            "algorithms": [dict(sorted(collections.Counter(chosen).items())) for chosen in trial.sets],
            "step_ms": [round(v, 4) for v in trial.step_ms], "chosen": trial.chosen}
