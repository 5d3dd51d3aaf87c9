"""Rule: train.py's eager loop adds little to its step (issue 22: train.py >= 0.9x the step alone's images/s).

Where an eager train.py step's time goes, part by part. train.py's own run (``train.prepare``) is driven by
train.py's loop body, with ``perf_counter`` around each part and no added waits:
- ``next``: the loader's next batch (the main thread's share of the GPU feed: the copy queued, the batch transform);
- ``step``: the training step; ``scheduler``, ``meter``, ``watch``: the loop's bookkeeping;
- ``gc``: the time Python's garbage collector ran during the epoch (``gc.callbacks``), and how often;
- with ``--next-parts``, ``next`` itself part by part: the loader's fetch (the gather), the batch transform's draws,
  the pinned fill, the wait for a free slot, the copy queued, the batch transform's launch, the device batch made
  (``finish``, the transform's launch included) and the batch put back together (``unflatten``). Each is a timer
  around that function, so the parts' own overhead (about a microsecond each) is in the figures.
An epoch's wall is train.py's: the reads at its end wait for the GPU. Then, in the same process:
- ``listed``: the same loop over the epoch's batches fetched to the GPU beforehand (no loader thread running);
- ``alone``: the step on one fixed batch, as the benchmark times it.

    python benchmarks/probes/train_loop_host.py --data shapes10,cifar --out OUT

Writes OUT/train-loop-host.json and .md.
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import train  # noqa: E402 - train.py's own run and loop pieces
from benchmarks.probes.train_throughput import synthesise_cifar, write_outputs  # noqa: E402

PARTS = ("next", "step", "scheduler", "watch", "meter")
NEXT_PARTS: dict[str, float] = collections.defaultdict(float)  # seconds in each part of the current ``next``


def time_next_parts() -> None:
    """Wrap the loader's functions that ``next`` runs with timers that add into NEXT_PARTS."""
    from minidnn.data import device, loader, transforms  # noqa: PLC0415

    def timed(owner: Any, attribute: str, name: str) -> None:
        function = getattr(owner, attribute)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                NEXT_PARTS[name] += time.perf_counter() - start

        setattr(owner, attribute, wrapper)

    timed(loader, "fetch", "fetch")
    timed(loader._DrawsAhead, "__call__", "draws")
    timed(device.DeviceFeeder, "fill", "fill")
    timed(device.DeviceFeeder, "wait_for_slot", "wait_for_slot")
    timed(device.DeviceFeeder, "start_copy", "start_copy")
    timed(transforms.CropFlipNormalize, "__call__", "transform")
    timed(device.DeviceFeeder, "finish", "finish")
    timed(loader, "unflatten", "unflatten")


class GcClock:
    """The seconds Python's garbage collector runs, by generation, while it is on (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds, self.count, self._start = collections.Counter(), collections.Counter(), 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.count[info["generation"]] += 1

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: Any) -> None:
        gc.callbacks.remove(self)


def synchronize() -> None:
    """Wait for the GPU (nothing to wait for on the CPU)."""
    import minidnn  # noqa: PLC0415

    if minidnn.cuda.is_available():
        minidnn.cuda.synchronize()


def loop(run: Any, batches: Any, log_every: int) -> dict[str, Any]:
    """train.py's loop body over ``batches`` (an iterator of device batches), each part timed on the host."""
    parts: dict[str, list[float]] = {name: [] for name in PARTS}
    next_parts: dict[str, list[float]] = collections.defaultdict(list)
    synchronize()
    started = time.perf_counter()
    count = 0
    with GcClock() as collector:
        while True:
            NEXT_PARTS.clear()
            t0 = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            images, labels = images.to(run.device), labels.to(run.device)
            t1 = time.perf_counter()
            logits, loss = (run.train_step if run.solved else run.first_step)(images, labels)
            run.solved = True
            t2 = time.perf_counter()
            run.scheduler.step()
            t3 = time.perf_counter()
            run.step += 1
            reused = run.captured is not None
            kept = run.watch.add(run.step, loss, copy=reused)
            t4 = time.perf_counter()
            run.meter.add(logits, labels, kept, copy=reused)
            t5 = time.perf_counter()
            for name, seconds in NEXT_PARTS.items():
                next_parts[name].append(1000 * seconds)
            for name, (a, b) in zip(PARTS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))):
                parts[name].append(1000 * (b - a))
            count += labels.shape[0]
            if run.step % log_every == 0:
                run.check_losses()
                run.meter.read()
        run.check_losses()
        run.meter.read()
        synchronize()
    wall = time.perf_counter() - started
    steps = len(parts["step"])
    return {"steps": steps, "images_per_second": round(count / wall, 1), "ms_per_step": round(1000 * wall / steps, 4),
            "host_ms_median": {name: round(statistics.median(v), 4) for name, v in parts.items()},
            "host_ms_mean": {name: round(statistics.fmean(v), 4) for name, v in parts.items()},
            "step_ms_quartiles": [round(q, 4) for q in statistics.quantiles(parts["step"], n=4)],
            "gc_ms": {str(g): round(1000 * s, 2) for g, s in sorted(collector.seconds.items())},
            "gc_count": {str(g): c for g, c in sorted(collector.count.items())},
            "next_ms_median": {name: round(statistics.median(v + [0.0] * (steps - len(v))), 4)
                               for name, v in next_parts.items()}}


