"""The end-to-end benchmark: minidnn vs a naive Caffe-style engine vs PyTorch + cuDNN.

    python benchmarks/bench.py                                      # every model, on the GPU
    python benchmarks/bench.py --models resnet18 --tf32 off         # a subset
    python benchmarks/bench.py --models resnet20 --precision fp32,bf16 --engines minidnn,torch,minidnn-graph
    python benchmarks/bench.py --models resnet18 --workspace-limit 8MiB,64MiB,512MiB --microbatch off,wr,wd
    python benchmarks/bench.py --quick                              # a small smoke run (on the CPU without a GPU)
    python benchmarks/bench.py --merge a.json b.json --name both    # one report from several runs

This file is the driver: it lists the cells (model and batch × engine × math mode × convolution
setting, plus an agreement check per model and batch) and runs each in its own worker process
(``bench.py --worker``, see measure.py), one after another, so no memory pool, cache of plans or
switch of one measurement can touch another. The workers share only compiled kernels
(``CUPY_CACHE_DIR``) and, within one run, the convolution algorithms' measured times
(``MINIDNN_CACHE_DIR``, a fresh directory per run). Records go to JSON, a markdown report and a
PNG chart under --out (report.py): runs/bench/, which git ignores, unless a run to keep is sent to
benchmarks/results/<date>-<machine>-<question>/. docs/benchmarks.md explains every number.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from benchmarks import measure  # noqa: E402
from benchmarks import report as reports  # noqa: E402
from minidnn.primitives.conv import registry  # noqa: E402

# name: (model in models.MODELS, image side, batches), as the cuDNN and μ-cuDNN papers measured
SUITE = {
    "caffenet": ("alexnet_caffe", 227, (128, 256)),
    "resnet18": ("resnet18", 224, (64,)),
    "resnet50": ("resnet50", 224, (64,)),
    "resnet20": ("resnet20", 32, (128,)),
}
QUICK = {"tiny": ("tiny_cnn", 32, (8,)), "resnet20": ("resnet20", 32, (8,))}
ENGINES = ("minidnn", "naive", "torch", "minidnn-graph")
CONV_SETTING_ENGINES = ("minidnn", "minidnn-graph")  # the engines computing through minidnn's convolutions


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------
def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (the driver never touches the GPU)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _gpu_present() -> bool:
    """Whether CuPy sees a CUDA device, asked in a child process (the driver itself never touches the GPU)."""
    if not _available("cupy"):
        return False
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    asked = subprocess.run([sys.executable, "-c", "import sys; from minidnn import backend; "
                            "sys.exit(0 if backend.cuda_is_available() else 1)"],
                           cwd=checkout, capture_output=True, timeout=300)
    return asked.returncode == 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {', '.join(SUITE)} "
                        f"(--quick: {', '.join(QUICK)})")
    parser.add_argument("--batch", type=int, default=None, help="override every model's batch size")
    parser.add_argument("--image-size", type=int, default=None, help="override every model's input side")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated: {', '.join(ENGINES)}")
    parser.add_argument("--tf32", default=None, help="math modes, comma-separated: off (fp32: TF32 off everywhere), "
                        "on; default off,on on the GPU, off on the CPU (the older spelling of --precision fp32,tf32)")
    parser.add_argument("--precision", default=None, help="precisions, comma-separated: fp32, tf32, bf16, fp16 "
                        "(bf16/fp16: autocast, fp16 with a GradScaler; PyTorch's with channels_last; no naive engine); "
                        "default as --tf32's")
    parser.add_argument("--torch-channels-last", action="store_true", help="PyTorch's fp32 and tf32 cells run "
                        "channels_last too (its bf16/fp16 cells always do): cuDNN's fastest layout for TF32")
    parser.add_argument("--channels-last", action="store_true", help="minidnn's cells run channels_last: the "
                        "model's convolution weights and the batch (model.to(memory_format=minidnn.channels_last)), "
                        "as PyTorch's bf16/fp16 cells do")
    parser.add_argument("--no-memory-plan", action="store_true", help="the captured step's arrays come from a "
                        "caching pool as they are asked for, not from the arena laid out from a recorded step "
                        "(graphs.capture(plan_memory=False)): the plan's saving, measured")
    parser.add_argument("--device", default=None, help="cuda or cpu; default cuda, and with --quick the CPU "
                        "where no GPU is there")
    parser.add_argument("--warmup", type=int, default=3, help="untimed training steps before measuring")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps (and forward passes)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled for GPU-busy time and kernels")
    parser.add_argument("--layer-repeats", type=int, default=5, help="timed calls per layer and direction")
    parser.add_argument("--workspace-limit", default=None, help="convolution workspace limits, comma-separated "
                        "(e.g. 8MiB,64MiB,512MiB); default: the library's (MINIDNN_WORKSPACE_MB or 64MiB)")
    parser.add_argument("--microbatch", default="off", help=f"micro-batching modes, comma-separated: "
                        f"{', '.join(registry.MICROBATCH_MODES)}")
    parser.add_argument("--batch-policy", default="powers_of_two", help=f"micro-batch sizes wr/wd may use, "
                        f"comma-separated: {', '.join(registry.BATCH_POLICIES)}")
    parser.add_argument("--no-layers", action="store_true", help="skip the per-layer convolution tables")
    parser.add_argument("--layers-only", action="store_true", help="only the per-layer convolution tables")
    parser.add_argument("--no-agreement", action="store_true", help="skip the agreement check (loss and gradients "
                        "of the engines on the same weights and batch), e.g. when re-measuring timings only")
    parser.add_argument("--no-menu", action="store_true", help="no algorithm menu (every algorithm forced on every "
                        "layer) in minidnn's first setting; its own choices are still timed")
    parser.add_argument("--budget-seconds", type=float, default=None, help="skip the cells left once this much "
                        "time has passed (a running one is stopped); each skipped cell is recorded")
    parser.add_argument("--quick", action="store_true", help="tiny models and batches (a CPU smoke run)")
    parser.add_argument("--out", default=os.path.join("runs", "bench"), help="directory for NAME.json, NAME.md, "
                        "NAME.png; a run to keep goes to benchmarks/results/<date>-<machine>-<question>")
    parser.add_argument("--name", default="bench", help="file name stem of the outputs")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="combine earlier runs' JSON files into one "
                        "report (no measuring)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.merge:
        return args

    args.notes = []
    if args.device is None:
        args.device = "cuda" if not args.quick or _gpu_present() else "cpu"
        if args.device == "cpu":
            args.notes.append("No CUDA GPU: --quick ran on the CPU.")
    args.engines = _list(args.engines)
    unknown = sorted(set(args.engines) - set(ENGINES))
    if unknown:
        parser.error(f"--engines: unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    gpu = args.device.startswith("cuda")
    if "torch" in args.engines and not _available("torch"):
        args.engines.remove("torch")
        args.notes.append("PyTorch is not installed: no torch column, no cuDNN layer times, no GPU-busy time.")
    if "minidnn-graph" in args.engines and not (gpu and _available("minidnn.cuda.graphs")):
        args.engines.remove("minidnn-graph")
        args.notes.append("minidnn-graph skipped: " + ("minidnn.cuda.graphs is not importable in this checkout."
                                                        if gpu else "CUDA graphs need the GPU."))

    if args.tf32 is not None and args.precision is not None:
        parser.error("--tf32 and --precision exclude each other (--tf32 off,on is --precision fp32,tf32)")
    if args.precision is not None:
        modes = _list(args.precision)
        if not modes or set(modes) - set(reports.PRECISIONS):
            parser.error(f"--precision takes a comma-separated list of {', '.join(reports.PRECISIONS)}; "
                         f"got {args.precision!r}")
        if "tf32" in modes and not gpu:
            parser.error("--precision tf32 needs the GPU (TF32 is a tensor-core mode)")
    else:
        switches = _list(args.tf32 or ("off,on" if gpu else "off"))
        if not switches or set(switches) - {"off", "on"}:
            parser.error(f"--tf32 must be off, on or off,on; got {args.tf32!r}")
        if "on" in switches and not gpu:
            parser.error("--tf32 on needs the GPU (TF32 is a tensor-core mode); use --tf32 off on the CPU")
        modes = ["tf32" if switch == "on" else "fp32" for switch in switches]
    args.modes = list(dict.fromkeys(modes))

    try:
        limits = ([registry.parse_size(text) for text in _list(args.workspace_limit)] if args.workspace_limit
                  else [registry.workspace_limit()])
    except ValueError as error:
        parser.error(f"--workspace-limit: {error}")
    microbatch, policies = _list(args.microbatch), _list(args.batch_policy)
    for name, values, choices in (("--microbatch", microbatch, registry.MICROBATCH_MODES),
                                  ("--batch-policy", policies, registry.BATCH_POLICIES)):
        if not values or set(values) - set(choices):
            parser.error(f"{name} takes a comma-separated list of {', '.join(choices)}; got {','.join(values)!r}")
    if set(microbatch) - {"off"} and not _available("minidnn.primitives.conv.planner"):
        parser.error("--microbatch wr and wd need minidnn/primitives/conv/planner.py, which this checkout does not have")
    args.settings = settings_grid(limits, microbatch, policies)
    if "wd" in microbatch:
        args.notes.append("wd: the whole-network workspace budget is the workspace limit times the number of "
                          "convolution kernels of one training step (one per layer and direction, as μ-cuDNN counts "
                          "them), so every WR plan under the same limit fits it; each wd record gives it as "
                          "wd_budget_bytes.")

    if args.no_layers and args.layers_only:
        parser.error("--no-layers and --layers-only exclude each other")
    for name in ("warmup", "steps", "profile_steps", "layer_repeats"):
        minimum = 0 if name in ("warmup", "profile_steps") else 1
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(args, name)}")
    if args.budget_seconds is not None and args.budget_seconds < 0:
        parser.error(f"--budget-seconds must be >= 0, got {args.budget_seconds}")

    suite = QUICK if args.quick else SUITE
    names = _list(args.models) if args.models else list(suite)
    if set(names) - set(suite):
        parser.error(f"--models must be a subset of {', '.join(suite)}; got {args.models!r}")
    args.suite = {name: suite[name] for name in names}
    return args


def settings_grid(limits: list[int], microbatch: list[str], policies: list[str]) -> list[dict[str, Any]]:
    """Every combination of the convolution settings, once each (a batch policy only matters when
    micro-batching is on)."""
    grid: list[dict[str, Any]] = []
    for limit in limits:
        for mode in microbatch:
            for policy in (policies if mode != "off" else [None]):
                setting = {"workspace_limit": limit, "microbatch": mode, "batch_policy": policy}
                if setting not in grid:
                    grid.append(setting)
    return grid


# ----------------------------------------------------------------------------------------------
# Cells and workers
# ----------------------------------------------------------------------------------------------
def plan_cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The measurements to make, each a worker process: per model and batch an agreement check, then
    each engine in each math mode (minidnn's engines once per setting, the others once)."""
    common = {"device": args.device, "warmup": args.warmup, "steps": args.steps, "profile_steps": args.profile_steps,
              "layer_repeats": args.layer_repeats, "measure_step": not args.layers_only,
              "torch_channels_last": args.torch_channels_last, "channels_last": args.channels_last,
              "plan_memory": not args.no_memory_plan}
    cells = []
    for key, (architecture, image, batches) in args.suite.items():
        image = args.image_size or image
        for batch in [args.batch] if args.batch else batches:
            shape = {"model": key, "architecture": architecture, "image_size": image, "batch": batch,
                     "num_classes": 1000 if image > 32 else 10}
            compared = [engine for engine in ("naive", "torch") if engine in args.engines]
            if compared and not args.layers_only and not args.no_agreement:
                cells.append({"kind": "agreement", **shape, "device": args.device, "engines": compared, "tf32": False})
            for precision in args.modes:
                half = precision in ("bf16", "fp16")
                for engine in args.engines:
                    if (engine == "minidnn-graph" and args.layers_only) or (engine == "naive" and half):
                        continue  # the graph's convolutions are minidnn's; Caffe's engine has no half precision
                    grid = args.settings if engine in CONV_SETTING_ENGINES else [None]
                    for index, setting in enumerate(grid):
                        layer_table = not args.no_layers and engine != "minidnn-graph"
                        cells.append({"kind": "engine", **shape, **common, "engine": engine,
                                      "precision": precision, "tf32": precision == "tf32", "setting": setting,
                                      "layer_table": layer_table,
                                      "menu": engine == "minidnn" and index == 0 and not args.no_menu and not half})
    return cells


