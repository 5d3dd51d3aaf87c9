# Justifies DistributedDataParallel's defaults against issue 25's targets: 25 MiB buckets in reverse registration order with the first layers' 1 MiB bucket reduced last, each all-reduced on NCCL's communication stream from the post-accumulate-grad hook (minidnn/distributed/buckets.py, reducer.py, nccl.py).
"""Data-parallel scaling: ResNet-50, batch 64 per GPU, fp32 (TF32 off), for N = 1, 2, 4, 8 processes, minidnn's
DistributedDataParallel (eager, and the captured step) beside PyTorch's. GPU only; N above the GPU count is skipped:

    PYTHONPATH=. python3 benchmarks/probes/ddp_scaling.py --out DIR
    PYTHONPATH=. python3 benchmarks/probes/ddp_scaling.py --out DIR --gpus 1,2 --engines minidnn --steps 20

Each cell (engine, mode, N) is one job of N processes, started by minidnn's launcher (PyTorch's by torchrun), on
synthetic data. Every rank times, after a warm-up, ``--steps`` steps of its model alone (no communication) and
then ``--steps`` DDP steps, a step being forward, cross-entropy, backward and SGD with momentum, timed from host
to host with the device synchronised; then the all-reduce alone: DDP's buckets (their sizes, PyTorch's cells
too) all-reduced back to back. Rank 0 writes the cell. The figures, medians over the steps:

* step time and images per second (N·64 over the DDP step time);
* scaling efficiency: the images per second over N times one GPU's without DDP (the same engine and mode);
* the all-reduce time hidden under backward: 1 − (DDP step − step alone) / all-reduce alone, clamped to [0, 1]
  (at N = 1 there is nothing to hide).

Writes ddp_scaling.json (the cells) and ddp_scaling.md (the table) under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, CHECKOUT)

from minidnn.distributed.run import free_port  # noqa: E402 - after the checkout is on the path

PER_GPU_BATCH, CLASSES, SIDE = 64, 1000, 224


def median_ms(run, steps: int, synchronize) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


# ----------------------------------------------------------------------------------------------
# One rank of one cell
# ----------------------------------------------------------------------------------------------
def minidnn_rank(mode: str, steps: int, warmup: int) -> dict:
    import numpy as np  # noqa: PLC0415

    import minidnn  # noqa: PLC0415
    import minidnn.distributed as dist  # noqa: PLC0415
    import minidnn.functional as F  # noqa: PLC0415
    import models  # noqa: PLC0415
    from minidnn import backend, optim  # noqa: PLC0415
    from minidnn.cuda import graphs  # noqa: PLC0415

    dist.init_process_group("nccl")
    device = f"cuda:{os.environ['LOCAL_RANK']}"
    minidnn.cuda.set_allow_tf32(False)
    minidnn.manual_seed(0)
    rng = np.random.default_rng(dist.get_rank())
    x = minidnn.tensor(rng.standard_normal((PER_GPU_BATCH, 3, SIDE, SIDE)).astype(np.float32), device=device)
    y = minidnn.tensor(rng.integers(0, CLASSES, PER_GPU_BATCH), device=device)

    def timed(network) -> float:
        optimizer = optim.SGD(network.parameters(), lr=0.01, momentum=0.9)

        def step(x, y):
            loss = F.cross_entropy(network(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss

        if mode == "captured":
            step = graphs.capture(step, (x, y), warmup=warmup)
            if not isinstance(step, graphs.CapturedStep):
                raise RuntimeError(f"the step could not be captured: {step.reason}")
        else:
            for _ in range(warmup):
                step(x, y)
        return median_ms(lambda: step(x, y), steps, lambda: backend.synchronize(device))

    model = models.create("resnet50", num_classes=CLASSES).to(device)
    alone = timed(model)
    ddp = dist.DistributedDataParallel(model)
    with_ddp = timed(ddp)
    flats = [bucket.flat for bucket in ddp.reducer.buckets]

    def all_reduce_buckets():
        works = [dist.all_reduce(flat, dist.ReduceOp.AVG, async_op=True) for flat in flats]
        for work in works:
            work.wait()

    for _ in range(3):
        all_reduce_buckets()
    comm = median_ms(all_reduce_buckets, steps, lambda: backend.synchronize(device))
    record = {"bucket_bytes": [int(flat.nbytes) for flat in flats]}
    dist.destroy_process_group()
    return {**record, "alone_ms": alone, "ddp_ms": with_ddp, "all_reduce_ms": comm}


def torch_rank(steps: int, warmup: int, bucket_bytes: list[int]) -> dict:
    import torch  # noqa: PLC0415
    import torch.distributed as torch_dist  # noqa: PLC0415
    import torchvision  # noqa: PLC0415

    torch_dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    x = torch.randn(PER_GPU_BATCH, 3, SIDE, SIDE, device="cuda")
    y = torch.randint(0, CLASSES, (PER_GPU_BATCH,), device="cuda")

    def timed(network) -> float:
        optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)

        def step():
            loss = torch.nn.functional.cross_entropy(network(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        for _ in range(warmup):
            step()
        return median_ms(step, steps, torch.cuda.synchronize)

    model = torchvision.models.resnet50(num_classes=CLASSES).cuda()
    alone = timed(model)
    with_ddp = timed(torch.nn.parallel.DistributedDataParallel(model, device_ids=[local]))
    flats = [torch.zeros(n // 4, device="cuda") for n in bucket_bytes]  # minidnn's bucket sizes: the same volume

    def all_reduce_buckets():
        works = [torch_dist.all_reduce(flat, async_op=True) for flat in flats]
        for work in works:
            work.wait()

    for _ in range(3):
        all_reduce_buckets()
    comm = median_ms(all_reduce_buckets, steps, torch.cuda.synchronize)
    torch_dist.destroy_process_group()
    return {"alone_ms": alone, "ddp_ms": with_ddp, "all_reduce_ms": comm, "bucket_bytes": bucket_bytes}


def worker(arguments: argparse.Namespace) -> None:
    if arguments.engine == "torch":
        record = torch_rank(arguments.steps, arguments.warmup, json.loads(arguments.bucket_bytes))
    else:
        record = minidnn_rank(arguments.mode, arguments.steps, arguments.warmup)
    if os.environ.get("RANK") == "0":
        with open(arguments.worker_out, "w") as file:
            json.dump(record, file)


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------
def default_bucket_bytes() -> list[int]:
    """The bytes of each of ResNet-50's buckets under DDP's defaults (what both engines' all-reduce alone moves)."""
    import models  # noqa: PLC0415
    from minidnn.distributed import buckets  # noqa: PLC0415

    sizes = [p.data.nbytes for p in models.create("resnet50", num_classes=CLASSES).parameters()]
    return [sum(sizes[i] for i in bucket) for bucket in buckets.bucket_order(sizes, buckets.bucket_size_limits(None))]


def run_cell(engine: str, mode: str, gpus: int, arguments: argparse.Namespace, bucket_bytes: list[int]) -> dict:
    out = os.path.join(arguments.out, f"cell-{engine}-{mode}-{gpus}.json")
    launcher = ["-m", "torch.distributed.run"] if engine == "torch" else ["-m", "minidnn.distributed.run"]
    command = [sys.executable, *launcher, "--nproc-per-node", str(gpus), "--master-port", str(free_port()),
               os.path.abspath(__file__), "--worker", "--engine", engine, "--mode", mode, "--steps",
               str(arguments.steps), "--warmup", str(arguments.warmup), "--worker-out", out,
               "--bucket-bytes", json.dumps(bucket_bytes)]
    environment = {**os.environ, "PYTHONPATH": CHECKOUT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(command, check=True, env=environment, cwd=CHECKOUT)
    with open(out) as file:
        record = json.load(file)
    return {"engine": engine, "mode": mode, "gpus": gpus, **record}


def summarise(cells: list[dict]) -> list[dict]:
    """Images per second, efficiency against one GPU alone (same engine and mode), the share of all-reduce hidden."""
    alone = {(c["engine"], c["mode"]): c["alone_ms"] for c in cells if c["gpus"] == 1}
    for cell in cells:
        cell["images_per_s"] = cell["gpus"] * PER_GPU_BATCH / (cell["ddp_ms"] / 1000)
        one_gpu = alone.get((cell["engine"], cell["mode"]))
        cell["scaling_efficiency"] = None if one_gpu is None else \
            cell["images_per_s"] / (cell["gpus"] * PER_GPU_BATCH / (one_gpu / 1000))
        exposed = max(cell["ddp_ms"] - cell["alone_ms"], 0.0)
        cell["all_reduce_hidden"] = None if cell["gpus"] == 1 or cell["all_reduce_ms"] <= 0 else \
            min(max(1.0 - exposed / cell["all_reduce_ms"], 0.0), 1.0)
    return cells


def table(cells: list[dict]) -> str:
    rows = ["| engine | mode | GPUs | step alone (ms) | DDP step (ms) | images/s | efficiency | all-reduce alone (ms) "
            "| hidden under backward |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        efficiency = "" if c["scaling_efficiency"] is None else f"{c['scaling_efficiency']:.3f}"
        hidden = "n/a" if c["all_reduce_hidden"] is None else f"{c['all_reduce_hidden']:.0%}"
        rows.append(f"| {c['engine']} | {c['mode']} | {c['gpus']} | {c['alone_ms']:.1f} | {c['ddp_ms']:.1f} | "
                    f"{c['images_per_s']:.0f} | {efficiency} | {c['all_reduce_ms']:.2f} | {hidden} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for ddp_scaling.json and .md")
    parser.add_argument("--gpus", default="1,2,4,8", help="process counts, comma-separated")
    parser.add_argument("--engines", default="minidnn,torch")
    parser.add_argument("--modes", default="eager,captured", help="minidnn's step: eager and/or captured")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--bucket-bytes", default="[]", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments)
        return
    if not arguments.out:
        parser.error("--out is required")
    os.makedirs(arguments.out, exist_ok=True)
    import minidnn  # noqa: PLC0415

    available = minidnn.cuda.device_count()
    counts = [n for n in (int(v) for v in arguments.gpus.split(",")) if n <= available]
    if not counts:
        parser.error(f"none of --gpus {arguments.gpus} fits the {available} GPU(s) here")
    cells, bucket_bytes = [], default_bucket_bytes()
    for engine in arguments.engines.split(","):
        for mode in (arguments.modes.split(",") if engine == "minidnn" else ["eager"]):
            for gpus in counts:
                cell = run_cell(engine, mode, gpus, arguments, bucket_bytes)
                cells.append(cell)
                print(json.dumps(cell), flush=True)
    cells = summarise(cells)
    with open(os.path.join(arguments.out, "ddp_scaling.json"), "w") as file:
        json.dump({"per_gpu_batch": PER_GPU_BATCH, "model": "resnet50", "dtype": "float32", "cells": cells}, file,
                  indent=1)
    with open(os.path.join(arguments.out, "ddp_scaling.md"), "w") as file:
        file.write(table(cells))
    print(table(cells))


if __name__ == "__main__":
    main()
