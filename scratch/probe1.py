"""Probe: cuBLAS through ctypes, torch.profiler seeing CuPy kernels, find on the GPU."""
import time, json, os, sys
sys.path.insert(0, ".")
import numpy as np
import cupy as cp
import minidnn
from minidnn import backend
from minidnn.primitives import blas, conv
from minidnn.primitives.conv import selection
out = {}
a = cp.random.standard_normal((512, 256), dtype=cp.float32); b = cp.random.standard_normal((256, 384), dtype=cp.float32)
c = blas.gemm(a, b); out["gemm_err"] = float(cp.abs(c - a @ b).max())
c2 = blas.gemm(a[:, :100].T.copy().T, b[:100]); out["gemm_T_err"] = float(cp.abs(c2 - a[:, :100] @ b[:100]).max())
# capture
s = cp.cuda.Stream(non_blocking=True)
blas.prepare_capture()
with s:
    blas.gemm(a, b, c)  # warm on s
    s.synchronize()
    s.begin_capture(); blas.gemm(a, b, c, alpha=2.0); g = s.end_capture()
    c.fill(0); g.launch(stream=s); s.synchronize()
out["capture_err"] = float(cp.abs(c - 2 * (a @ b)).max())
import torch
from torch.profiler import profile, ProfilerActivity
torch.cuda.init()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        blas.gemm(a, b, c)
        cp.multiply(a, 2.0)
    cp.cuda.Device().synchronize()
ev = [e for e in prof.events() if str(e.device_type).endswith("CUDA")]
out["profiler_events"] = len(ev)
out["profiler_names"] = sorted({e.name[:60] for e in ev})[:10]
out["profiler_busy_us"] = sum(e.time_range.elapsed_us() for e in ev)
# find on a ResNet-18 layer
p = conv.ConvProblem(32, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1), (1, 1), 1, np.dtype(np.float32), "cuda")
os.environ["MINIDNN_CACHE_DIR"] = "/tmp/mcache"
for d in ("forward", "backward_data", "backward_filter"):
    out["find_" + d] = [(r.algorithm, round(r.time_ms, 3), r.workspace_bytes) for r in selection.find(p, d, 1 << 30)]
print(json.dumps(out, indent=1))
