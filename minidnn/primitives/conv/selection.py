"""Choosing a convolution algorithm, as cuDNN does: ``get`` guesses by shape, ``find`` measures.

* :func:`get` (cuDNN's ``cudnnGetConvolution*Algorithm``): a rule of thumb by problem shape, no
  timing; the first algorithm of its preference list that supports the problem and fits the
  workspace limit.
* :func:`find` (``cudnnFindConvolution*Algorithm``): runs every supported algorithm whose workspace
  fits the limit on random data of the problem's shape, and returns them sorted by time, each
  with its time and workspace bytes. Algorithms marked ``automatic = False`` (the float64
  reference) are left out unless nothing else can run. Each result also carries the host's time to issue
  the call: ``algo="auto"`` runs :func:`fastest`, the least GPU time for a CUDA graph and the least
  max(GPU, host) time in an eager step, where the GPU waits for Python's launches.

``find`` times each algorithm on operands in the call's layout (a channels-last problem's on channels-last
arrays, so an algorithm without channels-last kernels is timed with its copies). Its results are cached per
(direction, problem, math mode) in memory, and on disk in one
JSON file per device (``$MINIDNN_CACHE_DIR/conv_find_<device>.json``, default
``~/.cache/minidnn``) whose header names the GPU and the minidnn version: a file made on another GPU or by another version,
or one that does not parse, is ignored with a warning, and the file is always replaced atomically.
Set ``MINIDNN_CACHE_DIR=""`` to keep results in memory only.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
import warnings
from typing import Any

import numpy as np

from ... import backend
from ..._version import __version__
from .. import _cuda, convert, layout
from . import gemm_1x1, implicit_gemm_nhwc, plans, registry
from .problem import ConvProblem

# 4: the host's time of the call's ready form where it has one; 3: the host's time to issue a call beside the GPU's;
# 2: GPU times with the launches queued ahead
CACHE_FORMAT = 4


@dataclasses.dataclass(frozen=True)
class AlgoPerf:
    """One algorithm's result for one problem and direction (cuDNN's ``cudnnConvolution*AlgoPerf_t``)."""

    algorithm: str
    time_ms: float
    workspace_bytes: int
    deterministic: bool
    # The host's time to issue one call (Python and launches, the GPU's work not awaited); 0 where not measured.
    host_ms: float = 0.0


# ----------------------------------------------------------------------------------------------
# get: a rule of thumb
# ----------------------------------------------------------------------------------------------
def preference(problem: ConvProblem, direction: str) -> list[str]:
    """Algorithm names in the order ``get`` tries them for this problem.

    The rules say where each algorithm's idea pays: a 1x1 stride-1 convolution is a plain GEMM, and so is a
    strided 1x1 channels-last one's backward-data, a GEMM whose rows are scattered onto dx;
    on the GPU Winograd cuts a 3x3 stride-1 layer's multiplications 2.25x (F(2x2)) to 4x (F(4x4)), and
    a 5x5 layer's 6.25x (F(4x4, 5x5)); FFT's cost
    does not grow with the filter, so it pays for 5x5 and larger filters on larger images (7x7 on the CPU);
    otherwise implicit GEMM (no workspace) on the GPU, and explicit im2col + BLAS on the CPU; a half-precision
    problem on the GPU tries ``implicit_gemm_wgmma`` (on Hopper) and ``implicit_gemm_nhwc`` before implicit GEMM
    (16-byte gathers from channels-last copies where implicit GEMM gathers 2-byte values; ``find`` times them
    all and keeps the fastest per layer and direction), and so does a float32 one in TF32 (``implicit_gemm_wgmma``'s
    TF32 build, in all three directions). A first layer's 3 channels reach those kernels padded, through a padded
    copy of x (``implicit_gemm_nhwc.padded_problem``): worth it on channels-last activations, of which implicit GEMM
    would take C-contiguous copies too, but not on C-contiguous ones, which implicit GEMM reads as they lie and was
    faster on (benchmarks/probes/tf32_channels_last_convolution.py --layers conv1_7x7), so there they come after it.
    On the CPU, Winograd's transforms are NumPy passes over memory in one thread, and its α² smaller
    products use the BLAS less well than im2col's one product per image: they cost more than the
    multiplications saved, and Winograd was slower than ``gemm`` on the 3x3 kernels of the small
    models (benchmarks/probes/cpu_conv_menu_small_models.py; docs/convolution.md, Choosing). So on
    the CPU a 3x3 layer runs ``gemm``, the algorithm ``algo="auto"`` must never be slower than (which
    :func:`get_plan` splits into micro-batches where its columns do not fit), except for its
    backward-data: implicit GEMM's NumPy twin does the same products tap by tap, each adding a
    dx-sized product that is still in cache where gemm writes all R·S of them into the column matrix
    and reads them back, and it was faster on every such kernel with at least 8 input channels per
    group (with fewer, its products are too thin for the BLAS).
    The float64 reference comes last.
    """
    names = []
    stride_1 = problem.stride == (1, 1) and problem.dilation == (1, 1)
    if problem.is_1x1 or (direction == "backward_data" and gemm_1x1.samples_pixels(problem)):
        names.append("gemm_1x1")
    if stride_1 and (problem.R, problem.S) == (3, 3) and problem.device == "cuda":
        # F(4x4) over the whole batch, else in chunks of images (its workspace bounded), else F(2x2).
        names += (["winograd_4x4", "winograd_4x4_chunked", "winograd_2x2"] if min(problem.H, problem.W) >= 16
                  else ["winograd_2x2"])
    if stride_1 and (problem.R, problem.S) == (5, 5) and problem.device == "cuda" and min(problem.H, problem.W) >= 16:
        # F(4x4, 5x5) cuts the multiplications 6.25x. On the CPU one large im2col matmul still beats its
        # transforms and batched GEMMs. The weight gradient goes first to F(7x7, 5x5): 38% fewer multiplications
        # again and larger chunks, at a larger float32 error (docs/convolution.md, Winograd, Measured).
        if direction == "backward_filter":
            names += ["winograd_7x7_5x5", "winograd_7x7_5x5_chunked"]
        names += ["winograd_4x4_5x5", "winograd_4x4_5x5_chunked"]
    # FFT from 5x5 filters on the GPU; on the CPU NumPy's FFTs beat one im2col matmul only from 7x7
    # (benchmarks/probes/cpu_fft_vs_gemm.py; docs/convolution.md, FFT, Measured).
    smallest_fft_filter = 5 if problem.device == "cuda" else 7
    if stride_1 and min(problem.R, problem.S) >= smallest_fft_filter and min(problem.H, problem.W) >= 16:
        names.append("fft")
    if problem.device == "cuda" and direction == "backward_data" and not stride_1 and problem.dilation == (1, 1):
        names.append("strided_dgrad")  # implicit GEMM's work without the taps that fall between dy's samples
    tap_by_tap = (direction == "backward_data" and (problem.R, problem.S) == (3, 3)
                  and problem.dilation == (1, 1) and problem.C // problem.groups >= 8)
    tensor_cores = []
    if problem.half_type and problem.device == "cuda":
        # whole 16-byte vectors where implicit GEMM gathers 2-byte values; on Hopper, multiplied by wgmma
        tensor_cores = ["implicit_gemm_wgmma", "implicit_gemm_nhwc"]
    elif math_mode(problem) == "tf32":
        tensor_cores = ["implicit_gemm_wgmma"]  # TF32 on Hopper: 16-byte vectors, wgmma's products
    general = ["implicit_gemm", "gemm"] if problem.device == "cuda" or tap_by_tap else ["gemm", "implicit_gemm"]
    padded_on_contiguous = not problem.channels_last and implicit_gemm_nhwc.padded_problem(problem) is not None
    names += general + tensor_cores if padded_on_contiguous else tensor_cores + general
    return names + ["reference"]


def get(problem: ConvProblem, direction: str, workspace_limit: int) -> registry.ConvAlgorithm:
    """The heuristic's choice for the whole batch within ``workspace_limit`` bytes."""
    registry.check_direction(direction)
    available = registry.algorithms()

    def usable(algorithm: registry.ConvAlgorithm | None) -> bool:
        return (algorithm is not None and registry.fits(algorithm, problem, direction, workspace_limit)
                and registry.permitted(algorithm, problem, direction))

    for name in preference(problem, direction):
        if usable(available.get(name)):
            return available[name]
    for algorithm in available.values():  # an automatic algorithm the rules do not know yet
        if algorithm.automatic and usable(algorithm):
            return algorithm
    deterministic = " deterministic" if registry.are_deterministic_algorithms_enabled() else ""
    raise ValueError(f"no{deterministic} convolution algorithm supports {direction} of {problem.describe()} "
                     f"within a workspace limit of {workspace_limit} bytes")


