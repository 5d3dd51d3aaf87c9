# Justifies batch norm's fused ReLU backward recomputing its mask from x (batchnorm.py's relu=True, functional's
# BatchNorm): what reading y costs the channels-last training backward, per batch-norm layer of ResNet-18/50.
"""Per batch-norm layer of ResNet-18 and ResNet-50 at batch 128 (float32 and bfloat16, channels-last), each backward
kernel's GPU time from torch.profiler (CUPTI), mean over 20 calls: without a ReLU (dy alone), with the y of a
relu=True forward as relu_output (dy·[y > 0], y read by both the sums and dx), and with the mask recomputed from x
(relu=True and the bias: the _relu kernels, which read no y). Usage:
PYTHONPATH=. python benchmarks/probes/batch_norm_relu_mask.py OUT.json
"""
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
        with open(path) as trace:
            events = json.load(trace)["traceEvents"]
    times = {}
    for event in events:
        if event.get("cat") == "kernel" and event.get("ph") == "X":
            times[event["name"][:60]] = times.get(event["name"][:60], 0.0) + float(event["dur"]) / CALLS
    return times


rows = []
for name, N, C, H, W in LAYERS:
    for dtype_name in ("float32", "bfloat16"):
        rng = np.random.default_rng(len(rows))
        x = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32) * 2 + 0.5)
        dy = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32))
        if dtype_name == "bfloat16":
            x, dy = convert.float_to_half(x, "bfloat16"), convert.float_to_half(dy, "bfloat16")
        x, dy = layout.to_channels_last(x), layout.to_channels_last(dy)
        weight = cupy.asarray(rng.uniform(0.5, 1.5, C).astype(np.float32))
        bias = cupy.asarray(rng.standard_normal(C).astype(np.float32))
        running_mean, running_var = cupy.zeros(C, np.float32), cupy.ones(C, np.float32)
        y, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var, relu=True)
        row = {"layer": name, "dtype": dtype_name, "bytes": int(x.size * x.dtype.itemsize)}
        row["plain"] = kernel_times(lambda: batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd))
        row["relu"] = kernel_times(lambda: batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd,
                                                                                  relu_output=y))
        row["relu_from_x"] = kernel_times(lambda: batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd,
                                                                                         bias=bias, relu=True))
        rows.append(row)
        print(name, dtype_name, {v: round(sum(row[v].values()), 1) for v in ("plain", "relu", "relu_from_x")},
              flush=True)
with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(sys.argv[1])), delete=False) as out:
    json.dump(rows, out, indent=1)
os.replace(out.name, sys.argv[1])
