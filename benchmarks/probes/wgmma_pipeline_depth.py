# Measures implicit_gemm_wgmma's pipeline builds (stages of shared memory, groups of products left in flight) per layer and direction: the rule that fixes implicit_gemm_wgmma.PIPELINES (both builds).
"""Each layer-direction of nhwc_implicit_gemm_vs_cudnn's layers, bfloat16 (or float32 on the TF32 build with
--tf32), the wgmma kernel alone on operands already channels-last, once per
pipeline build: CUDA events around 20 calls after 3 warm-ups, median. A build is
``STAGES,IN_FLIGHT`` (for example ``4,1``); ``current`` times the tree's own kernels as they are, which lets
one script time another tree's kernels (put that tree first on PYTHONPATH). Each row also gives, for each build,
the largest difference between its output and the first build's, in units of the largest output (forward's
sums run in the same order in every build; backward-filter adds its slices with atomicAdd in any order).

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/wgmma_pipeline_depth.py --out DIR --builds 3,0 4,1

Writes DIR/wgmma-pipeline.json and DIR/wgmma-pipeline.md (DIR/wgmma-pipeline-<label>.* with --label).
"""
import argparse
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import timed, write_report  # this folder's probes
from nhwc_implicit_gemm_vs_cudnn import LAYERS, kernel_only
from minidnn import backend
from minidnn.primitives import _cuda, convert
from minidnn.primitives.conv import implicit_gemm_nhwc as nhwc, implicit_gemm_wgmma as wgmma

DIRECTIONS = ("forward", "backward_data", "backward_filter")


def columns_of(layer, direction):
    """The product's width, which picks the tile (implicit_gemm_nhwc._block_n): K, or C for backward-data."""
    C, K = layer[2], layer[5]  # (name, N, C, H, W, K, R, S, stride, padding)
    return C if direction == "backward_data" else K


def output_of(direction, layer, cupy, tf32):
    """One run of the kernel on fixed operands, its output widened to float32 (backward-filter's dw from zero)."""
    run = kernel_only(direction, layer, cupy, np.random.default_rng(7), wgmma, tf32)
    run()
    out = run.output
    return out.copy() if out.dtype == np.float32 else convert.half_to_float(out, "bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--builds", nargs="+", default=["current"], help="STAGES,IN_FLIGHT pairs, or current")
    parser.add_argument("--label", default="")
    parser.add_argument("--tf32", action="store_true", help="float32 operands on the TF32 build")
    args = parser.parse_args()
    import torch  # noqa: PLC0415 - for the report's versions only

    cupy = backend.cupy()
    _cuda.set_allow_tf32(args.tf32)  # the TF32 build takes float32 problems only with TF32 allowed
    builds = [None if text == "current" else tuple(int(v) for v in text.split(",")) for text in args.builds]
    pipelines = wgmma.PIPELINES  # one table for both builds: the probe runs one build at a time
    chosen = dict(pipelines)
    rows = []
    for layer in LAYERS:
        for direction in DIRECTIONS:
            block_n = nhwc._block_n(columns_of(layer, direction))
            row = {"layer": layer[0], "direction": direction, "block_n": block_n}
            first = None
            for text, build in zip(args.builds, builds):
                if build is not None:
                    pipelines[block_n] = build
                run = kernel_only(direction, layer, cupy, np.random.default_rng(0), wgmma, args.tf32)
                if run is None:
                    break
                row[f"ms {text}"] = timed(run, cupy)
                out = output_of(direction, layer, cupy, args.tf32)
                first = out if first is None else first
                row[f"difference {text}"] = float(cupy.abs(out - first).max() / cupy.abs(first).max())
                if build is not None:
                    pipelines.update(chosen)
            if len(row) > 3:
                rows.append(row)
                print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                      flush=True)
    os.makedirs(args.out, exist_ok=True)
    columns = [f"ms {text}" for text in args.builds] + [f"difference {text}" for text in args.builds[1:]]
    lines = ["| layer | direction | tile width | " + " | ".join(columns) + " |", "|---" * (len(columns) + 3) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['direction']} | {row['block_n']} | "
                     + " | ".join(f"{row[c]:.4g}" for c in columns) + " |")
    stem = "wgmma-pipeline" + (f"-{args.label}" if args.label else "")
    values = "float32 on TF32" if args.tf32 else "bfloat16"
    write_report(args.out, stem, rows, f"{values}, the wgmma kernel alone, ms (median of 20, CUDA events); builds "
                 "are STAGES,IN_FLIGHT.\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