def get_divisible(problem: ConvProblem, direction: str, workspace_limit: int) -> registry.ConvAlgorithm | None:
    """The first automatic algorithm of the rules that may run here and fits ``workspace_limit`` on one
    image, to run in micro-batches (:func:`plans.even_split`); None if there is none."""
    available, one_image = registry.algorithms(), problem.with_batch(1)
    for name in preference(problem, direction):
        algorithm = available.get(name)
        if (algorithm is not None and algorithm.automatic and registry.permitted(algorithm, problem, direction)
                and registry.fits(algorithm, one_image, direction, workspace_limit)):
            return algorithm
    return None


def get_plan(problem: ConvProblem, direction: str, workspace_limit: int) -> plans.Plan:
    """The plan ``algo="auto"`` runs when it guesses (micro-batching off): :func:`get`'s choice, in
    :func:`whole_or_divided`, dividing on the CPU: ``gemm`` multiplies image by image there anyway, so
    its micro-batches cost little more than one call, and the next rule (implicit GEMM, no workspace)
    is slower than it on weight gradients."""
    whole = get(problem, direction, workspace_limit)
    return whole_or_divided(whole, problem, direction, workspace_limit, divide=problem.device == "cpu")


def whole_or_divided(whole: registry.ConvAlgorithm, problem: ConvProblem, direction: str, workspace_limit: int,
                     divide: bool = False) -> plans.Plan:
    """``whole`` (an algorithm that fits the whole batch) for the whole batch in one call; or, where
    ``divide`` asks for it and the rules' first choice fits only micro-batches, that choice in equal
    micro-batches. Always so where ``whole`` is the float64 reference: in the deterministic mode a
    strided weight gradient on the GPU fits only it when implicit GEMM is excluded, and micro-batches
    of a fast algorithm, added in order, beat the reference's unbounded float64 temporaries."""
    if divide or not whole.automatic:
        divisible = get_divisible(problem, direction, workspace_limit)
        if divisible is not None and divisible is not whole:
            return plans.even_split(divisible, problem, direction, workspace_limit)
    return plans.single(whole, problem, direction)