def describe(cell: dict[str, Any]) -> str:
    text = f"{cell['model']} batch {cell['batch']} {cell['kind'] if cell['kind'] != 'engine' else cell['engine']}"
    if cell["kind"] == "engine":
        text += f" {reports.precision_of(cell)}"
        if cell["setting"]:
            text += f" {reports.setting_label(cell['setting'])}"
    return text


def summary(record: dict[str, Any]) -> str:
    if "skipped" in record:
        return record["skipped"]
    if "error" in record:
        return "FAILED: " + record["error"].strip().splitlines()[-1]
    if record["kind"] == "agreement":
        return ", ".join(f"{engine} gradients {values['gradient_relative_difference']:.1e}"
                         for engine, values in record["agreement"].items() if "gradient_relative_difference" in values)
    parts = []
    if record.get("wall_ms") is not None:
        parts.append(f"wall {record['wall_ms']:.2f} ms, host {record['host_ms']:.2f} ms")
        if record.get("gpu_busy_ms") is not None:
            parts.append(f"GPU-busy {record['gpu_busy_ms']:.2f} ms, {record['kernels_per_step']:.0f} kernels")
        if record.get("peak_bytes") is not None:
            parts.append(f"peak {record['peak_bytes'] / 2**20:.0f} MiB")
    if record.get("layers"):
        parts.append(f"{len(record['layers'])} conv shapes")
    return ", ".join(parts)


