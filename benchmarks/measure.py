"""One measurement in one process: the benchmark's worker (bench.py starts one per cell).

    python benchmarks/bench.py --worker '{"kind": "engine", ...}' --worker-out record.json

A cell is one model and batch on one engine, in one math mode, under one convolution setting. The
worker builds it, warms it up (kernels compile or load from the CuPy cache, convolution algorithms
get measured and planned), then measures in an order that keeps each figure clean: the timed
training steps, the forward passes, the peak memory of one step, the profiled steps (the profiler
last, so its overhead touches nothing else), and finally each convolution layer alone. It writes
one JSON record and exits, taking its memory pool, caches and switches with it.

Engines share one interface (:class:`Engine`): ``train_step(x, y)`` is forward + cross-entropy +
backward + SGD, ``step()`` runs it on the engine's batch, ``prepare()`` runs once after the
warm-up. A captured engine only changes ``prepare`` (capture) and ``step`` (replay).
"""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Callable, Iterator

import numpy as np

import minidnn
import minidnn.functional as F
import models
from minidnn import backend, optim
from minidnn.engine import current as current_library
from minidnn.primitives import _cuda, conv
from minidnn.primitives.conv import plans, registry, step_choice

DIRECTIONS = ("forward", "backward_data", "backward_filter")
# Workspace allowed to each algorithm of the per-layer menu: large enough for every layer of the
# suite to run its whole batch in one call (CaffeNet conv1 at batch 256 needs 1.1 GiB of columns).
MENU_WORKSPACE_LIMIT = 4 << 30
# minidnn's engine switch for each benchmark engine ("torch" computes nothing through minidnn).
LIBRARY = {"minidnn": "minidnn", "naive": "naive", "minidnn-graph": "minidnn", "torch": "minidnn"}


# ----------------------------------------------------------------------------------------------
# State: what a measurement switches, restored afterwards
# ----------------------------------------------------------------------------------------------
def _torch_flags(torch: Any) -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def _set_torch_flags(torch: Any, flags: tuple[bool, bool]) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@contextlib.contextmanager
def measurement_state(engine: str, precision: str) -> Iterator[None]:
    """Select minidnn's engine for ``engine`` and set every TF32 switch to whether ``precision`` is
    ``"tf32"`` (minidnn's, and PyTorch's matmul and cuDNN ones when PyTorch is loaded); put all of them back
    on exit, also after an exception. fp32 means TF32 off everywhere, whatever the environment said; bf16 and
    fp16 (autocast, see :class:`Engine`) run their float32 remainder with TF32 off too."""
    tf32 = precision == "tf32"
    torch = sys.modules.get("torch")
    if torch is None and engine == "torch":
        import torch  # noqa: PLC0415 - loaded now, or its TF32 switches would keep their defaults (on for cuDNN)
    saved_engine, saved_tf32 = minidnn.get_engine(), _cuda.allow_tf32()
    saved_torch = None if torch is None else _torch_flags(torch)
    try:
        minidnn.set_engine(LIBRARY[engine])
        _cuda.set_allow_tf32(tf32)
        if torch is not None:
            _set_torch_flags(torch, (tf32, tf32))
        yield
    finally:
        minidnn.set_engine(saved_engine)
        _cuda.set_allow_tf32(saved_tf32)
        if torch is not None:
            _set_torch_flags(torch, saved_torch)


def state_now() -> dict[str, Any]:
    """The switches in force right now, recorded with each measurement."""
    state = {"engine": minidnn.get_engine(), "allow_tf32": _cuda.allow_tf32(),
             "workspace_limit": registry.workspace_limit(), "microbatch": registry.microbatch_mode(),
             "batch_policy": registry.batch_policy()}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch_allow_tf32"] = list(_torch_flags(torch))
    return state