# ----------------------------------------------------------------------------------------------
# find: measure
# ----------------------------------------------------------------------------------------------
# (direction, problem, tf32) -> {algorithm name: AlgoPerf}: what has been measured so far.
_measured: dict[tuple, dict[str, AlgoPerf]] = {}
registry.cache_clearers.append(_measured.clear)


def math_mode(problem: ConvProblem) -> str:
    """``"tf32"`` when float32 products may use TF32 tensor cores, else ``"ieee"``."""
    return "tf32" if problem.dtype == np.float32 and problem.device == "cuda" and _cuda.allow_tf32() else "ieee"


def find(problem: ConvProblem, direction: str, workspace_limit: int, repeats: int = 3) -> list[AlgoPerf]:
    """Every supported automatic algorithm within ``workspace_limit``, fastest first (measured once, then
    cached); the others (the reference) only when no automatic one fits. In the deterministic mode
    (:func:`registry.use_deterministic_algorithms`) only the algorithms deterministic for this direction."""
    registry.check_direction(direction)
    key = (direction, problem, math_mode(problem))
    measured = _measured.get(key)
    if measured is None:
        measured = _measured[key] = _disk_cache(problem.device).lookup(key)
    fitting = [a for a in registry.algorithms().values()
               if registry.fits(a, problem, direction, workspace_limit) and registry.permitted(a, problem, direction)]
    # Algorithms that run only by name (the float64 reference) are offered only as a last resort.
    candidates = [a for a in fitting if a.automatic] or fitting
    missing = [a for a in candidates if a.name not in measured]
    if missing:
        measured.update(_measure(missing, problem, direction, repeats))
        _disk_cache(problem.device).store(key, measured)
    results = [measured[a.name] for a in candidates if a.name in measured]
    return sorted(results, key=lambda perf: (perf.time_ms, perf.workspace_bytes))


