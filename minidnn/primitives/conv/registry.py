"""The convolution algorithm registry and the settings every convolution call reads.

An algorithm is an object with a ``name`` that, for each direction, says whether it supports a
problem and how many workspace bytes it needs, and runs it into an output array the caller
provides. Each lives in its own file in this package and registers itself on import.
:mod:`.selection` chooses among them (cuDNN's ``Get`` and ``Find``), :mod:`.api` runs the choice.

Settings (process-wide defaults, overridable per call or per ``with settings(...)`` block):

* ``algo``: ``"auto"`` or an algorithm's name (``MINIDNN_ALGO``);
* ``workspace_limit``: bytes of workspace one call may use (``MINIDNN_WORKSPACE_MB``, 64 MiB);
* ``benchmark``: time the algorithms (``find``) rather than guess (``get``); ``None`` means
  "on the GPU, yes; on the CPU, no" (``MINIDNN_CONV_FIND=1`` or ``0`` forces it);
* ``microbatch``: ``"off"`` (undivided: the whole batch in one call, as cuDNN), ``"wr"`` or ``"wd"``
  (μ-cuDNN's per-layer and whole-network plans, :mod:`.planner`), with ``batch_policy`` giving the
  micro-batch sizes a plan may use;
* ``deterministic`` (:func:`use_deterministic_algorithms`, PyTorch's name): only algorithms whose
  result does not depend on the order in which the device schedules their work, for every
  direction; a forced algorithm that is not raises a ``RuntimeError`` (a warning with
  ``warn_only=True``).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Callable, Iterator

from ... import backend
from .. import _cuda, convert, layout
from .problem import DIRECTIONS, ConvProblem

MiB = 1 << 20
# μ-cuDNN's default limit per convolution call.
DEFAULT_WORKSPACE_LIMIT = 64 * MiB
MICROBATCH_MODES = ("off", "wr", "wd")
BATCH_POLICIES = ("undivided", "powers_of_two", "all")


class ConvAlgorithm:
    """Base class: one convolution algorithm, all three directions.

    Subclasses set ``name`` (and ``deterministic``: False when some direction's results may change
    from run to run, e.g. with atomic additions of partial sums, whose order the scheduler decides;
    such an algorithm overrides :meth:`is_deterministic` to say which directions; ``automatic``:
    False for an algorithm that runs only when asked for by name, which ``find`` offers only when
    nothing else fits; ``half_precision``: True for one that runs float16 and bfloat16 problems too,
    float32 arithmetic on half storage, see :func:`supports`), and implement
    ``supports``, ``workspace_bytes`` and the directions they support, on arrays of one
    (micro-)batch:

    * ``forward(x, w, problem, out, workspace)``: y into ``out`` (N, K, P, Q);
    * ``backward_data(dy, w, problem, out, workspace)``: dx into ``out`` (N, C, H, W);
    * ``backward_filter(x, dy, problem, out, accumulate, workspace)``: dw into ``out``
      (K, C/groups, R, S), added to it when ``accumulate`` (cuDNN's beta = 1), so micro-batches
      sum without a temporary.

    ``out`` is a C-contiguous array of the problem's dtype on the inputs' device; for backward-filter of a
    half-precision problem it may be float32 instead where ``float32_weight_gradient`` is True: the gradient
    as the algorithm accumulates it, never rounded to the half type (:func:`~.api.conv2d_backward_filter`'s
    ``dtype``; api rounds and widens for an algorithm without it). ``workspace``
    is a 1-D uint8 array of at least ``workspace_bytes(problem, direction)`` bytes on that
    device (carve typed arrays from it with :func:`workspace_array`), or None when the algorithm
    needs none. Inputs are C-contiguous, except for an algorithm whose ``channels_last`` is True: it takes
    x, dy and w in either layout (C-contiguous or channels-last, primitives/layout.py) as they are, and writes
    forward's and backward-data's ``out`` in the layout ``out`` has (:meth:`run_in_layout` gives the others
    C-contiguous copies and lays their results out as asked).
    """

    name = "abstract"
    deterministic = True
    automatic = True
    half_precision = False
    float32_weight_gradient = False
    channels_last = False
    # Its whole GPU work on C-contiguous operands is launches through _cuda and GEMMs through blas, worked out from the
    # problem alone (not from the operands' addresses): api may then keep a call's recording as a ready call
    # (_cuda.ReadyCall) and replay it for the call's repeats.
    replayable = False

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        raise NotImplementedError

    def is_deterministic(self, problem: ConvProblem, direction: str) -> bool:
        """Whether ``direction`` of ``problem`` gives the same bits on every run (cuDNN's per-algorithm
        ``determinism``): by default ``deterministic``, the same answer for every direction and device."""
        return self.deterministic

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        """Workspace needed to run ``problem`` (its whole batch of ``problem.N`` images) in one call."""
        raise NotImplementedError

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        raise NotImplementedError

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        raise NotImplementedError

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        raise NotImplementedError

    def ready_launch(self, direction: str, problem: ConvProblem) -> Callable[[Any, Any], Any] | None:
        """``direction`` of ``problem`` as one call ``(first, second) -> out`` on C-contiguous operands, everything
        but the output and the launch worked out now: what api keeps for a call repeated every step. None (the
        default) where the algorithm has no such form."""
        return None

    def recorded_call(self, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
                      workspace: Any) -> "_cuda.ReadyCall | None":
        """Run ``direction`` on the GPU (C-contiguous operands, nothing accumulated) under a recording, and return it
        as a ready call over ``(first, second, out, workspace)``: its repeats replay the recorded steps on their own
        arrays (for a ``replayable`` algorithm; api keeps it, ``find`` times it). None where a step ran on memory the
        call made for itself, which a replay could not place (see :class:`~minidnn.primitives._cuda.ReadyCall`)."""
        with _cuda.recording() as steps:
            self.run_in_layout(direction, first, second, problem, out, False, workspace)
        try:
            return _cuda.ReadyCall(steps, (first, second, out, workspace), (), ())
        except (ValueError, TypeError):
            return None

    def run(self, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any, accumulate: bool,
            workspace: Any) -> None:
        """Run one direction by name (the dispatcher and ``find`` call this)."""
        if direction == "forward":
            self.forward(first, second, problem, out, workspace)
        elif direction == "backward_data":
            self.backward_data(first, second, problem, out, workspace)
        else:
            self.backward_filter(first, second, problem, out, accumulate, workspace)

    def run_in_layout(self, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
                      accumulate: bool, workspace: Any) -> None:
        """:meth:`run` on operands of either layout (api's segments and ``find``'s timings both call this): an
        algorithm without channels-last kernels gets C-contiguous copies, and its y or dx, written C-contiguous,
        is laid out as ``out`` is afterwards."""
        if self.channels_last:
            self.run(direction, first, second, problem, out, accumulate, workspace)
            return
        first, second = layout.contiguous(first), layout.contiguous(second)
        if direction == "backward_filter" or out.flags.c_contiguous:
            self.run(direction, first, second, problem, out, accumulate, workspace)
            return
        result = backend.get_array_module(out).empty(out.shape, dtype=out.dtype)
        self.run(direction, first, second, problem, result, accumulate, workspace)
        layout.copy_into(out, result)

    def __repr__(self) -> str:
        return f"<conv algorithm {self.name!r}>"


def workspace_array(workspace: Any, shape: tuple[int, ...], dtype: Any, offset: int = 0) -> Any:
    """A C-contiguous array of ``shape`` and ``dtype`` laid over ``workspace`` from byte ``offset``."""
    import numpy as np  # noqa: PLC0415

    dtype = np.dtype(dtype)
    count = 1
    for n in shape:
        count *= n
    end = offset + count * dtype.itemsize
    if workspace is None or workspace.size < end:
        raise ValueError(f"workspace of {0 if workspace is None else workspace.size} bytes is too small for "
                         f"{count} {dtype} values at byte {offset}")
    return workspace[offset:end].view(dtype).reshape(shape)


_algorithms: dict[str, ConvAlgorithm] = {}
# Caches that depend on the registered algorithms or on a whole-network plan (plans, find results in
# memory): emptied when an algorithm registers or the WD planner solves the network. Modules that keep
# such caches add their clear() here, so that whoever invalidates them needs to know none of them.
cache_clearers: list = []


def clear_caches() -> None:
    """Empty every cache that depends on the algorithms or the network's plans (see :data:`cache_clearers`)."""
    for clear in cache_clearers:
        clear()
    _Settings.generation += 1


def register(algorithm: ConvAlgorithm) -> ConvAlgorithm:
    """Add an algorithm (its name must be new)."""
    if algorithm.name in _algorithms:
        raise ValueError(f"a convolution algorithm named {algorithm.name!r} is already registered")
    _algorithms[algorithm.name] = algorithm
    clear_caches()
    return algorithm


def algorithms() -> dict[str, ConvAlgorithm]:
    """All registered algorithms by name."""
    return dict(_algorithms)


def get(name: str) -> ConvAlgorithm:
    """The algorithm called ``name``, or a ``ValueError`` listing the names there are."""
    try:
        return _algorithms[name]
    except (KeyError, TypeError):
        raise ValueError(f"algo must be 'auto' or one of {sorted(_algorithms)}, got {name!r}") from None


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    return direction


# ----------------------------------------------------------------------------------------------
# Settings: per process, overridable per call or per block
# ----------------------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """``"64MiB"``, ``"512KiB"``, ``"1GiB"`` or ``"1048576"`` (bytes) -> bytes.

    Only the binary suffixes KiB, MiB, GiB (and a plain integer, bytes) are accepted, so
    ``"8 MB"`` or ``"-1"`` are errors rather than a guess.
    """
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
    value = str(text).strip()
    for suffix, scale in units.items():
        if value.endswith(suffix) and value[:-len(suffix)].isdigit():
            return int(value[:-len(suffix)]) * scale
    if value.isdigit():
        return int(value)
    raise ValueError(f"a workspace size must be a whole number of bytes or of KiB, MiB or GiB with no space "
                     f"(e.g. 8MiB, 512MiB, 1GiB), got {text!r}")


class _Settings(dict):
    """The process-wide settings. Every change, however made (a setter, a ``settings`` block, a test's
    monkeypatch), counts a new ``generation``: the convolutions' call cache keys on it, so a cached
    call never outlives the settings it was planned under."""

    generation = 0

    def _changed(self) -> None:
        _Settings.generation += 1

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def pop(self, *args: Any) -> Any:
        value = super().pop(*args)
        self._changed()
        return value

    def setdefault(self, key: str, default: Any = None) -> Any:
        value = super().setdefault(key, default)
        self._changed()
        return value


def _from_environment() -> _Settings:
    settings = _Settings({"algo": os.environ.get("MINIDNN_ALGO", "auto"), "workspace_limit": None,
                          "microbatch": "off", "batch_policy": "powers_of_two", "benchmark": None,
                          "deterministic": False, "deterministic_warn_only": False,
                          "for_graph": False})
    find = os.environ.get("MINIDNN_CONV_FIND")
    if find is not None:
        if find not in ("0", "1"):
            raise ValueError(f"MINIDNN_CONV_FIND must be 0 or 1, got {find!r}")
        settings["benchmark"] = find == "1"
    return settings


_defaults = _from_environment()


def _limit_from_environment() -> int:
    value = os.environ.get("MINIDNN_WORKSPACE_MB")
    if value is None:
        return DEFAULT_WORKSPACE_LIMIT
    try:
        megabytes = float(value)
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0:
        raise ValueError(f"MINIDNN_WORKSPACE_MB must be a number of MiB >= 0, got {value!r}")
    return int(megabytes * MiB)


def workspace_limit() -> int:
    """The current default workspace limit in bytes (``MINIDNN_WORKSPACE_MB`` or 64 MiB)."""
    limit = _defaults["workspace_limit"]
    return _limit_from_environment() if limit is None else limit


def default_algorithm() -> str:
    return _defaults["algo"]


def microbatch_mode() -> str:
    return _defaults["microbatch"]


def batch_policy() -> str:
    return _defaults["batch_policy"]


def benchmark(device: str) -> bool:
    """Whether ``algo="auto"`` times the algorithms (``find``) on ``device`` rather than guessing.

    The default (``None``) times on the GPU, except in the deterministic mode: bitwise-identical runs
    need the same algorithm in every run, and timing can rank two algorithms differently from one
    process to the next (PyTorch's docs say the same of ``cudnn.benchmark``, off by default there).
    ``set_benchmark(True)`` times in the deterministic mode too, among the deterministic algorithms."""
    forced = _defaults["benchmark"]
    if forced is None:
        return device == "cuda" and not _defaults["deterministic"]
    return forced


def planning_for_graph() -> bool:
    """Whether convolutions are being planned for a CUDA graph's replays (inside :func:`for_graph`): ``find``'s
    choice then weighs the GPU's time alone, where elsewhere it weighs the host's time to issue the call too
    (:func:`.selection.fastest`)."""
    return _defaults["for_graph"]


@contextlib.contextmanager
def for_graph() -> Iterator[None]:
    """Plan the convolutions run inside the block for a CUDA graph (``minidnn.cuda.graphs.capture`` wraps its
    warm-up steps and the capture in it, so that the steps it records run the plans its replays will)."""
    before = _defaults["for_graph"]
    _defaults["for_graph"] = True
    try:
        yield
    finally:
        _defaults["for_graph"] = before


def are_deterministic_algorithms_enabled() -> bool:
    """Whether the deterministic mode is on (``torch.are_deterministic_algorithms_enabled``)."""
    return _defaults["deterministic"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """Whether the deterministic mode only warns about a forced non-deterministic algorithm."""
    return _defaults["deterministic_warn_only"]


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Convolutions use only algorithms whose results do not depend on scheduling (PyTorch's
    ``torch.use_deterministic_algorithms``): ``get`` and ``find`` skip the others, and so do the
    micro-batch planners; a forced non-deterministic ``algo=`` raises a ``RuntimeError``, or with
    ``warn_only=True`` warns and runs. ``algo="auto"`` then chooses by shape on the GPU too, unless
    :func:`set_benchmark` asked for timing (see :func:`benchmark`). docs/convolution.md lists which
    algorithms are deterministic, and which other primitives are."""
    for value, name in ((mode, "mode"), (warn_only, "warn_only")):
        if not isinstance(value, bool):
            raise TypeError(f"use_deterministic_algorithms: {name} must be a bool, got {value!r}")
    _defaults["deterministic"] = mode
    _defaults["deterministic_warn_only"] = warn_only


def permitted(algorithm: ConvAlgorithm, problem: ConvProblem, direction: str) -> bool:
    """Whether ``algo="auto"`` may choose ``algorithm`` for this call under the current settings:
    always, except that the deterministic mode excludes a direction that is not deterministic."""
    return not _defaults["deterministic"] or algorithm.is_deterministic(problem, direction)


def check_forced(algorithm: ConvAlgorithm, problem: ConvProblem, direction: str) -> None:
    """A forced ``algo=`` in the deterministic mode: a ``RuntimeError`` (PyTorch's) if ``algorithm``'s
    ``direction`` is not deterministic, or a warning when the mode is ``warn_only``."""
    if permitted(algorithm, problem, direction):
        return
    deterministic = sorted(name for name, other in _algorithms.items() if supports(other, problem, direction)
                           and other.is_deterministic(problem, direction))
    message = (f"conv2d {direction} with algo={algorithm.name!r} does not have a deterministic implementation on "
               f"{problem.device}, but you set 'minidnn.use_deterministic_algorithms(True)'. Use algo='auto' or "
               f"one of {deterministic} for {problem.describe()}, or the 'warn_only=True' option if that is "
               f"acceptable for your application.")
    if _defaults["deterministic_warn_only"]:
        warnings.warn(message, UserWarning, stacklevel=5)
        return
    raise RuntimeError(message)


def check_limit(limit: Any) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"workspace_limit must be an int number of bytes, got {limit!r}")
    if limit < 0:
        raise ValueError(f"workspace_limit must be >= 0 bytes, got {limit}")
    return limit


def _check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def set_workspace_limit(limit: int) -> None:
    """Set the default workspace limit in bytes for every convolution that does not pass its own."""
    _defaults["workspace_limit"] = check_limit(limit)


def set_benchmark(enabled: bool | None) -> None:
    """``True``: ``algo="auto"`` times every algorithm once per shape (``find``), as
    ``torch.backends.cudnn.benchmark``; ``False``: it uses the shape heuristic (``get``);
    ``None``: time on the GPU, guess on the CPU (the default)."""
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"set_benchmark takes True, False or None, got {enabled!r}")
    _defaults["benchmark"] = enabled


