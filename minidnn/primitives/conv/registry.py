"""The convolution algorithm registry, the workspace limit and algorithm selection (cuDNN's shape).

An algorithm is an object with a ``name`` that, for each direction, says whether it supports a
problem and how many workspace bytes it needs, and runs it. Each lives in its own file in this
package and registers itself on import. Selection mirrors cuDNN's ``cudnnGet*Algorithm``: walk
the algorithms in order of preference and take the first that supports the problem and fits the
workspace limit (``priority`` orders them). Any algorithm can run a problem as micro-batches (slices of the batch), so an
algorithm fits when one image fits; :mod:`.api` splits the batch to the limit.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .problem import DIRECTIONS, ConvProblem

MiB = 1 << 20
# μ-cuDNN's default. A trade-off measured on the H200 (docs/benchmarks.md): 256 MiB runs ResNet-18
# (224², batch 64) 28 % faster, in fewer micro-batches, but raises its peak memory above the naive
# Caffe-style engine's; 64 MiB keeps every benchmarked model's peak below it.
DEFAULT_WORKSPACE_LIMIT = 64 * MiB


class ConvAlgorithm:
    """Base class: one convolution algorithm, all three directions.

    Subclasses set ``name`` (and ``deterministic``), and implement ``supports``,
    ``workspace_bytes`` and the three compute methods on arrays of one (micro-)batch:

    * ``forward(x, w, problem) -> y``
    * ``backward_data(dy, w, problem) -> dx``
    * ``backward_filter(x, dy, problem, out, accumulate) -> dw``: writes into ``out`` when given,
      adding to it when ``accumulate`` (cuDNN's beta = 1), so micro-batches sum without a temporary.
    """

    name = "abstract"
    deterministic = True
    priority = 50  # order of preference for "auto": lower first

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        raise NotImplementedError

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        """Workspace needed to run ``problem`` (its whole batch) in one call."""
        raise NotImplementedError

    def forward(self, x: Any, w: Any, problem: ConvProblem) -> Any:
        raise NotImplementedError

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem) -> Any:
        raise NotImplementedError

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<conv algorithm {self.name!r}>"


_algorithms: dict[str, ConvAlgorithm] = {}
# Plans already made: (problem, direction, algo, limit) -> (algorithm, micro-batch, workspace bytes).
# Registering an algorithm can change the answers, so it empties this cache.
plans: dict[tuple, tuple] = {}


def register(algorithm: ConvAlgorithm) -> ConvAlgorithm:
    """Add an algorithm; ``"auto"`` tries algorithms in order of their ``priority`` (lower first)."""
    if algorithm.name in _algorithms:
        raise ValueError(f"a convolution algorithm named {algorithm.name!r} is already registered")
    _algorithms[algorithm.name] = algorithm
    ordered = sorted(_algorithms.values(), key=lambda a: a.priority)
    _algorithms.clear()
    _algorithms.update((a.name, a) for a in ordered)
    plans.clear()
    return algorithm


def algorithms() -> dict[str, ConvAlgorithm]:
    """All registered algorithms by name, in order of preference."""
    return dict(_algorithms)


def get(name: str) -> ConvAlgorithm:
    try:
        return _algorithms[name]
    except KeyError:
        raise ValueError(f"algo must be 'auto' or one of {sorted(_algorithms)}, got {name!r}") from None


# ----------------------------------------------------------------------------------------------
# Defaults: workspace limit and forced algorithm, per process, overridable per call or per block
# ----------------------------------------------------------------------------------------------
def _limit_from_environment() -> int:
    value = os.environ.get("MINIDNN_WORKSPACE_MB")
    if value is None:
        return DEFAULT_WORKSPACE_LIMIT
    try:
        return int(float(value) * MiB)
    except ValueError:
        raise ValueError(f"MINIDNN_WORKSPACE_MB must be a number of MiB, got {value!r}") from None


_defaults = {"algo": os.environ.get("MINIDNN_ALGO", "auto"), "workspace_limit": None}


def workspace_limit() -> int:
    """The current default workspace limit in bytes (``MINIDNN_WORKSPACE_MB`` or 64 MiB)."""
    limit = _defaults["workspace_limit"]
    return _limit_from_environment() if limit is None else limit


def default_algorithm() -> str:
    return _defaults["algo"]


def _check_limit(limit: Any) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"workspace_limit must be an int number of bytes, got {limit!r}")
    if limit < 0:
        raise ValueError(f"workspace_limit must be >= 0 bytes, got {limit}")
    return limit


def set_workspace_limit(limit: int) -> None:
    """Set the default workspace limit in bytes for every convolution that does not pass its own."""
    _defaults["workspace_limit"] = _check_limit(limit)


@contextlib.contextmanager
def settings(algo: str | None = None, workspace_limit: int | None = None) -> Iterator[None]:
    """Force an algorithm and/or a workspace limit for convolutions run inside the block.

    ``with conv.settings(algo="reference"): loss.backward()`` runs every direction of every
    convolution in the block with the reference algorithm (tests use this to compare paths).
    """
    before = dict(_defaults)
    if algo is not None:
        if algo != "auto":
            get(algo)
        _defaults["algo"] = algo
    if workspace_limit is not None:
        _defaults["workspace_limit"] = _check_limit(workspace_limit)
    try:
        yield
    finally:
        _defaults.update(before)


# ----------------------------------------------------------------------------------------------
# Selection
# ----------------------------------------------------------------------------------------------
def fits(algorithm: ConvAlgorithm, problem: ConvProblem, direction: str, limit: int) -> bool:
    """Whether the algorithm can run the problem within ``limit``, one image at a time if need be."""
    return algorithm.workspace_bytes(problem.with_batch(1), direction) <= limit


def choose(problem: ConvProblem, direction: str, algo: str, limit: int) -> ConvAlgorithm:
    """The algorithm to run: the named one (checked), or for ``"auto"`` the first that fits."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if algo != "auto":
        algorithm = get(algo)
        if not algorithm.supports(problem, direction):
            raise ValueError(f"algo {algo!r} does not support {direction} of {problem.describe()} on {problem.device}")
        if not fits(algorithm, problem, direction, limit):
            raise ValueError(f"algo {algo!r} needs {algorithm.workspace_bytes(problem.with_batch(1), direction)} "
                             f"workspace bytes per image for {direction}, over the limit of {limit} bytes")
        return algorithm
    for algorithm in _algorithms.values():
        if algorithm.supports(problem, direction) and fits(algorithm, problem, direction, limit):
            return algorithm
    raise ValueError(f"no convolution algorithm supports {direction} of {problem.describe()} "
                     f"within a workspace limit of {limit} bytes")


def store_filter_gradient(dw: Any, out: Any, accumulate: bool) -> Any:
    """Return ``dw`` as the result, or write it into ``out`` (adding when ``accumulate``)."""
    if out is None:
        return dw
    if accumulate:
        out += dw
    else:
        out[...] = dw
    return out
