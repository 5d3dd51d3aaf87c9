# Measures batch norm's training kernels (statistics then normalise forward; sums then dx backward) against PyTorch's and against their memory time, on the batch-norm layers of ResNet-18 and ResNet-50 at batch 128: the rule in batchnorm.cu that a group of reads sums in its own chains (float in the half build) before merging into the double accumulators.
"""Each layer in one process, float32 and bfloat16 (PyTorch: NCHW and channels_last, the faster); minidnn's arrays
NCHW, or with --channels-last channels-last (batchnorm.cu's row kernels). GPU time of
one call queued behind a hold of the stream (_cuda.queued_milliseconds: the host's launch gaps do not count),
median of 15 after 3 warm-ups. The memory time is the bytes the call must move (forward: x twice and y;
backward: dy and x twice, dx once) over 4.8 TB/s, the H200's HBM3e peak. No ReLU is fused, as PyTorch's
batch norm has none. PyTorch's backward runs through torch.autograd.grad.

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/batch_norm_kernels.py --out DIR [--channels-last]
        [--dtypes bfloat16] [--no-torch]

Writes DIR/batch-norm.json and DIR/batch-norm.md.
"""
import functools
import os
import statistics

import numpy as np
from half_implicit_gemm_vs_cudnn import (LAYER_COLUMNS, keep_faster, layer_table, print_row, start,  # this folder's probes
                                         write_report)

from minidnn.primitives import _cuda, batchnorm, convert, layout

# (name, N, C, H, W): ResNet-18's five shapes of batch norm, then ResNet-50's others.
LAYERS = [("stem", 128, 64, 112, 112), ("r18.layer1", 128, 64, 56, 56), ("r18.layer2", 128, 128, 28, 28),
          ("r18.layer3", 128, 256, 14, 14), ("r18.layer4", 128, 512, 7, 7), ("r50.layer1", 128, 256, 56, 56),
          ("r50.layer2", 128, 512, 28, 28), ("r50.layer3", 128, 1024, 14, 14), ("r50.layer4", 128, 2048, 7, 7)]
PEAK_BYTES_PER_MS = 4.8e9


def gpu_ms(call, repeats=15, warmup=3):
    for _ in range(warmup):
        call()
    return statistics.median(_cuda.queued_milliseconds(call, 2.0, 64.0) for _ in range(repeats))


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0], extra=_options)
    dtypes = args.dtypes.split(",")
    rows = []
    for name, N, C, H, W in LAYERS:
        for dtype_name in dtypes:
            x = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32) * 2 + 0.5)
            dy = cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32))
            if dtype_name == "bfloat16":
                x, dy = convert.float_to_half(x, "bfloat16"), convert.float_to_half(dy, "bfloat16")
            if args.channels_last:
                x, dy = layout.to_channels_last(x), layout.to_channels_last(dy)
            weight = cupy.asarray(rng.uniform(0.5, 1.5, C).astype(np.float32))
            bias = cupy.asarray(rng.standard_normal(C).astype(np.float32))
            running_mean, running_var = cupy.zeros(C, np.float32), cupy.ones(C, np.float32)
            _, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var)
            bytes_per_pass = x.size * x.dtype.itemsize
            row = {"layer": name, "dtype": dtype_name + ("+channels_last" if args.channels_last else ""),
                   "forward": gpu_ms(functools.partial(batchnorm.batch_norm_forward_training, x, weight, bias,
                                                       running_mean, running_var)),
                   "backward": gpu_ms(functools.partial(batchnorm.batch_norm_backward_training, dy, x, weight, mean,
                                                        invstd)),
                   "forward_memory": 3 * bytes_per_pass / PEAK_BYTES_PER_MS,
                   "backward_memory": 5 * bytes_per_pass / PEAK_BYTES_PER_MS}
            torch_dtype = torch.float32 if dtype_name == "float32" else torch.bfloat16
            best = {"forward": None, "backward": None}
            for memory_format in () if args.no_torch else (torch.contiguous_format, torch.channels_last):
                tx = torch.randn(N, C, H, W, device="cuda", dtype=torch_dtype).contiguous(memory_format=memory_format)
                tx.requires_grad_(True)
                tw = torch.ones(C, device="cuda", requires_grad=True)
                tb = torch.zeros(C, device="cuda", requires_grad=True)
                trm, trv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
                forward = functools.partial(torch.nn.functional.batch_norm, tx, trm, trv, tw, tb, True)
                ty = forward()
                tdy = torch.randn_like(ty)
                times = {"forward": gpu_ms(forward),
                         "backward": gpu_ms(functools.partial(torch.autograd.grad, ty, (tx, tw, tb), tdy,
                                                              retain_graph=True))}
                keep_faster(best, times)
            row["torch_forward"] = best["forward"] or float("nan")
            row["torch_backward"] = best["backward"] or float("nan")
            rows.append(row)
            print_row(row)
    os.makedirs(args.out, exist_ok=True)
    lines = layer_table(rows)
    for dtype_name in dtypes:
        mine = [r for r in rows if r["dtype"].startswith(dtype_name)]
        lines.append(f"| **sum** | {dtype_name} | " + " | ".join(f"{sum(r[c] for r in mine):.4g}" for c in LAYER_COLUMNS)
                     + " |")
    write_report(args.out, "batch-norm", rows, "ms of GPU time per call, median of 15 (queued behind a hold: no "
                 "host gaps); PyTorch's the faster of NCHW and channels_last; memory: the bytes moved over "
                 "4.8 TB/s.\n\n" + "\n".join(lines) + "\n", torch)


def _options(parser) -> None:
    parser.add_argument("--channels-last", action="store_true", help="minidnn's x and dy channels-last")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--no-torch", action="store_true", help="minidnn's kernels alone (PyTorch's cells nan)")


if __name__ == "__main__":
    main()