@contextlib.contextmanager
def observing_convolutions() -> Iterator[list[tuple[str, Any, Any]]]:
    """Collect every convolution call (direction, problem, plan) made through minidnn's primitives."""
    calls: list[tuple[str, Any, Any]] = []
    before = plans.call_observer
    plans.call_observer = lambda direction, problem, plan: calls.append((direction, problem, plan))
    try:
        yield calls
    finally:
        plans.call_observer = before


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
class Clock:
    """Times calls: device events on the GPU (``new_event`` makes one, ``elapsed`` reads two, in
    ms), ``time.perf_counter`` on the CPU. Each call is also timed on the host up to its return,
    before waiting for the device: the time Python takes to issue the work."""

    def __init__(self, new_event: Callable[[], Any] | None = None, elapsed: Callable[[Any, Any], float] | None = None):
        self.new_event, self.elapsed = new_event, elapsed

    def time(self, call: Callable[[], Any], repeats: int) -> tuple[list[float], list[float]]:
        """(wall ms, host ms) of each of ``repeats`` calls."""
        wall, host = [], []
        for _ in range(repeats):
            if self.new_event is None:
                start = time.perf_counter()
                call()
                wall.append(1000 * (time.perf_counter() - start))
                host.append(wall[-1])
                continue
            begin, end = self.new_event(), self.new_event()
            begin.record()
            start = time.perf_counter()
            call()
            host.append(1000 * (time.perf_counter() - start))
            end.record()
            end.synchronize()
            wall.append(self.elapsed(begin, end))
        return wall, host

    def per_call(self, call: Callable[[], Any], repeats: int) -> float:
        """Wall ms per call over ``repeats`` calls issued back to back after one untimed call: the
        host issues the next call while the device runs the last one, as in a training step."""
        call()
        if self.new_event is None:
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            return 1000 * (time.perf_counter() - start) / repeats
        begin, end = self.new_event(), self.new_event()
        begin.record()
        for _ in range(repeats):
            call()
        end.record()
        end.synchronize()
        return self.elapsed(begin, end) / repeats


# ----------------------------------------------------------------------------------------------
# Engines
# ----------------------------------------------------------------------------------------------
def batch_arrays(spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark's batch (same for every engine): float32 images and integer labels."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((spec["batch"], 3, spec["image_size"], spec["image_size"])).astype(np.float32)
    return x, rng.integers(0, spec["num_classes"], spec["batch"])


def minidnn_model(spec: dict[str, Any]) -> Any:
    """The benchmark's model with its seeded initial weights, on the CPU."""
    minidnn.manual_seed(0)
    return models.create(spec["architecture"], num_classes=spec["num_classes"])


class Engine:
    """A model, its batch and an SGD optimizer (momentum 0.9, weight decay 5e-4) on one library.
    ``minidnn_model`` on ``minidnn_device`` is the minidnn model whose convolutions the layer
    table lists (for PyTorch, the CPU model its twin copied)."""

    name = "engine"
    # Set by each library's engine: its cross-entropy, its no-grad context, and for bf16 and fp16 its autocast
    # region (``autocast()``, a no-op region in fp32 and tf32) and for fp16 its GradScaler (else None).
    cross_entropy: Callable[[Any, Any], Any]
    no_grad: Callable[[], Any]
    autocast: Callable[[], Any] = staticmethod(contextlib.nullcontext)
    scaler: Any = None
    half: str | None = None  # the autocast type's name (HALF_DTYPES), None in fp32 and tf32
    channels_last = False  # whether the model's convolutions and the batch are channels-last

    def step(self) -> None:
        self.train_step(self.x, self.y)

    def train_step(self, x: Any, y: Any) -> Any:
        with self.autocast():
            loss = self.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:  # fp16: as a user's loop does it, loss scaling and a skipped step on overflow
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return loss

    def forward(self) -> None:
        self.model.eval()
        with self.no_grad(), self.autocast():
            self.model(self.x)
        self.model.train()

    def prepare(self) -> None:
        """Runs once after the warm-up steps (a captured engine captures here)."""

    def prepared(self) -> dict[str, Any]:
        """What ``prepare`` did, for the record."""
        return {}


SETTLING_STEPS = 200  # the most warm-up steps given to minidnn's whole-step choice (its trial takes a few dozen)


class MinidnnEngine(Engine):
    """minidnn's model; the library computing it (primitives or naive) is minidnn's current engine."""

    cross_entropy = staticmethod(F.cross_entropy)
    no_grad = staticmethod(minidnn.no_grad)
    settling_steps = 0

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name, self.device = spec["engine"], spec["device"]
        self.plan_memory = spec.get("plan_memory", True)  # the captured engine's graphs.capture(plan_memory=)
        self.gpu = self.device.startswith("cuda")
        self.model = minidnn_model(spec).to(self.device)
        x, y = batch_arrays(spec)
        self.x, self.y = minidnn.tensor(x, device=self.device), minidnn.tensor(y, device=self.device)
        self.channels_last = bool(spec.get("channels_last"))
        if self.channels_last:  # as a user asks for NHWC: the model's convolution weights and the batch
            self.model.to(memory_format=minidnn.channels_last)
            self.x = self.x.to(memory_format=minidnn.channels_last)
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.001, momentum=0.9, weight_decay=5e-4)
        self.minidnn_model, self.minidnn_device = self.model, self.device
        half = self.half = HALF_DTYPES.get(spec.get("precision"))
        if half is not None:
            device_type = self.device.split(":")[0]
            region = minidnn.autocast(device_type, dtype=getattr(minidnn, half))  # re-entrant: made once
            self.autocast = lambda: region
            self.scaler = minidnn.amp.GradScaler(device_type) if half == "float16" else None
        if self.gpu:
            cupy = backend.cupy()
            self.clock = Clock(cupy.cuda.Event, cupy.cuda.get_elapsed_time)
        else:
            self.clock = Clock()

    def prepare(self) -> None:
        """Eager steps until the convolutions' whole-step choice is made (primitives/conv/step_choice.py): its trial
        times sets of algorithms over a training run's first steps, which are warm-up here, not the steady state."""
        self.settling_steps = 0
        while step_choice.running() and self.settling_steps < SETTLING_STEPS:
            self.step()
            self.settling_steps += 1

    def prepared(self) -> dict[str, Any]:
        settled = {"settling_steps": self.settling_steps, "step_choice": step_choice.summary()}
        return {"channels_last": self.channels_last, **(settled if self.settling_steps else {})}

    def synchronize(self) -> None:
        if self.gpu:
            backend.synchronize(self.device)

    def reset_peak(self) -> None:
        minidnn.cuda.reset_peak_memory_stats()

    def memory(self) -> dict[str, int]:
        stats = minidnn.cuda.memory_stats()
        return {"peak_bytes": stats["peak"], "reserved_bytes": stats["reserved"]}

    def layer_operand(self, array: np.ndarray) -> Any:
        """A convolution operand (x, w or dy) as this engine's training step holds it: on the device, in the cell's
        half type under autocast (the weight a cast of its float32 master), channels-last in a channels-last cell."""
        tensor = minidnn.tensor(array, device=self.device)
        if self.half is not None:
            tensor = tensor.to(getattr(minidnn, self.half))
        if self.channels_last:
            tensor = tensor.to(memory_format=minidnn.channels_last)
        return tensor.data

    def conv_calls(self, problem: Any, arrays: tuple, **options: Any) -> dict[str, Callable[[], Any]]:
        """The three directions of one convolution as calls of the current engine's library; under autocast the
        weight gradient is float32, as the step asks for it (the master weight's)."""
        library = current_library()
        x, w, dy = arrays
        arguments = (problem.stride, problem.padding, problem.dilation, problem.groups)
        gradient = {"dtype": np.float32} if self.half is not None else {}
        return {"forward": lambda: library.conv2d_forward(x, w, *arguments, **options),
                "backward_data": lambda: library.conv2d_backward_data(dy, w, problem.x_shape, *arguments, **options),
                "backward_filter": lambda: library.conv2d_backward_filter(x, dy, problem.w_shape, *arguments,
                                                                           **options, **gradient)}


