# Justifies the framework-layer work of issue 22 (nn, functional, autograd, optim): the host time an eager step
# spends above the primitives, which the GPU pays on every step in front of its launches, measured on the CPU.
"""An eager training step's host time above the primitives: every primitive call answered from a recording.

    PYTHONPATH=. python3 benchmarks/probes/framework_overhead.py --out DIR [--models resnet20:8,resnet18:2]

A "replay" engine (minidnn/engine.py's seam) runs one step on minidnn's own primitives and records each call's name
and result in order; every later step gets the recorded results back in that order, without any work (a step of a
fixed model makes the same calls every time, and each call checks its name against the recording). In-place updates
(the optimizer's, batch norm's running statistics) then no longer happen, which the framework cannot see. What
remains of a step is the framework's Python (modules, functional, graph nodes, the backward walk, the optimizer's
loop), the NumPy work it does itself (gradient sums) and the replay's own list lookup, which the report measures
alone and gives beside. Writes DIR/framework.json and DIR/framework.md: ms a step, Python calls a step, own time
by file.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

import minidnn  # noqa: E402
import models  # noqa: E402
from minidnn import engine as engines  # noqa: E402
from minidnn import optim  # noqa: E402
import minidnn.functional as F  # noqa: E402

SUITE = {"resnet20": ("resnet20", 32, 10), "resnet18": ("resnet18", 224, 1000), "caffenet": ("alexnet_caffe", 227, 1000)}


class Replay:
    """The recording: ``recording`` True while a step runs on the primitives, then each call's result in order."""

    def __init__(self) -> None:
        self.recording, self.calls, self.position = True, [], 0

    def start_step(self) -> None:
        self.position = 0

    def module(self) -> types.ModuleType:
        """A module with every contract function of minidnn's primitives, recorded or replayed."""
        primitives = engines.ENGINES["minidnn"].module
        module = types.ModuleType("framework_overhead_replay")

        def wrapped(name, function):
            def call(*args, **kwargs):
                if self.recording:
                    result = function(*args, **kwargs)
                    self.calls.append((name, result))
                    return result
                recorded_name, result = self.calls[self.position]
                if recorded_name != name:
                    raise RuntimeError(f"the step called {name} where the recording has {recorded_name}")
                self.position += 1
                return result
            return call

        for name in engines.CONTRACT:
            setattr(module, name, wrapped(name, getattr(primitives, name)))
        return module


def replay_lookup_us() -> float:
    """What one replayed call costs, the engine's own part of the figures."""
    replay = Replay()
    call = replay.module().relu_forward
    x = np.zeros(4, np.float32)
    call(x)
    replay.recording = False
    start = time.perf_counter()
    for _ in range(20000):
        replay.position = 0
        call(x)
    return (time.perf_counter() - start) / 20000 * 1e6


def measure(model_name: str, batch: int, steps: int, replay: Replay) -> dict:
    architecture, side, classes = SUITE[model_name]
    minidnn.manual_seed(0)
    model = models.create(architecture, num_classes=classes)
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    rng = np.random.default_rng(0)
    x = minidnn.tensor(rng.standard_normal((batch, 3, side, side)).astype(np.float32))
    y = minidnn.tensor(np.arange(batch) % classes)

    def step():
        replay.start_step()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    replay.recording, replay.calls = True, []
    step()  # a warm-up on the primitives, then the step that is recorded
    replay.calls.clear()
    step()
    replay.recording = False
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(1000 * (time.perf_counter() - start))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        step()
    profile.disable()
    by_file: dict[str, list] = {}
    calls = 0
    for (path, _, _), (_, count, own, _, _) in pstats.Stats(profile).stats.items():
        where = os.path.relpath(path) if path.startswith("/") else path
        where = where if "minidnn" in where or "models" in where or "probes" in where else "other (builtins, NumPy)"
        entry = by_file.setdefault(where, [0.0, 0])
        entry[0] += own * 1000 / 10
        entry[1] += count / 10
        calls += count / 10
    rows = sorted(({"file": k, "own_ms": v[0], "calls": v[1]} for k, v in by_file.items()), key=lambda r: -r["own_ms"])
    return {"model": model_name, "batch": batch, "ms_per_step": statistics.median(times), "least_ms": min(times),
            "primitive_calls": len(replay.calls), "python_calls": calls, "by_file": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="resnet20:8,resnet18:2")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    replay = Replay()
    engines.ENGINES["replay"] = engines.Engine("replay", "framework_overhead_replay")
    sys.modules["framework_overhead_replay"] = replay.module()
    lookup = replay_lookup_us()
    records = []
    with minidnn.use_engine("replay"):
        for item in args.models.split(","):
            name, batch = item.split(":")
            records.append(measure(name, int(batch), args.steps, replay))
    os.makedirs(args.out, exist_ok=True)
    lines = [f"Host ms a step above the primitives (median of {args.steps}; the replay's {lookup:.2f} µs a primitive "
             "call is inside these figures).", "",
             "| model, batch | ms a step (least) | primitive calls a step | Python calls a step |", "|---|---|---|---|"]
    lines += [f"| {r['model']} {r['batch']} | {r['ms_per_step']:.3f} ({r['least_ms']:.3f}) | {r['primitive_calls']} | "
              f"{r['python_calls']:.0f} |" for r in records]
    for r in records:
        lines += ["", f"### {r['model']} {r['batch']}: own time by file under cProfile (ms a step)", "",
                  "| file | own ms | calls |", "|---|---|---|"]
        lines += [f"| `{f['file']}` | {f['own_ms']:.3f} | {f['calls']:.0f} |" for f in r["by_file"][:14]]
    for stem, text in (("framework.json", json.dumps({"replay_call_us": lookup, "records": records}, indent=1)),
                       ("framework.md", "\n".join(lines) + "\n")):
        temporary = os.path.join(args.out, stem + ".part")
        with open(temporary, "w") as file:
            file.write(text)
        os.replace(temporary, os.path.join(args.out, stem))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
