# Justifies the eager dispatch work of issue 22 (minidnn/autograd.py's Function.apply, the engine seam in
# minidnn/engine.py, the convolution fast path in minidnn/primitives/conv/api.py): where an eager step's host time goes.
"""Profile one eager training step per model and math mode: host time, wall time, kernels, top functions.

    PYTHONPATH=. python3 benchmarks/probes/eager_step_profile.py --out DIR
    PYTHONPATH=. python3 benchmarks/probes/eager_step_profile.py --out DIR --models resnet20:128 --engines minidnn,torch

Each (engine, model, mode) runs in its own process, so that no mode's timed steps follow another's CUPTI session
(torch.profiler), which may leave its hooks in the driver's calls; through the benchmark's own engines
(benchmarks/measure.py): SGD with momentum, the benchmark's seeded batch. After the warm-up it times
``--steps`` eager steps (wall by device events, host up to the step's return), counts the kernels of a few steps
(CUPTI through torch.profiler), and for minidnn runs one step under cProfile: the functions with the most own time,
the most calls, and the total number of Python calls. Writes profile.json and profile.md (and the raw profile text
of each cell) under --out.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

SUITE = {"caffenet": ("alexnet_caffe", 227), "resnet18": ("resnet18", 224), "resnet50": ("resnet50", 224),
         "resnet20": ("resnet20", 32)}
DEFAULT_MODELS = "caffenet:128,resnet18:64,resnet50:64,resnet20:128"


def top_functions(profile: cProfile.Profile, key: str, count: int) -> list[dict]:
    """The ``count`` functions with the largest ``key`` ("tottime" or "ncalls"), as plain records."""
    stats = pstats.Stats(profile)
    rows = []
    for (path, line, name), (primitive_calls, calls, own, cumulative, _) in stats.stats.items():
        where = f"{os.path.relpath(path) if path.startswith('/') else path}:{line}({name})"
        rows.append({"function": where, "calls": calls, "own_ms": own * 1000, "cumulative_ms": cumulative * 1000})
    rows.sort(key=lambda r: -(r["own_ms"] if key == "tottime" else r["calls"]))
    return rows[:count]


def host_time_by_call(engine, steps: int) -> list[dict]:
    """Host ms per step inside each engine operation, each cuBLAS call and each kernel launch (inclusive:
    a convolution's time holds its launches'), over ``steps`` steps: where a step's host time goes, the
    driver's own included, which cProfile cannot separate from Python."""
    import time as clock  # noqa: PLC0415

    from minidnn import engine as engines  # noqa: PLC0415
    from minidnn.primitives import _cuda, blas  # noqa: PLC0415

    totals: dict[str, list] = {}

    def timed(name, function):
        def wrapper(*args, **kwargs):
            start = clock.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                entry = totals.setdefault(name, [0.0, 0])
                entry[0] += clock.perf_counter() - start
                entry[1] += 1
        return wrapper

    module = engines.current().module
    targets = [(module, name) for name in engines.CONTRACT] + [(_cuda, "launch"), (_cuda, "launch_blocks"),
                                                              (blas._Cublas, "gemm")]
    originals = [(owner, name, getattr(owner, name)) for owner, name in targets]
    for owner, name, function in originals:
        setattr(owner, name, timed(f"{getattr(owner, '__name__', owner)}.{name}", function))
    try:
        engine.synchronize()
        for _ in range(steps):
            engine.step()
        engine.synchronize()
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)
    rows = [{"call": name.replace("minidnn.primitives.", ""), "host_ms_per_step": 1000 * total / steps,
             "calls_per_step": count / steps} for name, (total, count) in totals.items()]
    return sorted(rows, key=lambda r: -r["host_ms_per_step"])


def kernel_names(engine, steps: int) -> list[dict]:
    """Kernels per step by name (CUPTI through torch.profiler), most frequent first."""
    from benchmarks import measure  # noqa: PLC0415

    def run():
        for _ in range(steps):
            engine.step()

    events = measure._profiled_trace(engine, run, ["CUDA"]) or []
    counts: dict[str, list] = {}
    for event in events:
        if event.get("cat") == "kernel":
            entry = counts.setdefault(event["name"][:90], [0, 0.0])
            entry[0] += 1
            entry[1] += event.get("dur", 0.0)
    rows = [{"kernel": name, "per_step": count / steps, "us_per_step": duration / steps}
            for name, (count, duration) in counts.items()]
    return sorted(rows, key=lambda r: -r["per_step"])


