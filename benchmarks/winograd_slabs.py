"""Winograd's weight gradient with its tiles cut into S slabs (one batched GEMM of S times as many products), for
S = 1, 2, 4, 8, 16 and the rule's choice (``Winograd.slabs``), on the reference models' 3x3 and 5x5 layers; GPU
time per call (queued behind a hold kernel). GPU only:

    PYTHONPATH=. python3 benchmarks/winograd_slabs.py --out DIR

Writes DIR/winograd-slabs.json and prints one line per (layer, algorithm).
"""
import argparse
import json
import os

import cupy as cp
import numpy as np

from minidnn.primitives import _cuda
from minidnn.primitives.conv import registry, winograd
from minidnn.primitives.conv.problem import ConvProblem

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
OUT = parser.parse_args().out
os.makedirs(OUT, exist_ok=True)


def gpu_ms(fn, repeats=7, hold=10):
    times = []
    for _ in range(repeats + 2):
        _cuda.hold_stream(hold)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(); fn(); stop.record(); stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times[2:]))


LAYERS = {  # name: (N, C, H, K, R, padding, groups)
    "caffenet conv2 5x5 (128)": (128, 96, 27, 256, 5, 2, 2),
    "caffenet conv3 (128)": (128, 256, 13, 384, 3, 1, 1),
    "caffenet conv5 (128)": (128, 384, 13, 256, 3, 1, 2),
    "resnet 64->64 56² (64)": (64, 64, 56, 64, 3, 1, 1),
    "resnet 128->128 28² (64)": (64, 128, 28, 128, 3, 1, 1),
    "resnet 256->256 14² (64)": (64, 256, 14, 256, 3, 1, 1),
    "resnet 512->512 7² (64)": (64, 512, 7, 512, 3, 1, 1),
}
rule = winograd.Winograd.slabs
rows = []
for name, (N, C, H, K, R, pad, G) in LAYERS.items():
    problem = ConvProblem(N, C, H, H, K, R, R, (1, 1), (pad, pad), (1, 1), G, np.dtype(np.float32), "cuda")
    x = cp.random.standard_normal(problem.x_shape, dtype=cp.float32)
    dy = cp.random.standard_normal(problem.y_shape, dtype=cp.float32)
    algos = ["winograd_4x4_5x5_chunked", "winograd_4x4_5x5"] if R == 5 else ["winograd_4x4_chunked"]
    for algo in algos:
        algorithm = registry.get(algo)
        chosen = rule(algorithm, problem, "backward_filter")
        row = {"layer": name, "algo": algo, "rule": chosen, "ms": {}, "workspace_MiB": {}, "rel_diff": {}}
        reference = None
        for slabs in sorted({1, 2, 4, 8, 16, chosen}):
            winograd.Winograd.slabs = lambda self, p, d, s=slabs: s if d == "backward_filter" else 1
            out = cp.empty(problem.w_shape, cp.float32)
            workspace = cp.empty(algorithm.workspace_bytes(problem, "backward_filter"), cp.uint8)
            call = lambda: algorithm.run("backward_filter", x, dy, problem, out, False, workspace)  # noqa: E731
            call()
            if reference is None:
                reference = out.copy()
            row["rel_diff"][slabs] = float(cp.linalg.norm(out - reference) / cp.linalg.norm(reference))
            row["ms"][slabs] = round(gpu_ms(call), 4)
            row["workspace_MiB"][slabs] = round(workspace.nbytes / 2**20, 1)
            del workspace
        winograd.Winograd.slabs = rule
        rows.append(row)
        print(name, algo, "rule", chosen, " ".join(f"S{s}:{ms:.3f}" for s, ms in row["ms"].items()), flush=True)
    del x, dy
    cp.get_default_memory_pool().free_all_blocks()
with open(os.path.join(OUT, "winograd-slabs.json"), "w") as file:
    json.dump(rows, file, indent=1)