class CapturedMinidnnEngine(MinidnnEngine):
    """minidnn's training step captured once as a CUDA graph and replayed
    (``minidnn.cuda.graphs.capture(step_fn, example_batch)`` returns a callable taking the batch)."""

    replay: Callable[..., Any] | None = None

    def prepare(self) -> None:
        from minidnn.cuda import graphs  # noqa: PLC0415 - the driver checked it exists

        self.replay = graphs.capture(self.train_step, (self.x, self.y), plan_memory=self.plan_memory)
        # A step that cannot be captured runs eagerly behind the same interface: say so.
        self.fallback = self.replay.reason if isinstance(self.replay, graphs.EagerStep) else None

    def prepared(self) -> dict[str, Any]:
        return {**super().prepared(), "captured": self.fallback is None, "memory_plan": self.plan_memory,
                **({"capture_fallback": self.fallback} if self.fallback else {})}

    def step(self) -> None:
        (self.replay or self.train_step)(self.x, self.y)  # eager until captured

    def memory(self) -> dict[str, int]:
        """The default pool's peak and reserve (parameters, optimizer state, the static batch) plus the
        graph's private pool, which holds every array of the step for the graph's lifetime."""
        stats = super().memory()
        graph = self.replay.memory_bytes if self.replay is not None else 0
        record = {"peak_bytes": stats["peak_bytes"] + graph, "reserved_bytes": stats["reserved_bytes"] + graph,
                  "graph_pool_bytes": graph}
        planned = getattr(self.replay, "planned", None)
        if planned is not None:  # the memory plan's arena, the recorded step's peak, requests that strayed
            record.update(graph_arena_bytes=planned.plan.arena_bytes, graph_plan_peak_bytes=planned.plan.peak_bytes,
                          graph_plan_fallbacks=planned.fallbacks)
        return record


