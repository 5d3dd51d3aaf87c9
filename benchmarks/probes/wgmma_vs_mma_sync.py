# Measures implicit_gemm_wgmma (Hopper's warpgroup MMA) against implicit_gemm_nhwc (mma.sync) and cuDNN bf16, per layer and direction: the rule that puts wgmma first for half problems on Hopper (selection.preference), and issue 24's "measure wgmma against mma.sync on one layer".
"""Each layer-direction timed in one process, bfloat16: the two kernels alone on operands already channels-last,
the two algorithms' whole calls through ``conv2d_*`` with ``algo=`` forced (layout copies included), and
PyTorch's cuDNN in NCHW and channels_last (cudnn.benchmark on). CUDA events around 20 calls after 3 warm-ups,
median; TFLOP/s from 2·N·K·P·Q·C·R·S. Each row also gives the largest difference between the two kernels'
outputs, in units of the largest output's magnitude (both round float32 sums of the same exact products once;
backward-filter adds its slices' sums in any order).

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/wgmma_vs_mma_sync.py --out DIR

Writes DIR/wgmma-conv.json and DIR/wgmma-conv.md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import layer_flops, minidnn_call, start, timed, torch_call, write_report  # this folder's probes
from nhwc_implicit_gemm_vs_cudnn import LAYERS, kernel_only
from minidnn.primitives import conv, convert
from minidnn.primitives.conv import implicit_gemm_nhwc as nhwc, implicit_gemm_wgmma as wgmma

DIRECTIONS = ("forward", "backward_data", "backward_filter")
COLUMNS = ["mma_sync_kernel", "wgmma_kernel", "mma_sync_call", "wgmma_call", "cudnn_best", "wgmma_kernel_speedup",
           "wgmma_call_over_cudnn", "wgmma_kernel_tflops", "mma_sync_kernel_tflops", "largest_difference"]


def outputs_differ(direction, layer, cupy, rng):
    """The two algorithms' results on one pair of operands: the largest |difference| over the largest |output|."""
    calls = [minidnn_call(direction, layer, "bfloat16", cupy, np.random.default_rng(7), algo=algo)
             for algo in ("implicit_gemm_nhwc", "implicit_gemm_wgmma")]
    first, second = (convert.half_to_float(call(), "bfloat16") for call in calls)
    return float(cupy.abs(first - second).max() / cupy.abs(first).max())


def optional(call, cupy):
    try:
        call()
    except ValueError:  # not supported (backward-data of a strided layer)
        return None
    return timed(call, cupy)


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    rows = []
    with conv.settings(workspace_limit=1 << 30):  # the layout copies of the largest layers
        for layer in LAYERS:
            name = layer[0]
            flops = layer_flops(layer)
            for direction in DIRECTIONS:
                row = {"layer": name, "direction": direction, "gflop": flops / 1e9}
                for label, kernels, algo in (("mma_sync", nhwc, "implicit_gemm_nhwc"),
                                             ("wgmma", wgmma, "implicit_gemm_wgmma")):
                    kernel = kernel_only(direction, layer, cupy, rng, kernels)
                    row[f"{label}_kernel"] = None if kernel is None else timed(kernel, cupy)
                    row[f"{label}_call"] = optional(minidnn_call(direction, layer, "bfloat16", cupy, rng, algo=algo),
                                                    cupy)
                row["cudnn_best"] = min(timed(torch_call(direction, layer, torch.bfloat16, last, torch), cupy)
                                        for last in (False, True))
                have = row["wgmma_kernel"] is not None
                row["wgmma_kernel_speedup"] = row["mma_sync_kernel"] / row["wgmma_kernel"] if have else None
                row["wgmma_call_over_cudnn"] = row["wgmma_call"] / row["cudnn_best"] if row["wgmma_call"] else None
                for label in ("wgmma", "mma_sync"):
                    row[f"{label}_kernel_tflops"] = flops / row[f"{label}_kernel"] / 1e9 if have else None
                row["largest_difference"] = outputs_differ(direction, layer, cupy, rng) if row["wgmma_call"] else None
                rows.append(row)
                print(f"{name:26s} {direction:14s} " + "  ".join(
                    f"{c} {'-' if row[c] is None else f'{row[c]:.4g}'}" for c in COLUMNS), flush=True)
    os.makedirs(args.out, exist_ok=True)
    lines = ["| layer | direction | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['direction']} | "
                     + " | ".join("-" if row[c] is None else f"{row[c]:.3g}" for c in COLUMNS) + " |")
    write_report(args.out, "wgmma-conv", rows, "bfloat16, times in ms (median of 20, CUDA events); cuDNN's best "
                 "of NCHW and channels_last.\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