def set_microbatch(mode: str, batch_policy: str | None = None) -> None:
    """Micro-batching of ``algo="auto"`` convolutions: ``"off"``, ``"wr"`` or ``"wd"`` (see :mod:`.planner`)."""
    _defaults["microbatch"] = _check_choice(mode, "microbatch", MICROBATCH_MODES)
    if batch_policy is not None:
        _defaults["batch_policy"] = _check_choice(batch_policy, "batch_policy", BATCH_POLICIES)


@contextlib.contextmanager
def settings(algo: str | None = None, workspace_limit: int | None = None, benchmark: bool | None = None,
             microbatch: str | None = None, batch_policy: str | None = None,
             deterministic: bool | None = None) -> Iterator[None]:
    """Override settings for convolutions run inside the block (``None`` leaves one unchanged).

    ``with conv.settings(algo="reference"): loss.backward()`` runs every direction of every
    convolution in the block with the reference algorithm (tests use this to compare paths).
    """
    before = dict(_defaults)
    try:
        if algo is not None:
            if algo != "auto":
                get(algo)
            _defaults["algo"] = algo
        if workspace_limit is not None:
            _defaults["workspace_limit"] = check_limit(workspace_limit)
        if benchmark is not None:
            set_benchmark(benchmark)
        if microbatch is not None:
            _defaults["microbatch"] = _check_choice(microbatch, "microbatch", MICROBATCH_MODES)
        if batch_policy is not None:
            _defaults["batch_policy"] = _check_choice(batch_policy, "batch_policy", BATCH_POLICIES)
        if deterministic is not None:
            use_deterministic_algorithms(deterministic, warn_only=_defaults["deterministic_warn_only"])
        yield
    finally:
        _defaults.clear()
        _defaults.update(before)


