"""A whole training step captured once as a CUDA graph and replayed: one launch instead of hundreds.

    step = minidnn.cuda.graphs.capture(train_step, (x, y))     # x, y: example batch on the GPU
    for x, y in loader:
        loss = step(x, y)                                       # copies the batch in, replays the graph
    print(loss.item())                                          # read back only when asked

Why: launching a kernel from Python costs ~10 µs of host time; a small model's step is hundreds
of kernels of a few µs each, so the GPU waits on Python. A graph replays every kernel of the step
from one host call (~1 µs per node on the device side).

What capture needs, and how it is met here:

* **Fixed addresses.** A graph replays pointers. The batch is copied into static input buffers;
  every array the step allocates lives as long as the graph, so replays write the same addresses
  the capture recorded: in one arena laid out from the last warm-up step's allocations
  (:mod:`minidnn.cuda.memory_plan`: arrays never alive together share memory, so the arena is about
  the step's peak), and where the capture strays from that recording, in a private memory pool.
  Parameters and optimizer state are updated in place (they exist before capture: the warm-up steps
  create them).
* **Every kernel capturable.** minidnn's own kernels are; matrix products go through
  :mod:`minidnn.primitives.blas` (cuBLAS called directly, with a workspace set before capture,
  because CuPy refuses its own cuBLAS calls during capture); cuFFT plans are made in the warm-up.
* **Random numbers that advance.** Dropout draws from a counter-based generator; during capture
  each draw records its position relative to a start value read from device memory
  (:class:`~minidnn.primitives.dropout.DeviceOffset`), and before each replay that start is set
  from the generator's host offset, which then advances by the step's draws. So replay k draws
  the masks eager step k would, and a resumed run draws the same ones.
* **Hyper-parameters that change.** Optimizers keep the learning rate on the device; before each
  replay every live optimizer refreshes it (a schedule needs no new capture). Their other
  hyper-parameters (momentum, betas, weight decay, ...) are launch arguments the graph recorded: a
  replay after one of them changed (``OneCycleLR``'s momentum cycle) is a ``ValueError``, not a
  step with the old value.
* **No host synchronisation in the step.** Nothing reads the device during the step; the loss is
  a device array until the caller asks for it.

A batch of another shape or dtype is a ``ValueError``. A step that cannot be captured (a host
read, an operation outside these rules) falls back to eager execution with a one-time warning
that names the operation; it never runs wrong silently.
"""
from __future__ import annotations

import os
import traceback
import warnings
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .. import backend
from .. import random as _random
from ..primitives import blas
from ..primitives.conv import registry as conv_registry
from ..primitives.conv import workspace as conv_workspace
from ..primitives.dropout import stream_start
from ..tensor import Tensor
from . import memory_plan

