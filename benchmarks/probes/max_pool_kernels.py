# Measures max pooling's GPU kernels (forward with the uint8 record of winning taps, backward from it) against PyTorch's and against their memory time, on the reference models' pooling layers: the rule in pooling.cu that a thread keeps one position and loops over the planes.
"""Each layer timed in one process, float32 and bfloat16 (PyTorch: NCHW and channels_last, the faster): CUDA
events around 20 calls after 3 warm-ups, median. The memory time is the bytes the call must move (x and y
forward, with the record; dy, the record and dx backward) over 4.8 TB/s, the H200's HBM3e peak. PyTorch's
backward runs through torch.autograd.grad, its dispatch inside the events.

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/max_pool_kernels.py --out DIR

Writes DIR/max-pool.json and DIR/max-pool.md.
"""
import functools
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import (keep_faster, layer_table, print_row, start, timed,  # this folder's probes
                                         write_report)
from minidnn.primitives import convert, pooling

# (name, N, C, H, W, kernel, stride, padding): ResNet's stem pool and CaffeNet's three.
LAYERS = [("resnet.maxpool", 128, 64, 112, 112, 3, 2, 1), ("caffenet.pool1", 256, 96, 55, 55, 3, 2, 0),
          ("caffenet.pool2", 256, 256, 27, 27, 3, 2, 0), ("caffenet.pool5", 256, 256, 13, 13, 3, 2, 0)]
PEAK_BYTES_PER_MS = 4.8e9


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    rows = []
    for name, N, C, H, W, kernel, stride, padding in LAYERS:
        for dtype_name in ("float32", "bfloat16"):
            x = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32))
            if dtype_name == "bfloat16":
                x = convert.float_to_half(x, "bfloat16")
            y, taps = pooling.max_pool2d_forward(x, kernel, stride, padding)
            dy = cupy.ones_like(y)
            size = x.dtype.itemsize
            row = {"layer": name, "dtype": dtype_name,
                   "forward": timed(functools.partial(pooling.max_pool2d_forward, x, kernel, stride, padding), cupy),
                   "backward": timed(functools.partial(pooling.max_pool2d_backward, dy, taps, x.shape, kernel, stride,
                                                       padding), cupy),
                   "forward_memory": (x.size + y.size) * size / PEAK_BYTES_PER_MS + y.size / PEAK_BYTES_PER_MS,
                   "backward_memory": (y.size + x.size) * size / PEAK_BYTES_PER_MS + y.size / PEAK_BYTES_PER_MS}
            torch_dtype = torch.float32 if dtype_name == "float32" else torch.bfloat16
            best = {"forward": None, "backward": None}
            for layout in (torch.contiguous_format, torch.channels_last):
                tx = torch.randn(N, C, H, W, device="cuda", dtype=torch_dtype).contiguous(memory_format=layout)
                tx.requires_grad_(True)
                ty = torch.nn.functional.max_pool2d(tx, kernel, stride, padding)
                tdy = torch.ones_like(ty)
                times = {"forward": timed(functools.partial(torch.nn.functional.max_pool2d, tx, kernel, stride,
                                                            padding), cupy),
                         "backward": timed(functools.partial(torch.autograd.grad, ty, tx, tdy, retain_graph=True),
                                           cupy)}
                keep_faster(best, times)
            row["torch_forward"], row["torch_backward"] = best["forward"], best["backward"]
            rows.append(row)
            print_row(row)
    os.makedirs(args.out, exist_ok=True)
    lines = layer_table(rows)
    write_report(args.out, "max-pool", rows, "ms, median of 20 (CUDA events); PyTorch's the faster of NCHW and "
                 "channels_last; memory: the bytes moved over 4.8 TB/s.\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
