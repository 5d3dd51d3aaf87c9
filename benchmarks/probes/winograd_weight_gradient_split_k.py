# Justifies Winograd.weight_gradient_splits with SPLIT_K_SMS (the reference profile's SM count, _cuda.REFERENCE_PROFILE), MAX_SPLITS, SPLIT_K_CHUNKED_BYTES (minidnn/primitives/conv/winograd.py) and blas.SPLIT_K_BUILD.
"""Split-K for Winograd's weight gradient (blas.gemm_batched_split_k, split_k_gemm.cu) against cuBLAS's batched GEMM:
first the GEMM alone on CaffeNet conv2's products, then the whole weight gradient of every layer Winograd takes
(CaffeNet conv2 at batch 128 and 256, ResNet's four 3x3 stride-1 shapes at batch 64), with the split count forced
(1: cuBLAS) and as Winograd.weight_gradient_splits picks it, beside implicit_gemm and cuDNN. The GEMM alone runs in
four builds of split_k_gemm.cu (pipeline depth, CTAs per SM). fp32 (TF32 off). GPU only:

    PYTHONPATH=. python3 benchmarks/probes/winograd_weight_gradient_split_k.py --out DIR

Writes DIR/split-k-gemm.json: {"gemm": [...], "layers": [...]}.
"""
import argparse
import json
import os

import cupy as cp
import numpy as np
import torch

from benchmarks import gpu_timing
from minidnn.primitives import _cuda, blas
from minidnn.primitives.conv import api, registry, winograd
from minidnn.primitives.conv.problem import ConvProblem

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
OUT = parser.parse_args().out
os.makedirs(OUT, exist_ok=True)
_cuda.set_allow_tf32(False)
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def gpu_ms(call):
    return gpu_timing.gpu_ms(call, hold=20)  # chunked calls queue up to ~2 ms of launches from Python


def relative(got, want):
    return float(cp.linalg.norm(got.astype(cp.float64) - want) / cp.linalg.norm(want))


# ---- the GEMM alone: conv2's 128 products of 128 × 48, over the tiles of n images, for each kernel build ----
BUILDS = {  # the first is split_k_gemm.cu's default
    "3 stages, 4 CTAs/SM": (),
    "3 stages, 3 CTAs/SM, k unrolled": (("CTAS_PER_SM", 3), ("K_UNROLL", 4)),
    "2 stages, 4 CTAs/SM": (("STAGES", 2),),
    "2 stages, 3 CTAs/SM, k unrolled": (("STAGES", 2), ("CTAS_PER_SM", 3), ("K_UNROLL", 4)),
}
gemm_rows = []
products, Kg, Cg, tiles_per_image = 128, 128, 48, 49
for images in (8, 12, 13, 32, 128):  # 13 images' 637 tiles: rows not 16-byte aligned, one value per copy
    T = images * tiles_per_image
    E = cp.random.standard_normal((products, Kg, T), dtype=cp.float32)
    V = cp.random.standard_normal((products, Cg, T), dtype=cp.float32)
    exact = cp.matmul(E.astype(cp.float64), V.astype(cp.float64).transpose(0, 2, 1))
    flops = 2 * products * Kg * Cg * T
    M = cp.empty((products, Kg, Cg), cp.float32)
    ms = gpu_ms(lambda: blas.gemm_batched(E, V.transpose(0, 2, 1), M))
    row = dict(images=images, reduction=T, engine="cublas", splits=1, ms=round(ms, 4),
               tflops=round(flops / ms / 1e9, 1), error=relative(M, exact))
    gemm_rows.append(row), print(row, flush=True)
    for variant, build in BUILDS.items():
        blas.SPLIT_K_BUILD = build
        for splits in (1, 2, 4, 6, 8):
            P = cp.full((splits, products, Kg, Cg), cp.nan, cp.float32)
            ms = gpu_ms(lambda: blas.gemm_batched_split_k(E, V.transpose(0, 2, 1), P))
            row = dict(images=images, reduction=T, engine=variant, aligned=T % 4 == 0, splits=splits, ms=round(ms, 4),
                       tflops=round(flops / ms / 1e9, 1), error=relative(P.sum(axis=0), exact))
            gemm_rows.append(row), print(row, flush=True)
    del E, V, M, P, exact
    cp.get_default_memory_pool().free_all_blocks()