def driver_calls(engine, steps: int) -> tuple[list[dict], list[dict]]:
    """The CUDA runtime and driver calls of ``steps`` steps (CUPTI through torch.profiler): by name, calls per step,
    µs per step and the longest call in µs; and the ten longest calls one by one, each with the kernel it launched
    and that kernel's wait on the GPU (from the call's return to the kernel's start). A call that waits for the GPU (a
    full launch queue, a synchronisation) shows as long, its kernel starting long after it returns; a call held up on
    the host (the profiler's own buffers) shows as long with its kernel starting at once."""
    from benchmarks import measure  # noqa: PLC0415

    def run():
        for _ in range(steps):
            engine.step()

    events = measure._profiled_trace(engine, run, ["CUDA"]) or []
    kernels = {e["args"]["correlation"]: e for e in events
               if e.get("cat") == "kernel" and e.get("ph") == "X" and "correlation" in e.get("args", {})}
    calls: dict[str, list] = {}
    single = []
    for event in events:
        if event.get("cat") in ("cuda_runtime", "cuda_driver") and event.get("ph") == "X":
            duration = float(event.get("dur", 0.0))
            entry = calls.setdefault(event["name"], [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += duration
            entry[2] = max(entry[2], duration)
            kernel = kernels.get(event.get("args", {}).get("correlation"))
            single.append({"call": event["name"], "us": duration, "kernel": kernel["name"][:80] if kernel else "",
                           "kernel_waited_us": float(kernel["ts"]) - float(event["ts"]) - duration if kernel else None})
    rows = [{"call": name, "per_step": count / steps, "us_per_step": total / steps, "longest_us": longest}
            for name, (count, total, longest) in calls.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"]), sorted(single, key=lambda r: -r["us"])[:10]


def profile_cell(engine_name: str, model: str, batch: int, modes: list[str], steps: int, out: str,
                 device: str) -> list[dict]:
    from benchmarks import measure  # noqa: PLC0415 - after sys.path

    architecture, side = SUITE[model]
    records = []
    for mode in modes:
        precision, _, arrangement = mode.partition("+")  # "bf16+channels_last": the model and batch channels-last
        if arrangement not in ("", "channels_last"):
            raise ValueError(f"--modes: {mode!r} is not a precision, or a precision+channels_last")
        spec = {"engine": engine_name, "architecture": architecture, "image_size": side, "batch": batch,
                "num_classes": 1000 if side > 32 else 10, "device": device, "precision": precision,
                "channels_last": arrangement == "channels_last"}
        engine = measure.ENGINES[engine_name](spec)
        with measure.measurement_state(engine_name, precision):
            start = time.perf_counter()
            engine.step()
            engine.synchronize()
            first = time.perf_counter() - start
            engine.clock.time(engine.step, 4)
            engine.prepare()  # the captured engine captures here; minidnn's eager one settles its whole-step choice
            record_extra = engine.prepared()
            engine.clock.time(engine.step, 1)
            wall, host = engine.clock.time(engine.step, steps)
            record = {"engine": engine_name, "model": model, "batch": batch, "mode": mode, "first_step_s": first,
                      "wall_ms": statistics.median(wall), "host_ms": statistics.median(host), "steps": steps}
            record.update(record_extra)
            if engine.gpu:
                engine.synchronize()
                engine.reset_peak()
                engine.step()
                engine.synchronize()
                record.update(engine.memory())
            if engine_name == "minidnn":  # before any CUPTI session, which may leave its hooks in the driver's calls
                record["host_by_call"] = host_time_by_call(engine, 5)
            if engine_name != "minidnn-graph":  # a replay runs the eager step's kernels: counted there
                record.update(measure.profile_steps(engine, 3))
                record["kernels_by_name"] = kernel_names(engine, 2)
                record["driver_calls"], record["longest_driver_calls"] = driver_calls(engine, 3)
            if engine_name == "minidnn":
                engine.synchronize()
                profile = cProfile.Profile()
                profile.enable()
                engine.step()
                engine.synchronize()
                profile.disable()
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
                name = f"{engine_name}-{model}-{batch}-{mode}"
                with open(os.path.join(out, f"{name}.txt"), "w") as file:
                    file.write(text.getvalue())
                # The whole profile by cumulative time, and what each primitive's GPU path calls: where a
                # primitive's host time goes below it.
                text = io.StringIO()
                stats = pstats.Stats(profile, stream=text).sort_stats("cumulative")
                stats.print_stats()
                stats.print_callees(r"conv2d_|batch_norm_(forward|backward)_training|_by_chunks|_training_gpu|"
                                    r"_launch_backward_filter|_launch_forward|_run\b|apply\b")
                with open(os.path.join(out, f"{name}-cumulative.txt"), "w") as file:
                    file.write(text.getvalue())
                record["python_calls"] = sum(calls for _, calls, _, _, _ in pstats.Stats(profile).stats.values())
                record["top_own_time"] = top_functions(profile, "tottime", 25)
                record["top_calls"] = top_functions(profile, "ncalls", 15)
        records.append(record)
        del engine
    return records


def write_report(records: list[dict], out: str) -> None:
    with open(os.path.join(out, "profile.json"), "w") as file:
        json.dump({"records": records}, file, indent=1)
    lines = ["| engine | model, batch | mode | wall ms | host ms | kernels/step | GPU-busy ms | peak MiB | Python calls |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['engine']} | {r['model']} {r['batch']} | {r['mode']} | {r['wall_ms']:.2f} | "
                     f"{r['host_ms']:.2f} | {r.get('kernels_per_step', float('nan')):.0f} | "
                     f"{r.get('gpu_busy_ms', float('nan')):.2f} | {r.get('peak_bytes', 0) / 2**20:.0f} | "
                     f"{r.get('python_calls', '')} |")
    for r in records:
        if "host_by_call" in r:
            lines += ["", f"### {r['engine']} {r['model']} {r['batch']} {r['mode']}: host ms per step by call "
                      "(inclusive)", "", "| call | calls/step | host ms/step |", "|---|---|---|"]
            lines += [f"| `{t['call']}` | {t['calls_per_step']:.0f} | {t['host_ms_per_step']:.2f} |"
                      for t in r["host_by_call"][:20]]
        if r.get("kernels_by_name"):
            lines += ["", f"### {r['engine']} {r['model']} {r['batch']} {r['mode']}: kernels per step by name", "",
                      "| kernel | per step | µs per step |", "|---|---|---|"]
            lines += [f"| `{t['kernel']}` | {t['per_step']:.0f} | {t['us_per_step']:.0f} |"
                      for t in r["kernels_by_name"][:25]]
        if r.get("driver_calls"):
            lines += ["", f"### {r['engine']} {r['model']} {r['batch']} {r['mode']}: CUDA runtime and driver calls per "
                      "step", "", "| call | per step | µs per step | longest µs |", "|---|---|---|---|"]
            lines += [f"| `{t['call']}` | {t['per_step']:.0f} | {t['us_per_step']:.0f} | {t['longest_us']:.0f} |"
                      for t in r["driver_calls"][:15]]
            lines += ["", f"### {r['engine']} {r['model']} {r['batch']} {r['mode']}: the longest calls", "",
                      "| call | µs | kernel launched | its wait on the GPU, µs |", "|---|---|---|---|"]
            lines += [f"| `{t['call']}` | {t['us']:.0f} | `{t['kernel']}` | "
                      f"{'' if t['kernel_waited_us'] is None else format(t['kernel_waited_us'], '.0f')} |"
                      for t in r["longest_driver_calls"]]
        if "top_own_time" in r:
            lines += ["", f"### {r['engine']} {r['model']} {r['batch']} {r['mode']}: most own time", "",
                      "| function | calls | own ms | cumulative ms |", "|---|---|---|---|"]
            lines += [f"| `{t['function']}` | {t['calls']} | {t['own_ms']:.2f} | {t['cumulative_ms']:.2f} |"
                      for t in r["top_own_time"]]
    with open(os.path.join(out, "profile.md"), "w") as file:
        file.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default=DEFAULT_MODELS, help="model:batch,... of " + ", ".join(SUITE))
    parser.add_argument("--engines", default="minidnn", help="minidnn, minidnn-graph (captured) and/or torch")
    parser.add_argument("--modes", default="fp32,tf32", help="precisions, comma-separated: fp32, tf32, bf16, fp16, "
                        "each with +channels_last for a channels-last model and batch (bf16+channels_last)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to try the probe itself")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # engine:model:batch, --modes in this process
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    modes = args.modes.split(",")
    if args.cell:
        engine, model, batch = args.cell.split(":")
        records = profile_cell(engine, model, int(batch), modes, args.steps, args.out, args.device)
        with open(os.path.join(args.out, f"cell-{engine}-{model}-{batch}.json"), "w") as file:
            json.dump(records, file)
        return
    records = []
    for engine in args.engines.split(","):
        for item in args.models.split(","):
            model, batch = item.split(":")
            cell = f"{engine}:{model}:{batch}"
            for mode in modes:
                done = subprocess.run([sys.executable, __file__, "--out", args.out, "--modes", mode, "--steps",
                                       str(args.steps), "--device", args.device, "--cell", cell], timeout=600)
                path = os.path.join(args.out, f"cell-{engine}-{model}-{batch}.json")
                if done.returncode == 0 and os.path.exists(path):
                    with open(path) as file:
                        records += json.load(file)
                    os.remove(path)
                else:
                    print(f"cell {cell} {mode} failed (exit {done.returncode})", flush=True)
    write_report(records, args.out)
    print(open(os.path.join(args.out, "profile.md")).read().split("\n###")[0])


if __name__ == "__main__":
    main()
