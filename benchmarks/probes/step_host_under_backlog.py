# Justifies reading an eager step's host time as the host's own work (issue 22): a step that waited for the GPU
# anywhere would take the GPU's backlog into its host time, and fp32's slower kernels would then cost host time.
"""Time an eager training step's host work with the GPU idle and with the GPU busy for a long time ahead of it.

    PYTHONPATH=. python3 benchmarks/probes/step_host_under_backlog.py --out DIR
    PYTHONPATH=. python3 benchmarks/probes/step_host_under_backlog.py --out DIR --cells minidnn:resnet20:128:fp32

Each cell (engine, model, batch, mode) runs in its own process, through the benchmark's engines
(benchmarks/measure.py). After the warm-up, steps alternate between two conditions:

- idle: the device synchronised, then the step timed on the host up to its return (as the benchmark times it);
- backlog: the device synchronised, a one-thread spin kernel of ``--backlog-ms`` queued, then the step timed the
  same way. Every launch of the step queues behind the spin, so none can wait for its predecessor's kernel: the
  step's host time is then its Python and driver work alone. A step that synchronises with the GPU anywhere
  (``.item()``, a device-to-host copy, ``cudaFree``) instead takes the whole backlog into its host time.

Under the backlog the step's three phases are timed too: forward with the loss, ``zero_grad`` with backward, and the
optimizer's step. Writes DIR/backlog.json and DIR/backlog.md (medians, least-greatest).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

SUITE = {"resnet20": ("resnet20", 32), "resnet18": ("resnet18", 224), "caffenet": ("alexnet_caffe", 227),
         "resnet50": ("resnet50", 224)}
DEFAULT_CELLS = ("minidnn:resnet20:128:fp32,minidnn:resnet20:128:tf32,"
                 "torch:resnet20:128:fp32,torch:resnet20:128:tf32")

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def spinner(engine):
    """A function that queues a one-thread kernel spinning for a number of clock cycles on the engine's stream."""
    if engine.name == "torch":
        return engine.torch.cuda._sleep
    from minidnn import backend  # noqa: PLC0415

    cupy = backend.cupy()
    kernel = cupy.RawKernel(SPIN, "spin")
    return lambda cycles: kernel((1,), (1,), (cupy.int64(cycles),))


def cycles_per_ms(engine, spin) -> float:
    """The spin kernel's clock cycles per millisecond, timed with device events."""
    begin, end = engine.clock.new_event(), engine.clock.new_event()
    cycles = 20_000_000
    spin(cycles)
    engine.synchronize()
    begin.record()
    spin(cycles)
    end.record()
    end.synchronize()
    return cycles / engine.clock.elapsed(begin, end)


def host_ms(call) -> float:
    start = time.perf_counter()
    call()
    return 1000 * (time.perf_counter() - start)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "least": min(values), "greatest": max(values)}


def run_cell(engine_name: str, model: str, batch: int, mode: str, steps: int, backlog_ms: float) -> dict:
    from benchmarks import measure  # noqa: PLC0415 - after sys.path

    architecture, side = SUITE[model]
    spec = {"engine": engine_name, "architecture": architecture, "image_size": side, "batch": batch,
            "num_classes": 1000 if side > 32 else 10, "device": "cuda", "precision": mode}
    engine = measure.ENGINES[engine_name](spec)
    with measure.measurement_state(engine_name, mode):
        for _ in range(6):
            engine.step()
        engine.synchronize()
        spin = spinner(engine)
        cycles = int(cycles_per_ms(engine, spin) * backlog_ms)
        state = {"loss": None}

        def forward():
            with engine.autocast():
                state["loss"] = engine.cross_entropy(engine.model(engine.x), engine.y)

        def backward():
            engine.optimizer.zero_grad()
            state["loss"].backward()

        idle, backlog, phases = [], [], {"forward": [], "backward": [], "optimizer": []}
        leftover = []  # the backlog still queued when the step returned: the GPU's time after it, from events
        for _ in range(steps):
            engine.synchronize()
            idle.append(host_ms(engine.step))
            engine.synchronize()
            spin(cycles)
            start = time.perf_counter()
            engine.step()
            backlog.append(1000 * (time.perf_counter() - start))
            mark = engine.clock.new_event()
            mark.record()
            waited = time.perf_counter()
            mark.synchronize()
            leftover.append(1000 * (time.perf_counter() - waited))
            spin(cycles)
            phases["forward"].append(host_ms(forward))
            phases["backward"].append(host_ms(backward))
            phases["optimizer"].append(host_ms(engine.optimizer.step))
            engine.synchronize()
    return {"engine": engine_name, "model": model, "batch": batch, "mode": mode, "steps": steps,
            "backlog_ms": backlog_ms, "idle_host_ms": summary(idle), "backlog_host_ms": summary(backlog),
            "wait_after_return_ms": summary(leftover),
            "phases_host_ms": {name: summary(values) for name, values in phases.items()}}


def write_report(records: list[dict], out: str) -> None:
    def cell(s: dict) -> str:
        return f"{s['median']:.2f} ({s['least']:.2f}-{s['greatest']:.2f})"

    lines = ["Host ms per eager step, median (least-greatest); the backlog is a spin kernel queued before the step.",
             "", "| engine | model, batch | mode | idle GPU | GPU backlog | backlog left at return | forward | "
             "backward | optimizer |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        p = r["phases_host_ms"]
        lines.append(f"| {r['engine']} | {r['model']} {r['batch']} | {r['mode']} | {cell(r['idle_host_ms'])} | "
                     f"{cell(r['backlog_host_ms'])} | {cell(r['wait_after_return_ms'])} | {cell(p['forward'])} | "
                     f"{cell(p['backward'])} | {cell(p['optimizer'])} |")
    for stem, text in (("backlog.json", json.dumps({"records": records}, indent=1)),
                       ("backlog.md", "\n".join(lines) + "\n")):
        temporary = os.path.join(out, stem + ".part")
        with open(temporary, "w") as file:
            file.write(text)
        os.replace(temporary, os.path.join(out, stem))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cells", default=DEFAULT_CELLS, help="engine:model:batch:mode,... (engines minidnn and "
                        "torch; modes fp32, tf32)")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--backlog-ms", type=float, default=60.0,
                        help="the spin kernel's length: longer than a step's host time")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # one cell, run in this process
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.cell:
        engine, model, batch, mode = args.cell.split(":")
        record = run_cell(engine, model, int(batch), mode, args.steps, args.backlog_ms)
        with open(os.path.join(args.out, f"cell-{args.cell.replace(':', '-')}.json"), "w") as file:
            json.dump(record, file)
        return
    records = []
    for cell in args.cells.split(","):
        done = subprocess.run([sys.executable, __file__, "--out", args.out, "--steps", str(args.steps),
                               "--backlog-ms", str(args.backlog_ms), "--cell", cell], timeout=600)
        path = os.path.join(args.out, f"cell-{cell.replace(':', '-')}.json")
        if done.returncode == 0 and os.path.exists(path):
            with open(path) as file:
                records.append(json.load(file))
            os.remove(path)
        else:
            print(f"cell {cell} failed (exit {done.returncode})", flush=True)
    write_report(records, args.out)
    print(open(os.path.join(args.out, "backlog.md")).read())


if __name__ == "__main__":
    main()
