"""Session 29 experiment: batch norm's channels-last reductions under the old split rule and the new one.

Per batch-norm layer of ResNet-18 and ResNet-50 at batch 128 (float32 and bfloat16, channels-last x and dy), each
kernel's GPU time from torch.profiler (CUPTI), mean over 20 forward + backward calls, for: old (about 8 blocks an SM
asked, at least 32 passes of rows a split: 42522b0's rule); wave8 (the library's: one wave of the blocks the GPU
holds at once, at least 8 passes); wave16 and wave32 (one wave, at least 16 or 32 passes). Each variant's grid and
the outputs' largest difference from old's (the splits change the rounding of the sums) beside.
Usage: python bn_rule.py OUT.json
"""
import json
import os
import sys
import tempfile

import cupy
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks/probes")
from batch_norm_kernels import LAYERS  # noqa: E402

from minidnn.primitives import _cuda, batchnorm, convert, layout  # noqa: E402

CALLS = 20
new_split = batchnorm._rows_split


def old_split(C, M, width, block_packs, resident):
    channel_blocks = -(-(C // width) // block_packs)
    splits, per = _cuda.reduction_split(channel_blocks, M, minimum=32 * (_cuda.THREADS // block_packs))
    return (channel_blocks, splits), per


VARIANTS = {"old": (old_split, 8), "wave8": (new_split, 8), "wave16": (new_split, 16), "wave32": (new_split, 32)}


def kernel_times(run):
    run()
    cupy.cuda.Device().synchronize()
    with tempfile.TemporaryDirectory() as directory:
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            for _ in range(CALLS):
                run()
            cupy.cuda.Device().synchronize()
            torch.cuda.synchronize()
        path = os.path.join(directory, "trace.json")
        profiler.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    times = {}
    for event in events:
        if event.get("cat") == "kernel" and event.get("ph") == "X":
            times[event["name"][:60]] = times.get(event["name"][:60], 0.0) + float(event["dur"]) / CALLS
    return times


rng = np.random.default_rng(0)
rows = []
for name, N, C, H, W in LAYERS:
    for dtype_name in ("float32", "bfloat16"):
        x = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32) * 2 + 0.5)
        dy = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32))
        if dtype_name == "bfloat16":
            x, dy = convert.float_to_half(x, "bfloat16"), convert.float_to_half(dy, "bfloat16")
        x, dy = layout.to_channels_last(x), layout.to_channels_last(dy)
        weight = cupy.asarray(rng.uniform(0.5, 1.5, C).astype(np.float32))
        bias = cupy.asarray(rng.standard_normal(C).astype(np.float32))
        row = {"layer": name, "dtype": dtype_name, "bytes": int(x.size * x.dtype.itemsize)}
        first = None
        for variant, (split, passes) in VARIANTS.items():
            try:
                batchnorm._rows_split, batchnorm._LAST_PASSES_PER_SPLIT = split, passes
                batchnorm._launches.clear()
                running_mean, running_var = cupy.zeros(C, np.float32), cupy.ones(C, np.float32)
                y, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var)
                dx, dweight, dbias = batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd)
                outputs = [cupy.asnumpy(convert.half_to_float(a, "bfloat16") if a.dtype == np.uint16 else a)
                           .astype(np.float64) for a in (y, mean, invstd, dx, dweight, dbias)]
                first = outputs if first is None else first
                difference = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
                                 for a, b in zip(outputs, first))
                grids = [launch.grid for launch in batchnorm._launches.values()]

                def step():
                    _, m, s = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var)
                    batchnorm.batch_norm_backward_training(dy, x, weight, m, s)

                row[variant] = {"kernels": kernel_times(step), "grids": [list(g) for g in grids],
                                "difference": difference}
            except Exception as error:  # noqa: BLE001 - a variant that fails is recorded, the others still run
                row[variant] = {"error": repr(error)[:300]}
        batchnorm._rows_split, batchnorm._LAST_PASSES_PER_SPLIT = new_split, 8
        batchnorm._launches.clear()
        rows.append(row)
        summary = {v: (row[v].get("grids"), {k[:14]: round(t, 1) for k, t in row[v].get("kernels", {}).items()},
                       row[v].get("difference", row[v].get("error"))) for v in VARIANTS}
        print(name, dtype_name, summary, flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