class TorchEngine(Engine):
    """The same model in PyTorch with cuDNN (``cudnn.benchmark`` on): the reference."""

    name = "torch"

    def __init__(self, spec: dict[str, Any]) -> None:
        import torch  # noqa: PLC0415 - optional

        from benchmarks.torch_twins import torch_twin  # noqa: PLC0415

        self.torch, self.device = torch, spec["device"]
        self.cross_entropy, self.no_grad = torch.nn.functional.cross_entropy, torch.no_grad
        self.gpu = self.device.startswith("cuda")
        torch.backends.cudnn.benchmark = True
        self.minidnn_model, self.minidnn_device = minidnn_model(spec), "cpu"
        self.model = torch_twin(spec["architecture"], self.minidnn_model).to(self.device)
        x, y = batch_arrays(spec)
        self.x, self.y = torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)
        half = self.half = HALF_DTYPES.get(spec.get("precision"))
        self.channels_last = half is not None or bool(spec.get("torch_channels_last"))
        if self.channels_last:  # cuDNN's tensor cores are fastest channels_last
            self.model = self.model.to(memory_format=torch.channels_last)
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        if half is not None:  # PyTorch AMP as a user runs it on tensor cores: autocast with channels_last
            device_type = self.device.split(":")[0]
            self.autocast = lambda: torch.autocast(device_type, dtype=getattr(torch, half))
            self.scaler = torch.amp.GradScaler(device_type) if half == "float16" else None
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.001, momentum=0.9, weight_decay=5e-4)
        if self.gpu:
            self.clock = Clock(lambda: torch.cuda.Event(enable_timing=True), lambda a, b: a.elapsed_time(b))
        else:
            self.clock = Clock()

    def synchronize(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        self.torch.cuda.reset_peak_memory_stats()

    def memory(self) -> dict[str, int]:
        return {"peak_bytes": self.torch.cuda.max_memory_allocated(),
                "reserved_bytes": self.torch.cuda.max_memory_reserved()}

    def layer_operand(self, array: np.ndarray) -> Any:
        """A convolution operand as PyTorch's step gives it to cuDNN: in the half type under autocast,
        channels_last where the model is."""
        tensor = self.torch.from_numpy(array).to(self.device)
        if self.half is not None:
            tensor = tensor.to(getattr(self.torch, self.half))
        if self.channels_last:
            tensor = tensor.contiguous(memory_format=self.torch.channels_last)
        return tensor

    def conv_calls(self, problem: Any, arrays: tuple, **options: Any) -> dict[str, Callable[[], Any]]:
        """cuDNN's three directions: PyTorch's convolution, and its gradients as autograd asks for them, one
        ``aten.convolution_backward`` on the step's own x, w and dy, one output wanted. (``torch.nn.grad``'s
        functions pass a stand-in of stride 0 for the operand they do not need: a call no training step makes.)"""
        torch = self.torch
        x, w, dy = arrays
        arguments = (problem.stride, problem.padding, problem.dilation, problem.groups)
        backward = torch.ops.aten.convolution_backward
        gradient_arguments = (list(problem.stride), list(problem.padding), list(problem.dilation), False, [0, 0],
                              problem.groups)
        return {"forward": lambda: torch.nn.functional.conv2d(x, w, None, *arguments),
                "backward_data": lambda: backward(dy, x, w, None, *gradient_arguments, (True, False, False))[0],
                "backward_filter": lambda: backward(dy, x, w, None, *gradient_arguments, (False, True, False))[1]}


HALF_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # --precision's half types, by their names in both libraries
ENGINES: dict[str, type] = {"minidnn": MinidnnEngine, "naive": MinidnnEngine, "minidnn-graph": CapturedMinidnnEngine,
                            "torch": TorchEngine}


# ----------------------------------------------------------------------------------------------
# The device profile: GPU-busy time and kernels per step
# ----------------------------------------------------------------------------------------------
KERNEL_NAMES_KEPT = 40  # the device summary's breakdown by kernel name: this many names, the longest-running first


def summarize_device_trace(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per-step device work from a Chrome trace (``torch.profiler`` export, times in µs): the
    kernels' summed duration (GPU-busy ms) and count, memcpy / memset counts and ms, the time
    some kernel was running (``gpu_active_ms``: below GPU-busy only where kernels overlapped), and
    ``kernel_names``: [name, ms a step, kernels a step] for the KERNEL_NAMES_KEPT names that ran longest,
    so that two engines' steps can be set side by side kernel by kernel."""
    totals = {"kernel": [0.0, 0], "gpu_memcpy": [0.0, 0], "gpu_memset": [0.0, 0]}
    by_name: dict[str, list[float]] = {}
    spans = []
    for event in events:
        category = event.get("cat")
        if category in totals and event.get("ph") == "X":
            totals[category][0] += float(event["dur"])
            totals[category][1] += 1
            if category == "kernel":
                spans.append(_span(event))
                entry = by_name.setdefault(str(event.get("name", "?")), [0.0, 0])
                entry[0] += float(event["dur"])
                entry[1] += 1
    names = sorted(by_name.items(), key=lambda item: -item[1][0])[:KERNEL_NAMES_KEPT]
    return {"gpu_busy_ms": totals["kernel"][0] / 1000 / steps, "kernels_per_step": totals["kernel"][1] / steps,
            "gpu_active_ms": covered(spans) / 1000 / steps,
            "memcpy_ms": totals["gpu_memcpy"][0] / 1000 / steps, "memcpy_per_step": totals["gpu_memcpy"][1] / steps,
            "memset_ms": totals["gpu_memset"][0] / 1000 / steps, "memset_per_step": totals["gpu_memset"][1] / steps,
            "kernel_names": [[name, time / 1000 / steps, count / steps] for name, (time, count) in names]}


def _span(event: dict[str, Any]) -> tuple[float, float]:
    return float(event["ts"]), float(event["ts"]) + float(event["dur"])


def covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of (start, stop) intervals: the time at least one kernel ran. Kernels
    can overlap (cuDNN's on Hopper let the next kernel start before the last one ends), so
    summing their durations would count the shared time twice."""
    total, reached = 0.0, float("-inf")
    for start, stop in sorted(spans):
        total += max(0.0, stop - max(start, reached))
        reached = max(reached, stop)
    return total


def kernels_by_annotation(events: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """Kernel time (µs during which the label's kernels ran, overlaps counted once) and kernel count
    per ``record_function`` label, from a Chrome trace profiled with CPU and CUDA activity: a
    kernel belongs to the label whose range holds the host call that launched it (linked by
    CUPTI's correlation id), wherever on the device timeline the kernel ran."""
    ranges = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events
                    if e.get("cat") == "user_annotation" and e.get("ph") == "X")
    launched = {e["args"]["correlation"]: float(e["ts"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    starts = [start for start, _, _ in ranges]
    spans: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        if event.get("cat") != "kernel" or event.get("ph") != "X":
            continue
        at = launched.get(event.get("args", {}).get("correlation"))
        index = -1 if at is None else bisect.bisect_right(starts, at) - 1
        if index >= 0 and at <= ranges[index][1]:
            spans.setdefault(ranges[index][2], []).append(_span(event))
    return {label: (covered(found), len(found)) for label, found in spans.items()}


def _profiled_trace(engine: Engine, run: Callable[[], None], activities: list[str]) -> list[dict[str, Any]] | None:
    """The Chrome trace events of ``run()`` under ``torch.profiler`` (CUPTI records every kernel on
    the device, CuPy's included); None on the CPU or without PyTorch."""
    if not engine.gpu:
        return None
    try:
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415 - optional
    except ImportError:
        return None
    engine.synchronize()
    with tempfile.TemporaryDirectory() as directory:
        with profile(activities=[getattr(ProfilerActivity, name) for name in activities]) as profiler:
            run()
            engine.synchronize()
        path = os.path.join(directory, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as file:
            return json.load(file)["traceEvents"]


def profile_steps(engine: Engine, steps: int) -> dict[str, Any]:
    """GPU-busy time, kernels and copies per step over ``steps`` profiled training steps."""
    if steps < 1:
        return {}

    def run() -> None:
        for _ in range(steps):
            engine.step()

    events = _profiled_trace(engine, run, ["CUDA"])
    return {} if events is None else {**summarize_device_trace(events, steps), "profiled_steps": steps}


def kernel_times(engine: Engine, tasks: list[tuple[Callable[[], Any], dict[str, Any]]], repeats: int) -> None:
    """Add ``gpu_ms`` and ``kernels`` per call to each task's entry: the time its kernels ran over
    ``repeats`` calls in one profiled session, each task in its own labelled range."""
    if not tasks or not engine.gpu:
        return
    try:
        from torch.profiler import record_function  # noqa: PLC0415 - optional
    except ImportError:
        return

    def run() -> None:
        for index, (call, _) in enumerate(tasks):
            with record_function(f"bench-task-{index}"):
                for _ in range(repeats):
                    call()

    events = _profiled_trace(engine, run, ["CPU", "CUDA"])
    totals = kernels_by_annotation(events)
    for index, (_, entry) in enumerate(tasks):
        time_us, count = totals.get(f"bench-task-{index}", (0.0, 0))
        entry.update(gpu_ms=time_us / 1000 / repeats, kernels=count / repeats)


# ----------------------------------------------------------------------------------------------
# Convolution layers
# ----------------------------------------------------------------------------------------------
def conv_layers(model: Any, image_size: int, device: str) -> list[dict[str, Any]]:
    """Every convolution of one forward pass in order, from a one-image batch run with the graph on
    (as in training): {"name", "problem" (for N = 1), "input_needs_grad"}. The first layer's input
    is the data, which needs no gradient, so training never runs its backward-data."""
    found: list[dict[str, Any]] = []
    names = {id(module): name for name, module in model.named_modules()}
    original = minidnn.nn.Conv2d.forward

    def recording(layer: Any, inputs: Any) -> Any:
        with observing_convolutions() as calls:
            out = original(layer, inputs)
        found.append({"name": names.get(id(layer), "?"), "problem": calls[0][1],
                      "input_needs_grad": inputs.requires_grad})
        return out

    x = minidnn.tensor(np.zeros((1, 3, image_size, image_size), np.float32), device=device)
    minidnn.nn.Conv2d.forward = recording
    model.eval()  # no batch-norm statistics updated, no dropout; the graph is still recorded
    try:
        # minidnn's primitives report each problem; their shape heuristic needs no timing.
        with minidnn.use_engine("minidnn"), conv.settings(microbatch="off", benchmark=False):
            model(x)
    finally:
        minidnn.nn.Conv2d.forward = original
        model.train()
    return found


def distinct_shapes(layers: list[dict[str, Any]], batch: int) -> list[dict[str, Any]]:
    """Group layers by convolution problem at ``batch`` images, with how many layers of each shape
    run each direction in a training step: ``runs[direction]``."""
    rows: dict[Any, dict[str, Any]] = {}
    for layer in layers:
        problem = layer["problem"].with_batch(batch)
        row = rows.setdefault(problem, {"problem": problem, "layers": [], "runs": dict.fromkeys(DIRECTIONS, 0)})
        row["layers"].append(layer["name"])
        row["runs"]["forward"] += 1
        row["runs"]["backward_filter"] += 1
        row["runs"]["backward_data"] += int(layer["input_needs_grad"])
    return list(rows.values())


def row_problem(problem: Any, half: str | None) -> Any:
    """The problem a layer table's row names, the same in every engine's table of a cell, so that the rows pair up:
    its shapes as (N, C, H, W) and the cell's type (``half`` under autocast). Each engine's operands are laid out as
    its own step's (``layer_operand``)."""
    dtype = np.dtype(getattr(minidnn, half)) if half is not None else problem.dtype
    return dataclasses.replace(problem, dtype=dtype, channels_last=False)


def plan_summary(plan: Any) -> dict[str, Any]:
    return {"segments": [[images, algorithm.name] for images, algorithm in plan.segments],
            "workspace_bytes": plan.workspace_bytes, "text": plan.describe()}


def layer_table(engine: Engine, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Each distinct convolution of the model, in each direction training runs, alone with the engine
    (for minidnn: its own choice under the cell's setting, with the plan, and on request the whole
    algorithm menu). Wall ms per call first, then, on the GPU, the kernels' time per call."""
    repeats = spec["layer_repeats"]
    # minidnn's plans as a captured step's replays choose them, by the GPU's time alone (``registry.for_graph``), as
    # PyTorch's benchmark mode chooses cuDNN's: the table sets kernels against kernels. An eager choice also weighs
    # the host's time to issue each call, which moves with the machine's load, so that two runs of the table
    # picked different plans for the same layer.
    with registry.for_graph():
        return _layer_rows(engine, spec, repeats)


def _layer_rows(engine: Engine, spec: dict[str, Any], repeats: int) -> list[dict[str, Any]]:
    rows, tasks = [], []
    layers = conv_layers(engine.minidnn_model, spec["image_size"], engine.minidnn_device)
    for shape in distinct_shapes(layers, spec["batch"]):
        problem = shape["problem"]
        rng = np.random.default_rng(1)
        arrays = tuple(engine.layer_operand(rng.standard_normal(s).astype(np.float32))
                       for s in (problem.x_shape, problem.w_shape, problem.y_shape))
        row = {"layers": shape["layers"], "shape": row_problem(problem, engine.half).describe(), "runs": shape["runs"],
               "gflop": problem.flops() / 1e9, "times": {}}
        directions = [d for d in DIRECTIONS if shape["runs"][d]]
        calls = engine.conv_calls(problem, arrays)
        for direction in directions:
            with observing_convolutions() as seen:
                entry = row["times"][direction] = {"ms": engine.clock.per_call(calls[direction], repeats)}
            if seen:  # minidnn's primitives ran it: the plan they chose
                entry["plan"] = plan_summary(seen[-1][2])
            tasks.append((calls[direction], entry))
        if spec.get("menu"):
            row["menu"] = {direction: algorithm_menu(engine, problem, arrays, direction, repeats, tasks)
                           for direction in directions}
        rows.append(row)
    kernel_times(engine, tasks, repeats)
    return rows


def algorithm_menu(engine: Engine, problem: Any, arrays: tuple, direction: str, repeats: int,
                   tasks: list[tuple[Callable[[], Any], dict[str, Any]]]) -> dict[str, Any]:
    """Every registered algorithm forced in turn for one direction: its time and workspace, or why it
    did not run (unsupported, or a workspace over :data:`MENU_WORKSPACE_LIMIT`). Each timed call
    joins ``tasks`` for the kernel-time session."""
    menu: dict[str, Any] = {}
    for name, algorithm in registry.algorithms().items():
        if not algorithm.supports(problem, direction):
            menu[name] = {"skipped": "unsupported"}
            continue
        workspace = algorithm.workspace_bytes(problem, direction)
        if workspace > MENU_WORKSPACE_LIMIT:
            menu[name] = {"skipped": f"workspace {workspace / 2**20:.0f} MiB over the menu's limit",
                          "workspace_bytes": workspace}
            continue
        call = engine.conv_calls(problem, arrays, algo=name, workspace_limit=MENU_WORKSPACE_LIMIT)[direction]
        menu[name] = {"ms": engine.clock.per_call(call, repeats), "workspace_bytes": workspace}
        tasks.append((call, menu[name]))
    return menu


# ----------------------------------------------------------------------------------------------
# The measurements
# ----------------------------------------------------------------------------------------------
def solve_whole_network(limit: int, calls: Counter) -> int:
    """μ-cuDNN's WD: one workspace budget for every convolution kernel of a training step (one per
    layer and direction; ``calls`` counts them per (problem, direction)), solved by the planner.
    The budget is the per-call limit times the number of kernels, so every WR plan under the same
    limit stays affordable. Returns the budget."""
    try:
        from minidnn.primitives.conv import planner  # noqa: PLC0415 - only wd needs it
        solve = planner.solve_network
    except (ImportError, AttributeError) as error:
        raise RuntimeError("--microbatch wd needs minidnn.primitives.conv.planner.solve_network, which this "
                           f"checkout does not have ({error})") from error
    budget = planner.network_budget(limit, calls)
    solve(budget, dict(calls))
    return budget


def measure_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine, math mode and setting: step, forward, memory, device profile, layer tables."""
    engine = ENGINES[spec["engine"]](spec)
    setting = spec.get("setting") or {}
    record: dict[str, Any] = {}
    with measurement_state(spec["engine"], spec.get("precision") or ("tf32" if spec["tf32"] else "fp32")), \
            conv.settings(**setting):
        start = time.perf_counter()
        with observing_convolutions() as calls:
            engine.step()
            engine.synchronize()
        record["first_step_s"] = time.perf_counter() - start  # compiling, loading kernels, find
        kernels = Counter((problem, direction) for direction, problem, _ in calls)
        record.update(conv_calls=sum(kernels.values()), conv_shapes=len(kernels))
        engine.clock.time(engine.step, max(spec["warmup"] - 1, 0))
        if setting.get("microbatch") == "wd":
            record["wd_budget_bytes"] = solve_whole_network(setting["workspace_limit"], kernels)
            engine.clock.time(engine.step, spec["warmup"])
        engine.prepare()
        record.update(engine.prepared())
        engine.clock.time(engine.step, 1)
        if spec["measure_step"]:
            wall, host = engine.clock.time(engine.step, spec["steps"])
            record["state"] = state_now()
            record.update(wall_ms=statistics.median(wall), host_ms=statistics.median(host), steps_timed=len(wall),
                          images_per_second=spec["batch"] / statistics.median(wall) * 1000,
                          # each timed step, in order: whether a process's steps drift or jump, beside the median
                          wall_ms_steps=[round(v, 4) for v in wall], host_ms_steps=[round(v, 4) for v in host])
            # The plan each convolution of the timed steps ran ([direction, problem, plan] as they describe
            # themselves): which algorithms, and which run on copies in another layout.
            record["conv_plans"] = [[direction, problem.describe(), plan.describe()]
                                    for direction, problem, plan in conv.plans_in_use()]
            engine.forward()  # inference kernels (batch norm's, for one) load or compile here, untimed
            record["forward_ms"] = statistics.median(engine.clock.time(engine.forward, spec["steps"])[0])
            if engine.gpu:
                gc.collect()
                engine.synchronize()
                engine.reset_peak()
                engine.step()
                engine.synchronize()
                record.update(engine.memory())
            record.update(profile_steps(engine, spec["profile_steps"]))
        if spec["layer_table"]:
            record["layers"] = layer_table(engine, spec)
            record.setdefault("state", state_now())
    return record


def switch_off_dropout(model: Any) -> None:
    """Dropout probability 0 in every dropout module (minidnn's or PyTorch's)."""
    for module in model.modules():
        if type(module).__name__ == "Dropout":
            module.p = 0.0


def measure_agreement(spec: dict[str, Any]) -> dict[str, Any]:
    """Loss and gradients of each engine against minidnn's: same weights, same batch, fp32,
    dropout off (the engines' random streams differ). One relative difference over all gradients
    together: a per-parameter ratio would blow up where a gradient nearly cancels."""
    device = spec["device"]
    model = minidnn_model(spec).to(device)
    switch_off_dropout(model)
    x, y = batch_arrays(spec)
    results: dict[str, Any] = {}
    if "torch" in spec["engines"]:
        import torch  # noqa: PLC0415 - before measurement_state, which then sets its TF32 flags too

        from benchmarks.torch_twins import torch_twin  # noqa: PLC0415

        twin = torch_twin(spec["architecture"], minidnn_model(spec)).to(device)
        switch_off_dropout(twin)
    with measurement_state("minidnn", "fp32"):
        def minidnn_gradients(engine: str) -> tuple[float, dict[str, np.ndarray]]:
            with minidnn.use_engine(engine):
                model.zero_grad()
                loss = F.cross_entropy(model(minidnn.tensor(x, device=device)), minidnn.tensor(y, device=device))
                loss.backward()
                return loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()}

        reference_loss, reference = minidnn_gradients("minidnn")
        results["minidnn"] = {"loss": reference_loss}
        size = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in reference.values()))
        for engine in spec["engines"]:
            if engine == "naive":
                loss, gradients = minidnn_gradients("naive")
            elif engine == "torch":
                twin.zero_grad()
                their_loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x).to(device)),
                                                               torch.from_numpy(y).to(device))
                their_loss.backward()
                loss = their_loss.item()
                gradients = {k: p.grad.detach().cpu().numpy() for k, p in twin.named_parameters()}
            else:
                continue
            difference = np.sqrt(sum(float(np.sum((gradients[k].astype(np.float64) - reference[k]) ** 2))
                                     for k in reference))
            results[engine] = {"loss": loss, "loss_relative_difference": abs(loss - reference_loss) / abs(reference_loss),
                               "gradient_relative_difference": difference / max(size, 1e-30)}
        state = state_now()
    return {"agreement": results, "state": state}


def host_cpu() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _command_output(command: list[str], cwd: str | None = None) -> str | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=cwd,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def measure_machine(spec: dict[str, Any]) -> dict[str, Any]:
    """What ran the benchmark: versions, host CPU, GPU and driver (a clear error without CUDA)."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    info: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": platform.python_version(),
                            "numpy": np.__version__, "platform": platform.platform(), "host_cpu": host_cpu(),
                            "host_cores": os.cpu_count(), "device": spec["device"], "minidnn": minidnn.__version__,
                            "commit": _command_output(["git", "describe", "--always", "--dirty"], checkout)}
    if spec["device"].startswith("cuda"):
        cupy = backend.cupy()  # without CUDA: a RuntimeError saying why
        properties = cupy.cuda.runtime.getDeviceProperties(0)
        info.update(gpu=properties["name"].decode(), cupy=cupy.__version__,
                    cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                    driver=_command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
    try:
        import torch  # noqa: PLC0415 - optional

        info.update(torch=torch.__version__, cudnn=torch.backends.cudnn.version())
    except ImportError:
        pass
    return info


MEASUREMENTS = {"engine": measure_engine, "agreement": measure_agreement, "machine": measure_machine}


def worker_main(spec_text: str, out_path: str) -> None:
    """Run one cell and write its record (the cell's spec, the measurements, this process's id)."""
    spec = json.loads(spec_text)
    start = time.perf_counter()
    record = {**spec, **MEASUREMENTS[spec["kind"]](spec), "pid": os.getpid(),
              "worker_seconds": time.perf_counter() - start}
    with open(out_path + ".tmp", "w") as file:
        json.dump(record, file)
    os.replace(out_path + ".tmp", out_path)