def fastest(perfs: list[AlgoPerf], eager: bool) -> AlgoPerf:
    """The algorithm ``algo="auto"`` runs from ``find``'s results (at least one).

    For a CUDA graph's replays (``eager=False``) the least GPU time: no host runs between the kernels. In an
    eager step a call costs the longer of the host's time to issue it and the GPU's time to run it, since the
    GPU cannot start a kernel before Python launches it: a Winograd or FFT call issues four to eight kernels
    where implicit GEMM issues one, and on a small layer the GPU waits for them. So eager calls choose by
    max(GPU, host) (then GPU time, then workspace); where the host issues faster than the GPU runs (the
    larger layers), that is the GPU time again."""
    if eager:
        return min(perfs, key=lambda p: (max(p.time_ms, p.host_ms), p.time_ms, p.workspace_bytes))
    return min(perfs, key=lambda p: (p.time_ms, p.workspace_bytes))


def _measure(algorithms: list[registry.ConvAlgorithm], problem: ConvProblem, direction: str,
             repeats: int) -> dict[str, AlgoPerf]:
    """Time each algorithm on random data of the problem's shape (one warm-up call, then the median)."""
    xp = np if problem.device == "cpu" else backend.cupy()
    rng = np.random.default_rng(0)

    def random(shape: tuple) -> Any:
        if problem.half_type is None:
            array = xp.asarray(rng.standard_normal(shape).astype(problem.dtype))
        else:
            array = convert.float_to_half(xp.asarray(rng.standard_normal(shape).astype(np.float32)), problem.half_type)
        # A channels-last problem's operands (the weight too, as Module.to(memory_format=...) lays it out) in
        # that layout: an algorithm without channels-last kernels is timed with its copies.
        return layout.to_channels_last(array) if problem.channels_last else array

    first, second, out_shape = {
        "forward": (problem.x_shape, problem.w_shape, problem.y_shape),
        "backward_data": (problem.y_shape, problem.w_shape, problem.x_shape),
        "backward_filter": (problem.x_shape, problem.y_shape, problem.w_shape),
    }[direction]
    out = layout.empty(out_shape, problem.dtype, xp, problem.channels_last and direction != "backward_filter")
    first, second = random(first), random(second)
    results = {}
    for algorithm in algorithms:
        size = algorithm.workspace_bytes(problem, direction)
        try:
            workspace = xp.empty(size, dtype=np.uint8) if size else None
        except MemoryError:  # cupy's OutOfMemoryError is a MemoryError: this one cannot run now
            warnings.warn(f"find: no memory for {algorithm.name}'s {size}-byte workspace on {problem.describe()}; "
                          "skipped", RuntimeWarning, stacklevel=3)
            continue

        def call(algorithm: registry.ConvAlgorithm = algorithm, workspace: Any = workspace) -> None:
            algorithm.run_in_layout(direction, first, second, problem, out, False, workspace)

        times, host_times = _time(_steady_call(call, algorithm, direction, problem, first, second, out, workspace), xp,
                                  repeats)
        results[algorithm.name] = AlgoPerf(algorithm.name, statistics.median(times), size,
                                           algorithm.is_deterministic(problem, direction),
                                           statistics.median(host_times))
    return results


def _steady_call(call: Any, algorithm: registry.ConvAlgorithm, direction: str, problem: ConvProblem, first: Any,
                 second: Any, out: Any, workspace: Any) -> Any:
    """What a training step's repeats of this call run, to be timed in place of ``call`` (the full path): on the GPU,
    where api keeps a ready form for the call (C-contiguous operands, one segment), the algorithm's ready launch, or
    for a ``replayable`` algorithm ``call``'s recording replayed (run once here, as the warm-up). The host's time of
    an eager step is that form's, not the checked path's that only its first step takes."""
    if problem.device != "cuda" or problem.channels_last:
        return call
    if algorithm.replayable:
        ready = algorithm.recorded_call(direction, first, second, problem, out, workspace)
        return call if ready is None else lambda: ready(first, second, out, workspace)  # None: not kept by api either
    launch = algorithm.ready_launch(direction, problem) if workspace is None else None
    return call if launch is None else lambda: launch(first, second)


def _time(call: Any, xp: Any, repeats: int) -> tuple[list[float], list[float]]:
    """Milliseconds of ``repeats`` calls after one warm-up: (the device's, the host's). On the GPU the device's
    is the GPU's time alone (each call queued behind a hold, :func:`minidnn.primitives._cuda.queued_milliseconds`)
    and the host's the time Python took to issue the call, its kernels queued, not run; on the CPU both are
    the host clock's.

    Without the hold, events would also count the gaps in which the GPU waits for the host to launch
    the next kernel (several microseconds from Python for each launch, more for a cuBLAS call), mixed into
    one figure with the kernels' time. Timing the two apart is what lets :func:`fastest` weigh the host
    where it counts (an eager step) and leave it out where it does not (a CUDA graph's replays).
    """
    call()
    times, host_times = [], []
    issued: list[float] = []

    def issue() -> None:
        start = time.perf_counter()
        call()
        issued.append(1000 * (time.perf_counter() - start))

    for _ in range(repeats):
        if xp is np:
            issue()
            times.append(issued[-1])
        else:
            times.append(_cuda.queued_milliseconds(issue, HOLD_MS, MAX_HOLD_MS))
        host_times.append(issued[-1])  # a sample taken again behind a longer hold: its last issue
    return times, host_times