__all__ = ["capture", "CapturedStep", "EagerStep"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _batch(batch: Any) -> tuple[Tensor, ...]:
    items = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    if not items or not all(isinstance(t, Tensor) for t in items):
        raise TypeError("the batch must be a Tensor or a tuple of Tensors")
    return items


def _refresh_optimizers() -> None:
    """Write every live optimizer's learning rate (and such) to its device copy, outside the graph."""
    from ..optim.optimizer import live_optimizers  # noqa: PLC0415 - optim imports tensors, not graphs

    for optimizer in live_optimizers():
        optimizer.refresh_device_hyperparameters()


def _fixed_hyperparameters(optimizers: Sequence[Any]) -> list[tuple[Any, list[dict[str, Any]]]]:
    """(optimizer, per group {name: value}) of each optimizer: the hyper-parameters a captured step holds as
    the capture recorded them (``Optimizer.recorded_hyperparameters``)."""
    return [(weakref.ref(optimizer), optimizer.recorded_hyperparameters()) for optimizer in optimizers]


def _gpu_optimizers() -> list[Any]:
    """Every live optimizer with parameters on the GPU (those a captured step may hold)."""
    from ..optim.optimizer import live_optimizers  # noqa: PLC0415 - as above

    return [optimizer for optimizer in live_optimizers()
            if any(p.is_cuda for group in optimizer.param_groups for p in group["params"])]


def _check_fixed_hyperparameters(recorded: list[tuple[Any, list[dict[str, Any]]]]) -> None:
    """A ``ValueError`` naming the first hyper-parameter that differs from what the capture recorded."""
    for reference, groups in recorded:
        optimizer = reference()
        if optimizer is None:
            continue
        if len(optimizer.param_groups) != len(groups):
            raise ValueError(f"{type(optimizer).__name__} has {len(optimizer.param_groups)} parameter groups, the "
                             f"captured step was recorded with {len(groups)}: capture the step again")
        for index, (group, values) in enumerate(zip(optimizer.param_groups, groups)):
            for name, value in values.items():
                if group[name] != value:
                    raise ValueError(
                        f"{type(optimizer).__name__}.param_groups[{index}][{name!r}] changed from {value!r} to "
                        f"{group[name]!r} since the step was captured; a captured step reads only "
                        f"{', '.join(optimizer.device_hyperparameters)} afresh (the graph recorded {name!r}): capture the step again, or keep {name!r} fixed (for OneCycleLR: "
                        f"cycle_momentum=False)")


class EagerStep:
    """The fallback: the same call interface, running the step eagerly."""

    def __init__(self, step_fn: Callable[..., Any], reason: str, warmup_outputs: Any) -> None:
        self.step_fn, self.reason, self.warmup_outputs = step_fn, reason, warmup_outputs

    # An eager step's arrays come from the default pool, which minidnn.cuda.memory_stats counts.
    memory_bytes = 0

    def __call__(self, *batch: Tensor) -> Any:
        return self.step_fn(*batch)


class CapturedStep:
    """A captured step: call it with a batch of the example's shapes to replay the graph."""

    def __init__(self, graph: Any, inputs: tuple[Tensor, ...], outputs: Any, pool: Any, start: Any,
                 draws: int, warmup_outputs: Any, planned: "memory_plan.PlannedAllocator | None" = None) -> None:
        self.graph, self.inputs, self.outputs, self.pool = graph, inputs, outputs, pool
        self.start, self.draws, self.warmup_outputs = start, draws, warmup_outputs
        self.planned = planned  # holds the arena (and says how many requests strayed from the plan)
        self.fixed_hyperparameters = _fixed_hyperparameters(_gpu_optimizers())

    @property
    def memory_bytes(self) -> int:
        """GPU bytes the graph holds: every array the step allocates (activations, gradients, workspaces), in
        its arena and its private pool, reserved for as long as this object lives.
        :func:`minidnn.cuda.memory_stats` tracks the default pool only, so a replay's peak is its peak plus this."""
        return int(self.pool.total_bytes())

    def __call__(self, *batch: Tensor) -> Any:
        _check_fixed_hyperparameters(self.fixed_hyperparameters)
        batch = _batch(batch)
        if len(batch) != len(self.inputs):
            raise ValueError(f"the captured step takes {len(self.inputs)} tensors, got {len(batch)}")
        for static, item in zip(self.inputs, batch):
            if item.shape != static.shape or item.dtype != static.dtype:
                raise ValueError(f"the captured step was recorded for a batch of shape {static.shape} {static.dtype}, "
                                 f"got {item.shape} {item.dtype}: capture again for a new shape")
            static.data[...] = backend.to_device(item.data, static.device)
        generator = _random.default_generator
        self.start.fill(np.uint64(stream_start(generator.seed, generator.offset)))
        _refresh_optimizers()
        self.graph.launch()
        generator.offset += self.draws
        return self.outputs


def _failing_operation(error: BaseException) -> str:
    """The innermost minidnn frame of the error's traceback, as 'function (file:line)'."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(_PACKAGE)]
    if not frames:
        return type(error).__name__
    frame = frames[-1]
    return f"{frame.name} ({os.path.relpath(frame.filename, os.path.dirname(_PACKAGE))}:{frame.lineno})"


_warned: set = set()


def capture(step_fn: Callable[..., Any], example_batch: Sequence[Tensor] | Tensor, warmup: int = 2,
            plan_memory: bool = True) -> Any:
    """Capture ``step_fn(*batch)`` (forward, backward and optimizer step) as one CUDA graph.

    ``example_batch``: the tensors the step takes, on the GPU; they are copied into the static
    buffers every replay reads. The step first runs ``warmup`` times eagerly on the example batch
    (real training steps: kernels compile, convolution plans are made, optimizer state is created),
    then once under capture (recorded, not run). ``plan_memory``: the last warm-up step's allocations
    are recorded and the capture's arrays laid out from them in one arena (:mod:`.memory_plan`; with
    ``warmup`` >= 2 that step is a steady one); off, they come from a caching pool as they are asked for.
    Returns a :class:`CapturedStep`, or an :class:`EagerStep` with a warning when the step cannot be
    captured; either keeps what the last warm-up step returned as ``warmup_outputs``.
    """
    if not isinstance(plan_memory, bool):
        raise TypeError(f"capture: plan_memory must be a bool, got {plan_memory!r}")
    backend.cupy()  # without CUDA: its clear RuntimeError first
    batch = _batch(example_batch)
    if not all(t.is_cuda for t in batch):
        raise ValueError("capture: the example batch must be on the GPU (tensor.to('cuda'))")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
        raise ValueError(f"capture: warmup must be an int >= 1 (the first step creates optimizer state), got {warmup!r}")
    # The warm-up steps and the capture plan their convolutions for the graph (GPU time alone counts in its
    # replays), and run the same plans, so that the last warm-up step's allocations are the capture's.
    with conv_registry.for_graph():
        return _capture(step_fn, batch, warmup, plan_memory)


def _capture(step_fn: Callable[..., Any], batch: tuple, warmup: int, plan_memory: bool) -> Any:
    cupy = backend.cupy()
    inputs = tuple(Tensor(t.data.copy()) for t in batch)
    for index in range(warmup):
        if plan_memory and index == warmup - 1:
            cupy.cuda.Device().synchronize()
            conv_workspace.release()  # the recorded step allocates its workspaces per call, as the capture will
            with memory_plan.record() as recording:
                warmup_outputs = step_fn(*inputs)
        else:
            warmup_outputs = step_fn(*inputs)
    _refresh_optimizers()
    cupy.cuda.Device().synchronize()
    conv_workspace.release()  # the replays use workspaces of the graph's own memory, not the eager steps' shared one

    generator = _random.default_generator
    start = cupy.zeros(1, dtype=cupy.uint64)
    pool = cupy.cuda.MemoryPool()
    planned = None
    if plan_memory:
        plan = memory_plan.place(*recording.lifetimes())
        planned = memory_plan.PlannedAllocator(plan, pool.malloc(max(plan.arena_bytes, 1)), pool.malloc)
    stream = cupy.cuda.Stream(non_blocking=True)
    blas.prepare_capture()
    offset_before = generator.offset
    graph = None
    try:
        # This thread's allocations only (using_allocator is thread-local): the graph's are this thread's.
        with cupy.cuda.using_allocator(planned.malloc if planned is not None else pool.malloc), stream, \
                generator.offsets_on_device(start):
            stream.begin_capture()
            try:
                outputs = step_fn(*inputs)
            finally:
                graph = stream.end_capture()
    except Exception as error:  # noqa: BLE001 - any failure: report it and run eagerly
        operation = _failing_operation(error)
        if operation not in _warned:
            _warned.add(operation)
            warnings.warn(f"the training step cannot be captured as a CUDA graph ({operation}: {error}); "
                          f"running it eagerly", RuntimeWarning, stacklevel=2)
        return EagerStep(step_fn, f"{operation}: {error}", warmup_outputs)
    finally:
        draws = generator.offset - offset_before
        generator.offset = offset_before  # the capture ran nothing: its draws happen at each replay
    graph.upload(stream)
    stream.synchronize()
    # The warm-up steps' arrays went back to the default pool, which keeps their blocks cached; the replays use
    # the graph's own memory, so those blocks would stay reserved for nothing: hand them back to the device.
    cupy.get_default_memory_pool().free_all_blocks()
    return CapturedStep(graph, inputs, outputs, pool, start, draws, warmup_outputs, planned)
