"""Justifies the CPU rule of `preference` in minidnn/primitives/conv/selection.py (`get`, which `algo="auto"` uses there).

Every convolution kernel of the small models (shapes_cnn and tiny_cnn at batch 64, the CIFAR ResNet-20/32/56 at
batch 128, and the benchmark's --quick batch of 8), every direction, every algorithm of the menu, timed on this
CPU; beside them the plan `algo="auto"` makes and the plan `algo="gemm"` makes at the default workspace limit,
run as a convolution call runs them, and their ratio:

    python benchmarks/probes/cpu_conv_menu_small_models.py --out benchmarks/results/<date>-cpu-conv-menu-small-models

A shared machine makes CPU timings noisy, so each figure is the fastest call of blocks of calls (at least
--block-seconds each), and a block counts only if the other processes used at most --quiet cores meanwhile
(the machine's busy time from /proc/stat less this process's own CPU time); blocks are retried until that
holds or --tries run out, and each record says how busy the others were in its cleanest block.
``--clock cpu`` times this process's CPU time instead of the wall clock: run with one BLAS thread
(OPENBLAS_NUM_THREADS=1) it measures each algorithm's work, which other processes hardly change.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # a checkout

import minidnn  # noqa: E402
import models  # noqa: E402
from minidnn.primitives import conv  # noqa: E402
from minidnn.primitives.conv import api, plans, registry  # noqa: E402
from minidnn.primitives.conv.problem import ConvProblem  # noqa: E402

DIRECTIONS = ("forward", "backward_data", "backward_filter")
# model: the batch it trains at (train.py's default for the small CNNs, the CIFAR ResNets' usual one)
MODELS = {"shapes_cnn": 64, "tiny_cnn": 64, "resnet20": 128, "resnet32": 128, "resnet56": 128}
QUICK_BATCH = 8  # benchmarks/bench.py --quick
TICKS = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------------------------
# The kernels
# ----------------------------------------------------------------------------------------------
def layer_problems(name: str) -> dict[ConvProblem, int]:
    """Each distinct convolution problem of one forward pass of ``name`` (batch 1) and its number of layers."""
    counts: dict[ConvProblem, int] = {}
    model = models.create(name)
    plans.call_observer = lambda direction, problem, plan: counts.__setitem__(problem, counts.get(problem, 0) + 1)
    try:
        with minidnn.no_grad():
            model(minidnn.zeros(1, 3, models.input_size(name), models.input_size(name)))
    finally:
        plans.call_observer = None
    return counts


def kernels(batches: str) -> list[dict[str, Any]]:
    """(problem at its batch, direction, {model: layers}) for every kernel, each problem once."""
    found: dict[tuple, dict[str, int]] = {}
    for name, batch in MODELS.items():
        sizes = {"usual": [batch], "quick": [QUICK_BATCH], "both": [batch, QUICK_BATCH]}[batches]
        for problem, layers in layer_problems(name).items():
            for size in sizes:
                for direction in DIRECTIONS:
                    found.setdefault((problem.with_batch(size), direction), {})[name] = layers
    return [{"problem": p, "direction": d, "models": m} for (p, d), m in found.items()]


# ----------------------------------------------------------------------------------------------
# Timing on a shared machine
# ----------------------------------------------------------------------------------------------
def _machine_busy_seconds() -> float:
    values = [int(v) for v in open("/proc/stat", encoding="ascii").readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / TICKS  # all but idle and iowait


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def block(call: Callable[[], None], seconds: float, clock: Callable[[], float]) -> tuple[float, float]:
    """(fastest call in ms by ``clock``, cores the other processes used meanwhile) over calls for at least
    ``seconds`` of wall time."""
    fastest, start = float("inf"), time.perf_counter()
    busy, own = _machine_busy_seconds(), _own_seconds()
    calls = 0
    while calls < 2 or time.perf_counter() - start < seconds:
        before = clock()
        call()
        fastest = min(fastest, clock() - before)
        calls += 1
    elapsed = time.perf_counter() - start
    others = (_machine_busy_seconds() - busy) - (_own_seconds() - own)
    return 1000 * fastest, max(others, 0.0) / elapsed


def time_all(calls: dict[str, Callable[[], None]], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each call's fastest time over ``args.rounds`` clean blocks, the calls interleaved round by round; a
    call with no clean block after ``args.tries`` rounds keeps its least busy one (see the module docstring)."""
    for call in calls.values():
        call()  # warm-up: first touch of the buffers
    # By CPU time with one BLAS thread, the other cores may be busy: only this one's share matters.
    allowed = args.quiet + ((os.cpu_count() or 1) - 1 if args.clock == "cpu" else 0)
    clean: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    least_busy: dict[str, tuple[float, float]] = {}
    for round_ in range(args.tries):
        pending = [name for name in calls if len(clean[name]) < args.rounds]
        if not pending:
            break
        if round_ >= args.rounds:
            time.sleep(args.wait)  # the machine was busy: give the others time to finish
        for name in pending:
            ms, others = block(calls[name], args.block_seconds, CLOCKS[args.clock])
            if others <= allowed:
                clean[name].append((ms, others))
            elif name not in least_busy or others < least_busy[name][1]:
                least_busy[name] = (ms, others)
    timed = {}
    for name in calls:
        if clean[name]:
            timed[name] = {"ms": min(ms for ms, _ in clean[name]), "others_cores": max(o for _, o in clean[name]),
                           "clean_blocks": len(clean[name])}
        else:
            ms, others = least_busy[name]
            timed[name] = {"ms": ms, "others_cores": others, "clean_blocks": 0}
    return timed


