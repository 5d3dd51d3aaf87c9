"""Session 29 experiment: batch norm's channels-last kernels in one tree, kernel by kernel, with a digest of results.

Per batch-norm layer of ResNet-18 and ResNet-50 at batch 128 (float32 and bfloat16, channels-last x and dy drawn
from one seed), each kernel's GPU time from torch.profiler (CUPTI), mean over 20 forward + backward calls, and a
SHA-256 of the results' bytes (y, mean, invstd, dx, dweight, dbias), so that two trees' runs can be set side by
side: equal digests are equal bits. Usage: PYTHONPATH=TREE python bn_compare.py OUT.json
"""
import hashlib
import json
import os
import sys
import tempfile

import cupy
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from minidnn.primitives import batchnorm, convert, layout

LAYERS = [("stem", 128, 64, 112, 112), ("r18.layer1", 128, 64, 56, 56), ("r18.layer2", 128, 128, 28, 28),
          ("r18.layer3", 128, 256, 14, 14), ("r18.layer4", 128, 512, 7, 7), ("r50.layer1", 128, 256, 56, 56),
          ("r50.layer2", 128, 512, 28, 28), ("r50.layer3", 128, 1024, 14, 14), ("r50.layer4", 128, 2048, 7, 7)]
CALLS = 20


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


rows = []
for name, N, C, H, W in LAYERS:
    for dtype_name in ("float32", "bfloat16"):
        rng = np.random.default_rng(len(rows))  # the same inputs in every tree's run
        x = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32) * 2 + 0.5)
        dy = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32))
        if dtype_name == "bfloat16":
            x, dy = convert.float_to_half(x, "bfloat16"), convert.float_to_half(dy, "bfloat16")
        x, dy = layout.to_channels_last(x), layout.to_channels_last(dy)
        weight = cupy.asarray(rng.uniform(0.5, 1.5, C).astype(np.float32))
        bias = cupy.asarray(rng.standard_normal(C).astype(np.float32))
        running_mean, running_var = cupy.zeros(C, np.float32), cupy.ones(C, np.float32)
        y, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var)
        results = (y, mean, invstd) + tuple(batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd))
        digest = hashlib.sha256(b"".join(cupy.asnumpy(layout.contiguous(a)).tobytes() for a in results)).hexdigest()

        def step():
            _, m, s = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var)
            batchnorm.batch_norm_backward_training(dy, x, weight, m, s)

        row = {"layer": name, "dtype": dtype_name, "bytes": int(x.size * x.dtype.itemsize), "digest": digest[:16],
               "kernels": kernel_times(step)}
        rows.append(row)
        print(name, dtype_name, row["digest"], {k[:20]: round(t, 1) for k, t in row["kernels"].items()}, flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
