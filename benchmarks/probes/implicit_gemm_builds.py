# Justifies implicit_gemm.ctas_per_sm_for and RELATIVE_CTA_COST, the per-CTA cost of the two- and three-CTA builds measured on the H200 (minidnn/primitives/conv/implicit_gemm.py).
"""implicit_gemm's two kernel builds (2 or 3 CTAs per SM) timed against each other on the reference models' shapes.

Every direction, in fp32 (SIMT), TF32 and fp64, GPU time per call (queued behind a hold so that launch gaps do
not count); then the kernels cuDNN runs for CaffeNet conv2's weight gradient (torch.profiler), for the docs.
Writes NAME.json and NAME.md into --out. GPU only:

    PYTHONPATH=. python3 benchmarks/probes/implicit_gemm_builds.py --out DIR --name NAME
"""
import argparse
import json
import os

import numpy as np
import cupy as cp
from benchmarks.gpu_timing import gpu_ms
from minidnn.primitives import _cuda
from minidnn.primitives.conv import api, implicit_gemm

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
parser.add_argument("--name", default="implicit-gemm-builds")
arguments = parser.parse_args()
OUT = arguments.out
os.makedirs(OUT, exist_ok=True)
results = []


shapes = {  # N, C, H, K, R, stride, pad, groups
    "r18 conv1-like layer1": (64, 64, 56, 64, 3, 1, 1, 1),
    "r18 layer2.0.conv1": (64, 64, 56, 128, 3, 2, 1, 1),
    "r18 layer2 3x3": (64, 128, 28, 128, 3, 1, 1, 1),
    "r18 layer3.0.conv1": (64, 128, 28, 256, 3, 2, 1, 1),
    "r18 layer3 3x3": (64, 256, 14, 256, 3, 1, 1, 1),
    "r18 layer4.0.conv1": (64, 256, 14, 512, 3, 2, 1, 1),
    "r18 layer4 3x3": (64, 512, 7, 512, 3, 1, 1, 1),
    "r50 layer2.0.conv2": (64, 128, 56, 128, 3, 2, 1, 1),
    "r50 layer3.0.conv2": (64, 256, 28, 256, 3, 2, 1, 1),
    "r50 layer4.0.conv2": (64, 512, 14, 512, 3, 2, 1, 1),
    "caffenet conv2": (128, 96, 27, 256, 5, 1, 2, 2),
    "caffenet conv3": (128, 256, 13, 384, 3, 1, 1, 1),
    "caffenet conv5": (128, 384, 13, 256, 3, 1, 1, 2),
}
original = implicit_gemm.ctas_per_sm_for
for mode in ("fp32", "tf32", "fp64"):
    dtype = np.float64 if mode == "fp64" else np.float32
    _cuda.set_allow_tf32(mode == "tf32")
    for name, (N, C, H, K, R, st, pad, G) in shapes.items():
        x = cp.random.standard_normal((N, C, H, H)).astype(dtype)
        w = cp.random.standard_normal((K, C // G, R, R)).astype(dtype)
        y = api.conv2d_forward(x, w, st, pad, 1, G, algo="implicit_gemm")
        dy = cp.random.standard_normal(y.shape).astype(dtype)
        calls = {"forward": lambda: api.conv2d_forward(x, w, st, pad, 1, G, algo="implicit_gemm", out=y),
                 "backward_data": lambda: api.conv2d_backward_data(dy, w, x.shape, st, pad, 1, G,
                                                                   algo="strided_dgrad" if st > 1 else "implicit_gemm"),
                 "backward_filter": lambda: api.conv2d_backward_filter(x, dy, w.shape, st, pad, 1, G, algo="implicit_gemm")}
        for direction, call in calls.items():
            row = {"mode": mode, "layer": name, "direction": direction}
            outs = {}
            for ctas in (2, 3):
                implicit_gemm.ctas_per_sm_for = lambda direction, n, sms, c=ctas: c
                outs[ctas] = call().copy() if direction != "forward" else (call(), y.copy())[1]
                row[f"ms_{ctas}"] = round(gpu_ms(call), 4)
            implicit_gemm.ctas_per_sm_for = original
            row["max_abs_diff"] = float(cp.abs(outs[2] - outs[3]).max())
            row["speedup_3"] = round(row["ms_2"] / row["ms_3"], 3)
            results.append(row); print(row, flush=True)
        del x, w, y, dy
_cuda.set_allow_tf32(False)
device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
with open(os.path.join(OUT, f"{arguments.name}.json"), "w") as file:
    json.dump({"device": device, "records": results}, file, indent=1)
lines = [f"# implicit_gemm: kernels built for 2 or 3 CTAs per SM ({device})", "",
         "GPU ms per call, median of 7, each call queued behind a hold kernel. Bit-identical outputs except "
         "backward-filter (atomicAdd order).", "",
         "| mode | layer | direction | 2 per SM | 3 per SM | speed-up |", "|---|---|---|---|---|---|"]
lines += [f"| {r['mode']} | {r['layer']} | {r['direction']} | {r['ms_2']:.4f} | {r['ms_3']:.4f} | {r['speedup_3']:.3f} |"
          for r in results]

# cuDNN's kernels for CaffeNet conv2's weight gradient (fp32), for the docs
import torch
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
for N in (128,):
    x = torch.randn(N, 96, 27, 27, device="cuda", requires_grad=False)
    w = torch.randn(256, 48, 5, 5, device="cuda", requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, padding=2, groups=2)
    g = torch.randn_like(y)
    for _ in range(3):
        torch.autograd.grad(torch.nn.functional.conv2d(x, w, padding=2, groups=2), w, g)
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.autograd.grad(torch.nn.functional.conv2d(x, w, padding=2, groups=2), w, g)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=90)
    print(table)
    lines += ["", f"## cuDNN's kernels for CaffeNet conv2 (batch {N}), forward + weight gradient, 5 calls, fp32", "",
              "```", table, "```"]
with open(os.path.join(OUT, f"{arguments.name}.md"), "w") as file:
    file.write("\n".join(lines) + "\n")