# ----------------------------------------------------------------------------------------------
# One kernel
# ----------------------------------------------------------------------------------------------
def measure(kernel: dict[str, Any], args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    problem, direction = kernel["problem"], kernel["direction"]
    first_shape, second_shape, out_shape = {
        "forward": (problem.x_shape, problem.w_shape, problem.y_shape),
        "backward_data": (problem.y_shape, problem.w_shape, problem.x_shape),
        "backward_filter": (problem.x_shape, problem.y_shape, problem.w_shape)}[direction]
    first = rng.standard_normal(first_shape).astype(problem.dtype)
    second = rng.standard_normal(second_shape).astype(problem.dtype)
    out = np.empty(out_shape, dtype=problem.dtype)
    limit = registry.workspace_limit()

    def plan_call(plan: plans.Plan) -> Callable[[], None]:
        return lambda: api._run(plan, direction, first, second, problem, out)

    def algorithm_call(algorithm: registry.ConvAlgorithm) -> Callable[[], None]:
        workspace = np.empty(algorithm.workspace_bytes(problem, direction), dtype=np.uint8)
        return lambda: algorithm.run(direction, first, second, problem, out, False, workspace if workspace.size else None)

    menu = {name: a for name, a in registry.algorithms().items() if a.automatic and a.supports(problem, direction)}
    auto_plan = api.make_plan(problem, direction, "auto", limit)
    gemm_plan = api.make_plan(problem, direction, "gemm", limit)
    calls = {name: algorithm_call(a) for name, a in menu.items()}
    calls["auto"], calls["gemm plan"] = plan_call(auto_plan), plan_call(gemm_plan)
    timed = time_all(calls, args)
    algorithms = {name: {"ms": round(timed[name]["ms"], 3), "workspace_bytes": a.workspace_bytes(problem, direction),
                         "fits_default_limit": a.workspace_bytes(problem, direction) <= limit,
                         "others_cores": round(timed[name]["others_cores"], 3)} for name, a in menu.items()}
    fastest = min(algorithms, key=lambda name: algorithms[name]["ms"])
    auto_ms, gemm_ms = timed["auto"]["ms"], timed["gemm plan"]["ms"]
    return {
        "models": kernel["models"], "direction": direction, "problem": problem.describe(),
        "N": problem.N, "C": problem.C, "H": problem.H, "W": problem.W, "K": problem.K, "R": problem.R, "S": problem.S,
        "stride": list(problem.stride), "padding": list(problem.padding),
        "auto": {"plan": auto_plan.describe(), "ms": round(auto_ms, 3),
                 "others_cores": round(timed["auto"]["others_cores"], 3)},
        "gemm": {"plan": gemm_plan.describe(), "ms": round(gemm_ms, 3),
                 "others_cores": round(timed["gemm plan"]["others_cores"], 3)},
        "same_plan": auto_plan.segments == gemm_plan.segments,
        "auto_over_gemm": round(auto_ms / gemm_ms, 3),
        "fastest": fastest, "fastest_over_gemm": round(algorithms[fastest]["ms"] / gemm_ms, 3),
        "algorithms": algorithms,
    }


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                  if line.startswith("model name")), platform.processor() or platform.machine())
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {}) if hasattr(np.__config__, "CONFIG") else {}
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "blas": f"{blas.get('name', '?')} {blas.get('version', '')}".strip(), "minidnn": minidnn.__version__,
            "commit": commit, "date": datetime.date.today().isoformat(),
            "workspace_limit_bytes": registry.workspace_limit(), "load_average_at_start": os.getloadavg()}


