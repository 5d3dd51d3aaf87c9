# Justifies selection.preference's "5x5 backward-filter: F(7x7, 5x5) first" and its float32 GEMMs (winograd.WEIGHT_GRADIENT_ONLY), in minidnn/primitives/conv/.
"""Backward-filter's Winograd F(7x7, 5x5) against F(4x4, 5x5), implicit GEMM and cuDNN on CaffeNet's conv2 (batch 128
and 256): GPU time, relative error against float64 (cuDNN's too), in fp32 and TF32, and each one's kernels (CUPTI
through torch.profiler: the kernel names say which algorithm cuDNN ran, its grid the GEMM's batch). minidnn and
cuDNN run in one process here: the cuDNN column is a reference point; bench.py's per-layer table is the benchmark.
GPU only:

    PYTHONPATH=. python3 benchmarks/probes/winograd_7x7_weight_gradient.py --out DIR

Writes DIR/winograd-7x7-wgrad.json: a list of rows, kind "time" or "kernels".
"""
import argparse
import collections
import json
import os

import cupy as cp
import torch

from benchmarks import gpu_timing
from minidnn.primitives import _cuda
from minidnn.primitives.conv import api

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
OUT = parser.parse_args().out
os.makedirs(OUT, exist_ok=True)
torch.backends.cudnn.benchmark = True
rows = []


def emit(**row):
    rows.append(row), print(row, flush=True)


def kernels(call, **labels):
    """Each kernel's count and summed GPU time over one call."""
    call(), cp.cuda.Device().synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        call(), cp.cuda.Device().synchronize()
    summed = collections.defaultdict(lambda: [0, 0.0, None])
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            summed[event.name][0] += 1
            summed[event.name][1] += event.device_time_total / 1000
    for name, (count, ms, _) in sorted(summed.items(), key=lambda item: -item[1][1]):
        emit(kind="kernels", **labels, kernel=name[:120], count=count, ms=round(ms, 4))


C, K, H, r, pad, G = 96, 256, 27, 5, 2, 2
w_shape = (K, C // G, r, r)
ALGORITHMS = (("winograd_7x7_5x5_chunked", 64 << 20), ("winograd_7x7_5x5", 1 << 40),
              ("winograd_4x4_5x5_chunked", 64 << 20), ("winograd_4x4_5x5", 1 << 40), ("implicit_gemm", 0))
for N in (128, 256):
    x = cp.random.standard_normal((N, C, H, H), dtype=cp.float32)
    dy = cp.random.standard_normal((N, K, H, H), dtype=cp.float32)
    want = api.conv2d_backward_filter(x.astype(cp.float64), dy.astype(cp.float64), w_shape, 1, pad, 1, G,
                                      algo="implicit_gemm", workspace_limit=0)

    def relative(got):
        return float(cp.linalg.norm(cp.asarray(got, dtype=cp.float64) - want) / cp.linalg.norm(want))

    tx, tdy = torch.as_tensor(x, device="cuda"), torch.as_tensor(dy, device="cuda")
    for mode in ("fp32", "tf32"):
        _cuda.set_allow_tf32(mode == "tf32")
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        for algo, limit in ALGORITHMS:
            def wgrad(algo=algo, limit=limit):
                return api.conv2d_backward_filter(x, dy, w_shape, 1, pad, 1, G, algo=algo, workspace_limit=limit)
            emit(kind="time", N=N, mode=mode, algo=algo, ms=round(gpu_timing.gpu_ms(wgrad, hold=20), 4),
                 error=relative(wgrad()))
            if N == 128 and algo.startswith("winograd"):
                kernels(wgrad, N=N, mode=mode, algo=algo)

        def cudnn():
            return torch.nn.grad.conv2d_weight(tx, w_shape, tdy, padding=pad, groups=G)
        for _ in range(3):
            cudnn()
        torch.cuda.synchronize()
        emit(kind="time", N=N, mode=mode, algo="cudnn", ms=round(gpu_timing.gpu_ms(cudnn, hold=20), 4),
             error=relative(cp.asarray(cudnn())))
        if N == 128:
            kernels(cudnn, N=N, mode=mode, algo="cudnn")
    del x, dy, tx, tdy, want
    cp.get_default_memory_pool().free_all_blocks(), torch.cuda.empty_cache()

with open(os.path.join(OUT, "winograd-7x7-wgrad.json"), "w") as file:
    json.dump(rows, file, indent=1)