# The hold in front of a timed call, and the longest one tried.
HOLD_MS, MAX_HOLD_MS = 1.0, 64.0


def clear_cache() -> None:
    """Forget every measurement held in memory (the disk cache stays)."""
    _measured.clear()
    _caches.clear()


# ----------------------------------------------------------------------------------------------
# The on-disk cache
# ----------------------------------------------------------------------------------------------
def _key_text(key: tuple) -> str:
    direction, p, mode = key
    return (f"{direction}|{p.N},{p.C},{p.H},{p.W}|{p.K},{p.R},{p.S}|stride {p.stride[0]},{p.stride[1]}"
            f"|pad {p.padding[0]},{p.padding[1]}|dilation {p.dilation[0]},{p.dilation[1]}|groups {p.groups}"
            f"|{p.dtype.name}|{mode}" + ("|channels_last" if p.channels_last else ""))


class _DiskCache:
    """find results of one device kind, persisted as JSON (see the module docstring)."""

    def __init__(self, device: str) -> None:
        directory = os.environ.get("MINIDNN_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "minidnn"))
        self.path = os.path.join(directory, f"conv_find_{device}.json") if directory else None
        self.header = {"format": CACHE_FORMAT, "minidnn": __version__, "device": _device_name(device)}
        self.entries: dict[str, dict[str, list]] = {}
        if self.path and os.path.exists(self.path):
            self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as file:
                content = json.load(file)
            header = {k: content.get(k) for k in self.header}
            entries = content["entries"]
            if not isinstance(entries, dict):
                raise ValueError("entries is not an object")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            warnings.warn(f"ignoring the convolution find cache {self.path}: it does not parse ({error})",
                          RuntimeWarning, stacklevel=4)
            return
        if header != self.header:
            warnings.warn(f"ignoring the convolution find cache {self.path}: it was made for {header}, "
                          f"this is {self.header}", RuntimeWarning, stacklevel=4)
            return
        self.entries = entries

    def lookup(self, key: tuple) -> dict[str, AlgoPerf]:
        found = {}
        direction, problem, _ = key
        algorithms = registry.algorithms()
        for name, values in self.entries.get(_key_text(key), {}).items():
            try:
                time_ms, workspace, host_ms = float(values[0]), int(values[1]), float(values[3])
            except (TypeError, ValueError, IndexError):
                continue  # a damaged entry: measure again
            if name in algorithms:  # whether it is deterministic is the code's to say, not the file's
                found[name] = AlgoPerf(name, time_ms, workspace, algorithms[name].is_deterministic(problem, direction),
                                       host_ms)
        return found

    def store(self, key: tuple, measured: dict[str, AlgoPerf]) -> None:
        self.entries[_key_text(key)] = {name: [p.time_ms, p.workspace_bytes, p.deterministic, p.host_ms]
                                        for name, p in measured.items()}
        if not self.path:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=".conv_find.", suffix=".tmp", dir=os.path.dirname(self.path))
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as file:
                    json.dump({**self.header, "entries": self.entries}, file, indent=0, sort_keys=True)
                os.replace(temporary, self.path)
            finally:
                if os.path.exists(temporary):
                    os.remove(temporary)
        except OSError as error:
            warnings.warn(f"could not write the convolution find cache {self.path}: {error}", RuntimeWarning,
                          stacklevel=4)


def _device_name(device: str) -> str:
    if device == "cpu":
        import platform  # noqa: PLC0415

        return f"cpu {platform.machine()} {platform.processor() or ''}".strip()
    cupy = backend.cupy()
    return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()


_caches: dict[str, _DiskCache] = {}


def _disk_cache(device: str) -> _DiskCache:
    cache = _caches.get(device)
    if cache is None:
        cache = _caches[device] = _DiskCache(device)
    return cache
