"""Session 29 experiment: where batch norm's channels-last training kernels spend their time, kernel by kernel.

Per batch-norm layer of ResNet-18 and ResNet-50 at batch 128 (float32 and bfloat16, channels-last x and dy), each
kernel's GPU time from torch.profiler (CUPTI, every kernel of the process), mean over 20 forward + backward calls,
for variants of the library's build: base; skip (SKIP_MERGE=1, bn-tail-macros.patch: the last block of a channel
block merges nothing, so the difference is that tail's cost; results wrong, timing only); blocks4, blocks3
(_cuda.REDUCTION_BLOCKS_PER_SM 4 and 3 instead of 8: fewer splits, a shorter tail). PyTorch's channels_last
kernels for the same call beside. Usage: python bn_tail.py OUT.json
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

original_function = _cuda.function
extra = ()


def function(relative, name, dtype, defines=()):
    if relative.endswith("batchnorm.cu"):
        defines = tuple(defines) + extra
    return original_function(relative, name, dtype, defines)


_cuda.function = function
VARIANTS = {"base": ((), 8), "skip": ((("SKIP_MERGE", 1),), 8), "blocks4": ((), 4), "blocks3": ((), 3)}
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
            name = event["name"][:60]
            times[name] = times.get(name, 0.0) + float(event["dur"]) / CALLS
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
        for variant, (defines, blocks) in VARIANTS.items():
            extra, _cuda.REDUCTION_BLOCKS_PER_SM = defines, blocks
            batchnorm._launches.clear()
            running_mean, running_var = cupy.zeros(C, np.float32), cupy.ones(C, np.float32)

            def step():
                _, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var)
                batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd)

            try:
                row[variant] = kernel_times(step)
            except Exception as error:  # noqa: BLE001 - a variant that fails is recorded, the others still run
                row[variant] = {"error": repr(error)[:300]}
        extra, _cuda.REDUCTION_BLOCKS_PER_SM = (), 8
        batchnorm._launches.clear()
        torch_dtype = torch.float32 if dtype_name == "float32" else torch.bfloat16
        tx = torch.randn(N, C, H, W, device="cuda", dtype=torch_dtype).contiguous(memory_format=torch.channels_last)
        tx.requires_grad_(True)
        tw, tb = torch.ones(C, device="cuda", requires_grad=True), torch.zeros(C, device="cuda", requires_grad=True)
        trm, trv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
        tdy = torch.randn_like(tx)

        def torch_step():
            ty = torch.nn.functional.batch_norm(tx, trm, trv, tw, tb, True)
            torch.autograd.grad(ty, (tx, tw, tb), tdy)

        row["torch"] = kernel_times(torch_step)
        rows.append(row)
        print(name, dtype_name, {v: {k[:24]: (round(t, 2) if isinstance(t, float) else t) for k, t in row[v].items()} for v in
                                 list(VARIANTS) + ["torch"]}, flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
