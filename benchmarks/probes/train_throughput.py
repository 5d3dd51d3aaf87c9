"""Rule: train.py on the GPU reaches >= 0.9x the images/s of the benchmark's step alone (issue 22; minidnn/data/loader.py, device.py).

For each model and batch, the step alone is measured by the benchmark's own worker (benchmarks/measure.py,
one process per cell: the eager ``minidnn`` engine and the captured ``minidnn-graph`` one), and train.py is
run end to end (``python train.py ... --device cuda``, eager and captured, its own process) on each data
set: shapes10 (built in) and CIFAR-format data synthesised here (random images in the CIFAR-10 binary
format, so nothing is downloaded). train.py's figure is the ``images_per_second`` its metrics.jsonl
records per epoch (the whole training loop: data, steps, waits; the first epoch also compiles kernels,
finds algorithms and captures, so it is reported but not used); the ratio is its median over the later
epochs to the step alone's.

    python benchmarks/probes/train_throughput.py --out benchmarks/results/<date>-h200-train-throughput
    python benchmarks/probes/train_throughput.py --models resnet20 --batch 128 --data shapes10,cifar \\
        --modes eager,captured --epochs 3 --out OUT

Writes OUT/train-throughput.json (every record, with the commands and their output's tail) and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks import bench  # noqa: E402 - the benchmark's cells and workers, reused as they are

ENGINE = {"eager": "minidnn", "captured": "minidnn-graph"}


def synthesise_cifar(root: str, train_images: int, test_images: int, seed: int = 0) -> str:
    """A cifar-10-batches-bin folder of random records (label byte + 3072 pixel bytes), five training files."""
    folder = os.path.join(root, "cifar-10-batches-bin")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = -(-train_images // 5)
    files = [(f"data_batch_{i}.bin", per_file) for i in range(1, 6)] + [("test_batch.bin", test_images)]
    for name, count in files:
        records = np.empty((count, 3073), np.uint8)
        records[:, 0] = rng.integers(0, 10, count)
        records[:, 1:] = rng.integers(0, 256, (count, 3072))
        records.tofile(os.path.join(folder, name))
    with open(os.path.join(folder, "batches.meta.txt"), "w") as file:
        file.write("\n".join(("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                              "truck")) + "\n")
    return folder


def graph_flags() -> dict[str, list[str]]:
    """train.py's flags for each mode: --cuda-graph opts in, or (once capture is the default) --no-cuda-graph opts out."""
    text = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], capture_output=True, text=True,
                          cwd=ROOT).stdout
    if "--no-cuda-graph" in text:
        return {"eager": ["--no-cuda-graph"], "captured": []}
    return {"eager": [], "captured": ["--cuda-graph"]}


def step_alone(key: str, batch: int, mode: str, steps: int, device: str, quick: bool,
               env: dict[str, str]) -> dict[str, Any]:
    """The benchmark's record of one training step alone (bench.py's cell, bench.py's worker process)."""
    args = bench.parse_args([*(["--quick"] if quick else []), "--models", key, "--batch", str(batch), "--engines", ENGINE[mode], "--tf32", "off",
                             "--no-layers", "--no-agreement", "--steps", str(steps), "--profile-steps", "0",
                             "--device", device])
    cells = [cell for cell in bench.plan_cells(args) if cell["kind"] == "engine"]
    if not cells:
        return {"error": " ".join(args.notes) or f"no {ENGINE[mode]} cell on {device}"}
    record = bench.run_worker(cells[0], env, None)
    return {key: record.get(key) for key in ("wall_ms", "host_ms", "images_per_second", "captured",
                                             "capture_fallback", "error", "architecture", "image_size")}