def markdown(records: list[dict[str, Any]], info: dict[str, Any], seconds: float, clock: str) -> str:
    measured = ("wall-clock milliseconds per call" if clock == "wall" else
                "milliseconds of this process's CPU time per call (the work, with "
                f"OPENBLAS_NUM_THREADS={info['blas_threads']})")
    lines = [f"# CPU convolution menu, every kernel of the small models ({info['date']}, commit {info['commit']})", "",
             f"{info['cpu']}, {info['cores']} cores, NumPy {info['numpy']} ({info['blas']}, BLAS threads: "
             f"{info['blas_threads']}), Python {info['python']}; workspace limit "
             f"{info['workspace_limit_bytes'] >> 20} MiB; {len(records)} kernels in {seconds:.0f} s. "
             f"Figures are {measured}, the fastest of clean blocks (benchmarks/probes/cpu_conv_menu_small_models.py "
             "says how); `auto` and `gemm` are the plans `algo=\"auto\"` and `algo=\"gemm\"` make at that limit "
             "(gemm in micro-batches where its columns do not fit).", ""]
    three = [r for r in records if (r["R"], r["S"]) == (3, 3)]
    same = sorted(r["auto_over_gemm"] for r in three if r["same_plan"])
    other = [r for r in three if not r["same_plan"]]
    if other:
        ratios = sorted(r["auto_over_gemm"] for r in other)
        worst = max(other, key=lambda r: r["auto_over_gemm"])
        lines += [f"**auto/gemm on the {len(other)} 3x3 kernels where auto runs another plan than gemm's: median "
                  f"{ratios[len(ratios) // 2]:.2f}, worst {ratios[-1]:.2f}** ({worst['direction']} "
                  f"{worst['problem']}: {worst['auto']['plan']}).", ""]
    if same:
        lines += [f"On the other {len(same)} 3x3 kernels auto runs gemm's own plan, so auto/gemm is 1 by "
                  f"construction; their two timings of that one plan differ by a ratio of {same[0]:.2f} to "
                  f"{same[-1]:.2f} (median {same[len(same) // 2]:.2f}): the noise of these figures.", ""]
    names = sorted({name for r in records for name in r["algorithms"]})
    lines += ["| models (layers) | direction | problem | auto plan | auto | gemm | auto/gemm | fastest | fastest/gemm | "
              + " | ".join(names) + " | others' cores |",
              "|---|---|---|---|---|---|---|---|---|" + "---|" * len(names) + "---|"]
    for r in records:
        cells = []
        for name in names:
            entry = r["algorithms"].get(name)
            cells.append("" if entry is None else f"{entry['ms']:.2f}" + ("" if entry["fits_default_limit"] else "*"))
        busiest = max([r["auto"]["others_cores"], r["gemm"]["others_cores"]]
                      + [a["others_cores"] for a in r["algorithms"].values()])
        models_text = ", ".join(f"{m} ({n})" for m, n in r["models"].items())
        plan = "= gemm's" if r["same_plan"] else r["auto"]["plan"]
        lines.append(f"| {models_text} | {r['direction']} | {r['problem']} | {plan} | {r['auto']['ms']:.2f} "
                     f"| {r['gemm']['ms']:.2f} | {r['auto_over_gemm']:.2f} | {r['fastest']} | "
                     f"{r['fastest_over_gemm']:.2f} | " + " | ".join(cells) + f" | {busiest:.2f} |")
    lines += ["", "`*`: the algorithm's whole-batch workspace exceeds the limit (timed anyway; `auto` cannot run it "
              "undivided). *others' cores*: the most any figure's cleanest block shared with other processes."]
    return "\n".join(lines) + "\n"


def write(path: str, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for NAME.json and NAME.md")
    parser.add_argument("--name", default="cpu-conv-menu", help="file name stem of the outputs")
    parser.add_argument("--clock", default="wall", choices=sorted(CLOCKS), help="wall clock, or this process's "
                        "CPU time (with one BLAS thread: each algorithm's work)")
    parser.add_argument("--batches", default="both", choices=["usual", "quick", "both"])
    parser.add_argument("--rounds", type=int, default=3, help="clean blocks wanted per figure")
    parser.add_argument("--tries", type=int, default=8, help="rounds at most before a busy figure is kept")
    parser.add_argument("--block-seconds", type=float, default=0.15)
    parser.add_argument("--quiet", type=float, default=0.15, help="other processes' cores a clean block allows")
    parser.add_argument("--wait", type=float, default=3.0, help="seconds to wait after a busy round")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    info, start, records = machine(), time.perf_counter(), []
    info["blas_threads"] = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    with conv.settings(benchmark=False):  # the CPU default, whatever MINIDNN_CONV_FIND says
        for index, kernel in enumerate(kernels(args.batches)):
            records.append(measure(kernel, args, rng))
            r = records[-1]
            print(f"[{index + 1}] {r['direction']} {r['problem']}: auto {r['auto']['ms']:.2f} ms "
                  f"({r['auto']['plan']}), gemm {r['gemm']['ms']:.2f}, fastest {r['fastest']}", flush=True)
    seconds = time.perf_counter() - start
    write(os.path.join(args.out, f"{args.name}.json"),
          json.dumps({"machine": info, "seconds": round(seconds, 1), "settings": vars(args), "kernels": records},
                     indent=1) + "\n")
    write(os.path.join(args.out, f"{args.name}.md"), markdown(records, info, seconds, args.clock))


if __name__ == "__main__":
    main()