def step_alone(run: Any, images: Any, labels: Any, steps: int) -> dict[str, Any]:
    """The step on one fixed batch, ``steps`` times back to back, then one wait (the benchmark's figure)."""
    for _ in range(3):
        run.train_step(images, labels)
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        run.train_step(images, labels)
    synchronize()
    wall = time.perf_counter() - started
    return {"steps": steps, "ms_per_step": round(1000 * wall / steps, 4),
            "images_per_second": round(steps * labels.shape[0] / wall, 1)}


def measure(data: str, args: argparse.Namespace, scratch: str) -> dict[str, Any]:
    out = os.path.join(scratch, f"run-{data}")
    flags = ["--model", args.model, "--batch-size", str(args.batch), "--device", args.device, "--no-cuda-graph",
             "--epochs", str(args.epochs), "--out", out, "--workers", "0"]
    if data == "cifar":
        flags += ["--data", synthesise_cifar(os.path.join(scratch, "cifar"), args.train_size, args.test_size)]
    else:
        flags += ["--data", data, "--train-size", str(args.train_size), "--test-size", str(args.test_size)]
    run = train.prepare(train.parse_args(flags))
    record: dict[str, Any] = {"data": data, "flags": flags, "epochs": []}
    for epoch in range(args.epochs):
        run.train_loader.set_epoch(epoch)
        record["epochs"].append(loop(run, iter(run.train_loader.iterate(0)), run.args.log_every))
        print(f"{data} epoch {epoch + 1}: {record['epochs'][-1]}", flush=True)
        run.end_epoch(epoch)
    run.train_loader.set_epoch(args.epochs)
    listed = list(run.train_loader.iterate(0))
    synchronize()
    record["listed"] = loop(run, iter(listed), run.args.log_every)
    print(f"{data} listed: {record['listed']}", flush=True)
    record["alone"] = step_alone(run, *listed[0], steps=len(listed))
    print(f"{data} alone: {record['alone']}", flush=True)
    if run.lock is not None:
        run.lock.release()
    return record


def markdown(records: list[dict[str, Any]]) -> str:
    lines = ["# An eager train.py step, part by part", "",
             "| data | pass | img/s | ms a step | host ms a step (median): next / step / scheduler / watch / meter | "
             "gc ms (count) |", "|---|---|---|---|---|---|"]
    for record in records:
        passes = [(f"epoch {i + 1}", e) for i, e in enumerate(record["epochs"])] + [("listed", record["listed"])]
        for name, result in passes:
            host = " / ".join(f"{result['host_ms_median'][p]:.3f}" for p in PARTS)
            collected = ", ".join(f"gen{g} {ms} ({result['gc_count'][g]})" for g, ms in result["gc_ms"].items())
            lines.append(f"| {record['data']} | {name} | {result['images_per_second']:.0f} | "
                         f"{result['ms_per_step']:.3f} | {host} | {collected or '–'} |")
        for name, result in passes:
            if result["next_ms_median"]:
                split = ", ".join(f"{part} {ms:.3f}" for part, ms in result["next_ms_median"].items())
                lines.append(f"| {record['data']} | {name}: next's parts (median ms) | {split} | | | |")
        alone = record["alone"]
        lines.append(f"| {record['data']} | step alone | {alone['images_per_second']:.0f} | {alone['ms_per_step']:.3f} "
                     f"| – | – |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--data", default="shapes10,cifar", help="comma-separated: shapes10, cifar (synthesised)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=20000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--device", default="cuda", help="cuda (the figure); cpu only checks the plumbing")
    parser.add_argument("--next-parts", action="store_true", help="time the parts of the loader's next as well")
    parser.add_argument("--out", required=True, help="folder for train-loop-host.json and .md")
    args = parser.parse_args()
    if args.next_parts:
        time_next_parts()
    scratch = tempfile.mkdtemp(prefix="minidnn-train-loop-host-")
    try:
        records = [measure(data, args, scratch) for data in args.data.split(",")]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_outputs(args.out, "train-loop-host", records, markdown(records))
    print(markdown(records))


if __name__ == "__main__":
    main()