def supports(algorithm: ConvAlgorithm, problem: ConvProblem, direction: str) -> bool:
    """Whether ``algorithm`` runs ``direction`` of ``problem``: its own ``supports``, and for a half-precision
    problem only an algorithm written for half storage (the others would compute in the half type itself)."""
    return (problem.half_type is None or algorithm.half_precision) and algorithm.supports(problem, direction)


def fits(algorithm: ConvAlgorithm, problem: ConvProblem, direction: str, limit: int) -> bool:
    """Whether the algorithm supports ``problem`` and can run its whole batch within ``limit``."""
    return supports(algorithm, problem, direction) and algorithm.workspace_bytes(problem, direction) <= limit


def store_half_filter_gradient(dw: Any, out: Any, half: str, accumulate: bool) -> None:
    """A half problem's float32 weight gradient ``dw`` into ``out``: rounded to the half type ``half``, or as it
    is when ``out`` is float32; added to what ``out`` holds when ``accumulate`` (in float32, then rounded)."""
    if out.dtype == "float32":
        store_filter_gradient(dw, out, accumulate)
        return
    if accumulate:
        dw = dw + convert.half_to_float(out, half)
    convert.float_to_half(dw, half, out=out)


def store_filter_gradient(dw: Any, out: Any, accumulate: bool) -> None:
    """Write ``dw`` into ``out``, or add it there when ``accumulate`` (for algorithms whose arithmetic
    produces the weight gradient as a new array)."""
    if accumulate:
        out += dw
    else:
        out[...] = dw