blas.SPLIT_K_BUILD = ()  # the layers below run the default build

# ---- the whole weight gradient, per layer ----
LAYERS = [  # (name, N, C, K, H, r, padding, groups)
    ("caffenet conv2", 128, 96, 256, 27, 5, 2, 2),
    ("caffenet conv2", 256, 96, 256, 27, 5, 2, 2),
    ("resnet 64@56", 64, 64, 64, 56, 3, 1, 1),
    ("resnet 128@28", 64, 128, 128, 28, 3, 1, 1),
    ("resnet 256@14", 64, 256, 256, 14, 3, 1, 1),
    ("resnet 512@7", 64, 512, 512, 7, 3, 1, 1),
]
POLICY = winograd.Winograd.weight_gradient_splits
layer_rows = []
for name, N, C, K, H, r, pad, G in LAYERS:
    x = cp.random.standard_normal((N, C, H, H), dtype=cp.float32)
    dy = cp.random.standard_normal((N, K, H, H), dtype=cp.float32)
    w_shape = (K, C // G, r, r)

    def wgrad(algo, limit):
        return api.conv2d_backward_filter(x, dy, w_shape, 1, pad, 1, G, algo=algo, workspace_limit=limit)

    want = api.conv2d_backward_filter(x.astype(cp.float64), dy.astype(cp.float64), w_shape, 1, pad, 1, G,
                                      algo="implicit_gemm", workspace_limit=0)
    base = dict(layer=name, N=N, C=C, K=K, H=H, r=r, groups=G)
    row = dict(base, algo="implicit_gemm", splits=None, ms=round(gpu_ms(lambda: wgrad("implicit_gemm", 0)), 4),
               error=relative(wgrad("implicit_gemm", 0), want))
    layer_rows.append(row), print(row, flush=True)
    stem = "winograd_4x4" if r == 3 else "winograd_4x4_5x5"
    for algo, limit in ((stem + "_chunked", 64 << 20), (stem, 1 << 40)):
        for splits in ("policy", 1, 2, 3, 4, 6, 7, 8):
            winograd.Winograd.weight_gradient_splits = POLICY if splits == "policy" else lambda self, p, s=splits: s
            for clear in registry.cache_clearers:  # plans hold workspace sizes of the previous split count
                clear()
            problem = ConvProblem(N, C, H, H, K, r, r, (1, 1), (pad, pad), (1, 1), G, np.dtype(np.float32), "cuda")
            chosen = winograd.Winograd(4, r, chunked=algo.endswith("chunked")).weight_gradient_splits(problem)
            try:
                got = wgrad(algo, limit)
                ms = gpu_ms(lambda: wgrad(algo, limit))
                row = dict(base, algo=algo, splits=splits, chosen=chosen, ms=round(ms, 4), error=relative(got, want))
            except Exception as error:  # noqa: BLE001 - record and go on
                row = dict(base, algo=algo, splits=splits, ms=None, error=repr(error)[:120])
            layer_rows.append(row), print(row, flush=True)
    winograd.Winograd.weight_gradient_splits = POLICY
    tx, tdy = torch.as_tensor(x, device="cuda"), torch.as_tensor(dy, device="cuda")
    torch.backends.cudnn.benchmark = True
    f = lambda: torch.nn.grad.conv2d_weight(tx, w_shape, tdy, padding=pad, groups=G)  # noqa: E731
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    row = dict(base, algo="cudnn", splits=None, ms=round(gpu_ms(f), 4))
    layer_rows.append(row), print(row, flush=True)
    del x, dy, tx, tdy, want
    cp.get_default_memory_pool().free_all_blocks(), torch.cuda.empty_cache()

with open(os.path.join(OUT, "split-k-gemm.json"), "w") as file:
    json.dump({"gemm": gemm_rows, "layers": layer_rows}, file, indent=1)