def run_worker(cell: dict[str, Any], env: dict[str, str], timeout: float | None) -> dict[str, Any]:
    """Run one cell in a fresh process of this script; its record, or the cell with the error."""
    with tempfile.TemporaryDirectory(prefix="minidnn-bench-cell-") as directory:
        out = os.path.join(directory, "record.json")
        command = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cell), "--worker-out", out]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {**cell, "error": f"stopped after {timeout:.0f} s: the time budget ran out"}
        if done.returncode != 0 or not os.path.exists(out):
            lines = (done.stderr or done.stdout or f"exit status {done.returncode}").strip().splitlines()
            return {**cell, "error": "\n".join(lines[-20:])}
        with open(out) as file:
            return json.load(file)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every cell (each in its own process) and return the report."""
    scratch = tempfile.mkdtemp(prefix="minidnn-bench-")
    env = dict(os.environ)
    env["CUPY_CACHE_DIR"] = env.get("CUPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache")
    if "MINIDNN_CACHE_DIR" not in env:
        env["MINIDNN_CACHE_DIR"] = os.path.join(scratch, "find-cache")
    try:
        machine = run_worker({"kind": "machine", "device": args.device}, env, None)
        if "error" in machine:
            raise SystemExit(f"bench.py: error: {machine['error'].strip().splitlines()[-1]}"
                             + (" (--device cpu --quick runs on the CPU)" if args.device.startswith("cuda") else ""))
        cells = plan_cells(args)
        started, records = time.monotonic(), []
        for number, cell in enumerate(cells, 1):
            left = None if args.budget_seconds is None else args.budget_seconds - (time.monotonic() - started)
            if left is not None and left <= 0:
                record = {**cell, "skipped": f"skipped: the time budget of {args.budget_seconds:g} s was spent"}
            else:
                begin = time.monotonic()
                record = run_worker(cell, env, left)
                record["process_seconds"] = time.monotonic() - begin
            records.append(record)
            took = f" ({record['process_seconds']:.1f} s)" if "process_seconds" in record else ""
            print(f"[{number}/{len(cells)}] {describe(cell)}: {summary(record)}{took}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    settings = {key: value for key, value in vars(args).items()
                if key not in ("suite", "notes", "worker", "worker_out", "merge", "modes")}
    settings.update(cupy_cache_dir=env["CUPY_CACHE_DIR"], menu_workspace_limit_bytes=measure.MENU_WORKSPACE_LIMIT)
    return {"machine": {key: value for key, value in machine.items() if key != "kind"}, "settings": settings,
            "notes": args.notes, "records": records}


# ----------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------
def merge(paths: list[str]) -> dict[str, Any]:
    """One report from several runs' JSON files: the first run's machine, every run's settings, notes
    and records."""
    parts = []
    for path in paths:
        with open(path) as file:
            part = json.load(file)
        if "records" not in part:
            raise SystemExit(f"bench.py: error: {path} is not a report of this benchmark (no 'records': reports of "
                             "the old single-process method cannot be merged)")
        parts.append(part)
    notes = list(dict.fromkeys(note for part in parts for note in part.get("notes", [])))
    gpus = {part["machine"].get("gpu", part["machine"].get("device")) for part in parts}
    if len(gpus) > 1:
        notes.append(f"merged runs from different machines: {', '.join(sorted(map(str, gpus)))}; "
                     "compare figures within one run only")
    return {"machine": parts[0]["machine"], "settings": [part["settings"] for part in parts], "notes": notes,
            "merged_from": paths, "records": [record for part in parts for record in part["records"]]}


def write_report(report: dict[str, Any], out: str, name: str) -> str:
    """NAME.json, NAME.md and NAME.png (each written to a temporary file, then renamed)."""
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, name)
    text = reports.markdown(report)
    for suffix, content in ((".json", json.dumps(report, indent=1)), (".md", text)):
        with open(stem + suffix + ".tmp", "w") as file:
            file.write(content)
        os.replace(stem + suffix + ".tmp", stem + suffix)
    if reports.chart(report, stem + ".png.tmp"):
        os.replace(stem + ".png.tmp", stem + ".png")
    elif os.path.exists(stem + ".png"):
        os.remove(stem + ".png")  # an older run's chart would not match these records
    return text


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.worker:
        measure.worker_main(args.worker, args.worker_out)
        return None
    report = merge(args.merge) if args.merge else run(args)
    write_report(report, args.out, args.name)
    print(f"wrote {os.path.join(args.out, args.name)}.json, .md" + (", .png" if os.path.exists(
        os.path.join(args.out, args.name + ".png")) else ""))
    return report


if __name__ == "__main__":
    main()
