# Justifies selection.preference's GPU rule "5x5 stride-1 layers: Winograd F(4x4, 5x5)" (minidnn/primitives/conv/selection.py).
"""Winograd F(4x4, 5x5) on CaffeNet conv2: every direction against implicit_gemm, fft and cuDNN (fp32, TF32), then
where its weight gradient's time goes (each transform and the batched GEMM, for several chunk sizes). GPU only:

    PYTHONPATH=. python3 benchmarks/probes/winograd_5x5.py --out DIR

Writes DIR/winograd-5x5.json: {"algorithms": [...], "breakdown": [...]}.
"""
import argparse
import json
import os

import numpy as np
import cupy as cp
import torch

from benchmarks import gpu_timing
from minidnn.primitives import _cuda, blas
from minidnn.primitives.conv import api, winograd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
OUT = parser.parse_args().out
os.makedirs(OUT, exist_ok=True)
rows = []


def gpu_ms(call):
    return gpu_timing.gpu_ms(call, hold=20)  # the chunked calls queue up to ~2 ms of launches from Python


# ---- every direction, four algorithms and cuDNN ----
for N in (128, 256):
    C, K, G, H, R = 96, 256, 2, 27, 5
    for mode in ("fp32", "tf32"):
        _cuda.set_allow_tf32(mode == "tf32")
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        x = cp.random.standard_normal((N, C, H, H), dtype=cp.float32)
        w = (cp.random.standard_normal((K, C // G, R, R), dtype=cp.float32) / np.sqrt(48 * 25)).astype(cp.float32)
        dy = cp.random.standard_normal((N, K, H, H), dtype=cp.float32)
        calls = {"forward": lambda algo: api.conv2d_forward(x, w, 1, 2, 1, G, algo=algo, workspace_limit=limit),
                 "backward_data": lambda algo: api.conv2d_backward_data(dy, w, x.shape, 1, 2, 1, G, algo=algo, workspace_limit=limit),
                 "backward_filter": lambda algo: api.conv2d_backward_filter(x, dy, w.shape, 1, 2, 1, G, algo=algo, workspace_limit=limit)}
        for direction, call in calls.items():
            limit = 1 << 40
            want = call("implicit_gemm").copy()
            for algo in ("implicit_gemm", "winograd_4x4_5x5_chunked", "winograd_4x4_5x5", "fft"):
                limit = (64 << 20) if algo.endswith("chunked") else (1 << 40)
                try:
                    got = call(algo)
                    err = float(cp.linalg.norm(got - want) / cp.linalg.norm(want))
                    ms = gpu_ms(lambda: call(algo))
                except Exception as e:
                    err, ms = repr(e)[:80], None
                row = dict(N=N, mode=mode, direction=direction, algo=algo, ms=ms, err_vs_implicit=err)
                rows.append(row); print(row, flush=True)
        # cuDNN (PyTorch) best, same shapes
        tx, tw, tdy = (torch.as_tensor(a, device="cuda") for a in (x, w, dy))
        torch.backends.cudnn.benchmark = True
        fns = {"forward": lambda: torch.nn.functional.conv2d(tx, tw, padding=2, groups=G),
               "backward_data": lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tdy, padding=2, groups=G),
               "backward_filter": lambda: torch.nn.grad.conv2d_weight(tx, tw.shape, tdy, padding=2, groups=G)}
        for direction, f in fns.items():
            for _ in range(3): f()
            torch.cuda.synchronize()
            row = dict(N=N, mode=mode, direction=direction, algo="cudnn", ms=gpu_ms(f))
            rows.append(row); print(row, flush=True)
        del x, w, dy, tx, tw, tdy
        cp.get_default_memory_pool().free_all_blocks(); torch.cuda.empty_cache()

_cuda.set_allow_tf32(False)
torch.backends.cudnn.allow_tf32 = False

# ---- the weight gradient's parts, batch 128, fp32 ----
N, C, K, G, H, R = 128, 96, 256, 2, 27, 5
Cg, Kg, a2 = C // G, K // G, 64
x = cp.random.standard_normal((N, C, H, H), dtype=cp.float32)
dy = cp.random.standard_normal((N, K, H, H), dtype=cp.float32)
out = cp.empty((K, Cg, R, R), cp.float32)
breakdown = []
for n in (4, 8, 13, 16, 32, 64, 128):
    tiling = winograd.Tiling(n, H, H, 4, 5)
    T = tiling.count
    V = cp.empty((a2, C, T), cp.float32); E = cp.empty((a2, K, T), cp.float32); M = cp.empty((a2, K, Cg), cp.float32)
    Vg, Eg, Mg = (winograd.grouped(A, G) for A in (V, E, M))
    MgT = cp.empty((a2 * G, Cg, Kg), cp.float32)
    chunks = [(s, min(s + n, N)) for s in range(0, N, n)]
    xi, dyi = x[:n], dy[:n]
    t_in = gpu_ms(lambda: winograd.input_transform(xi, V, tiling, (-2, -2)))
    t_grad = gpu_ms(lambda: winograd.gradient_transform(dyi, E, tiling))
    t_gemm = gpu_ms(lambda: blas.gemm_batched(Eg, Vg.transpose(0, 2, 1), Mg, beta=1.0))
    t_gemm_t = gpu_ms(lambda: blas.gemm_batched(Vg, Eg.transpose(0, 2, 1), MgT, beta=1.0))
    t_out = gpu_ms(lambda: winograd.filter_gradient_transform(M, out, 4, False))
    def whole():
        for i, (s, e) in enumerate(chunks):
            if e - s != n:
                continue
            winograd.input_transform(x[s:e], V, tiling, (-2, -2)); winograd.gradient_transform(dy[s:e], E, tiling)
            blas.gemm_batched(Eg, Vg.transpose(0, 2, 1), Mg, beta=0.0 if i == 0 else 1.0)
        winograd.filter_gradient_transform(M, out, 4, False)
    t_all = gpu_ms(whole)
    row = dict(images=n, chunks=len(chunks), MiB=round((V.nbytes + E.nbytes + M.nbytes) / 2**20, 1),
               input_ms=round(t_in, 4), gradient_ms=round(t_grad, 4), gemm_ms=round(t_gemm, 4),
               gemm_transposed_ms=round(t_gemm_t, 4), filter_gradient_ms=round(t_out, 4), all_chunks_ms=round(t_all, 4),
               gemm_tflops=round(2 * a2 * G * Kg * Cg * T / t_gemm / 1e9, 1),
               transform_GBps=round((V.nbytes + xi.nbytes) / t_in / 1e6, 0))
    breakdown.append(row); print(row, flush=True)
    del V, E, M, Vg, Eg, Mg, MgT

with open(os.path.join(OUT, "winograd-5x5.json"), "w") as file:
    json.dump({"algorithms": rows, "breakdown": breakdown}, file, indent=1)