def train_run(architecture: str, batch: int, data: str, mode: str, flags: dict[str, list[str]], epochs: int,
              train_size: int, test_size: int, device: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """train.py end to end in its own process; its per-epoch images/s from metrics.jsonl."""
    with tempfile.TemporaryDirectory(prefix="minidnn-train-throughput-") as out:
        command = [sys.executable, os.path.join(ROOT, "train.py"), "--model", architecture, "--batch-size", str(batch),
                   "--device", device, "--epochs", str(epochs), "--data", data, "--out", out, "--workers", "0",
                   *(flags[mode] if device.startswith("cuda") else [])]
        if data == "shapes10":
            command += ["--train-size", str(train_size), "--test-size", str(test_size)]
        start = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
            status, output = done.returncode, (done.stdout + done.stderr)
        except subprocess.TimeoutExpired as expired:
            status, output = "timeout", f"{expired.stdout or ''}{expired.stderr or ''}"
            output = output.decode() if isinstance(output, bytes) else output
        rows = []
        metrics = os.path.join(out, "metrics.jsonl")
        if os.path.exists(metrics):
            with open(metrics) as file:
                rows = [json.loads(line) for line in file if line.strip()]
    per_epoch = [row["images_per_second"] for row in rows]
    later = per_epoch[1:]
    return {"command": command, "status": status, "seconds": round(time.monotonic() - start, 1),
            "images_per_second_by_epoch": per_epoch,
            "images_per_second": statistics.median(later) if later else None,
            "output_tail": "\n".join(output.strip().splitlines()[-15:])}


def markdown(report: dict[str, Any]) -> str:
    lines = ["# train.py end to end against the step alone", "",
             f"{report['machine']}; {report['date']}; train.py epochs {report['epochs']} (first one not counted).", "",
             "| model | batch | data | mode | step alone (ms) | step alone img/s | train.py img/s by epoch | "
             "train.py img/s | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        alone, run = row["step_alone"], row["train"]
        ratio = (f"**{run['images_per_second'] / alone['images_per_second']:.2f}**"
                 if run["images_per_second"] and alone.get("images_per_second") else "–")
        wall = f"{alone['wall_ms']:.2f}" if alone.get("wall_ms") else f"failed: {alone.get('error', '')[:60]}"
        alone_rate = f"{alone['images_per_second']:.0f}" if alone.get("images_per_second") else "–"
        epochs = ", ".join(f"{v:.0f}" for v in run["images_per_second_by_epoch"]) or f"status {run['status']}"
        rate = f"{run['images_per_second']:.0f}" if run["images_per_second"] else "–"
        lines.append(f"| {row['model']} | {row['batch']} | {row['data']} | {row['mode']} | {wall} | {alone_rate} | "
                     f"{epochs} | {rate} | {ratio} |")
    lines += ["", "Target: ratio >= 0.9 (issue 22). Step alone: benchmarks/measure.py's median wall time of a "
              "training step on a fixed batch; train.py: metrics.jsonl's images_per_second, median over the epochs "
              "after the first."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet20",
                        help=f"comma-separated benchmark models: {', '.join(bench.SUITE)} (--quick: {', '.join(bench.QUICK)})")
    parser.add_argument("--batch", default="128", help="comma-separated batch sizes")
    parser.add_argument("--data", default="shapes10,cifar", help="comma-separated: shapes10, cifar (synthesised)")
    parser.add_argument("--modes", default="eager,captured", help="comma-separated: eager, captured")
    parser.add_argument("--epochs", type=int, default=3, help="train.py epochs per run (the first is not counted)")
    parser.add_argument("--train-size", type=int, default=20000, help="training images (shapes10 and the CIFAR data)")
    parser.add_argument("--test-size", type=int, default=2000, help="test images (shapes10 and the CIFAR data)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of the step alone")
    parser.add_argument("--quick", action="store_true", help="the benchmark's quick models (tiny, resnet20): a smoke run")
    parser.add_argument("--timeout", type=float, default=240, help="seconds one train.py run may take")
    parser.add_argument("--device", default="cuda", help="cuda (the figure); cpu only checks the plumbing")
    parser.add_argument("--out", required=True, help="folder for train-throughput.json and .md")
    args = parser.parse_args()
    env = dict(os.environ)
    env["CUPY_CACHE_DIR"] = env.get("CUPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache")
    scratch = tempfile.mkdtemp(prefix="minidnn-train-throughput-data-")
    env.setdefault("MINIDNN_CACHE_DIR", os.path.join(scratch, "find-cache"))  # find's timings shared by the runs
    try:
        report = measure(args, env, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_outputs(args.out, "train-throughput", report, markdown(report))
    print(f"wrote {os.path.join(args.out, 'train-throughput')}.json, .md")


def write_outputs(out: str, stem: str, report: Any, text: str) -> None:
    """OUT/stem.json (``report``) and OUT/stem.md (``text``), each written to a temporary file, then renamed."""
    os.makedirs(out, exist_ok=True)
    for suffix, content in (("json", json.dumps(report, indent=1)), ("md", text)):
        path = os.path.join(out, f"{stem}.{suffix}")
        with open(path + ".tmp", "w") as file:
            file.write(content)
        os.replace(path + ".tmp", path)


def measure(args: argparse.Namespace, env: dict[str, str], scratch: str) -> dict[str, Any]:
    """Every cell: the step alone per model, batch and mode, then train.py on each data set."""
    flags = graph_flags()
    datasets = {}
    for name in bench._list(args.data):
        datasets[name] = "shapes10" if name == "shapes10" else synthesise_cifar(scratch, args.train_size,
                                                                                  args.test_size)
    machine = bench.run_worker({"kind": "machine", "device": args.device}, env, None)
    rows = []
    for key in bench._list(args.models):
        for batch in (int(b) for b in bench._list(args.batch)):
            for mode in bench._list(args.modes):
                alone = step_alone(key, batch, mode, args.steps, args.device, args.quick, env)
                print(f"{key} b{batch} {mode} step alone: {alone.get('wall_ms')} ms, "
                      f"{alone.get('images_per_second')} img/s", flush=True)
                for data_name, data in datasets.items():
                    architecture = alone.get("architecture") or (bench.QUICK if args.quick else bench.SUITE)[key][0]
                    run = train_run(architecture, batch, data, mode, flags, args.epochs, args.train_size,
                                    args.test_size, args.device, env, args.timeout)
                    ratio = (run["images_per_second"] / alone["images_per_second"]
                             if run["images_per_second"] and alone.get("images_per_second") else None)
                    print(f"  train.py {data_name} {mode}: {run['images_per_second_by_epoch']} img/s by epoch "
                          f"(status {run['status']}); ratio {ratio}", flush=True)
                    rows.append({"model": key, "batch": batch, "data": data_name, "mode": mode, "step_alone": alone,
                                 "train": run, "ratio": ratio})
    return {"machine": f"{machine.get('gpu', args.device)}, {machine.get('host_cpu', '?')} "
                       f"({machine.get('host_cores')} cores)",
            "machine_record": machine, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "epochs": args.epochs,
            "train_size": args.train_size, "test_size": args.test_size, "flags": flags, "rows": rows}


if __name__ == "__main__":
    main()
