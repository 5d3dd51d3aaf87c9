# Measures implicit_gemm_wgmma.tile_width's 128 or 256 wide and PIPELINES[256] (the rule takes 128 since 2026-12-07).
"""Each layer-direction whose product is wider than 128 columns (K, or C for backward-data), float32 on the TF32
build (bfloat16 with --bf16): the wgmma kernel alone on operands already channels-last
(nhwc_implicit_gemm_vs_cudnn.kernel_only), once at each tile width and pipeline (``128``: the 128-wide tile;
``256``: 256-wide, three stages; ``256x4``: four stages), whatever tile_width would choose. Beside them PyTorch's
cuDNN in the same type, NCHW and channels_last, cudnn.benchmark on. CUDA events around 20 calls after 3 warm-ups,
median. Each row also gives the largest difference between a wider build's output and the 128-wide one's, in units
of the largest output (forward sums each output in the same order at every width; backward-filter adds its slices
with atomicAdd in any order).

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/wgmma_tile_width.py --out DIR [--bf16]

Writes DIR/wgmma-tile-width.json and DIR/wgmma-tile-width.md (-bf16 with --bf16).
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import against_cudnn, layer_flops, start, timed, torch_call, write_report  # this folder's probes
from nhwc_implicit_gemm_vs_cudnn import kernel_only
from tf32_channels_last_convolution import LAYERS as TF32_LAYERS
from wgmma_pipeline_depth import DIRECTIONS, columns_of
from minidnn.primitives import _cuda, convert
from minidnn.primitives.conv import implicit_gemm_wgmma as wgmma

# (name, N, C, H, W, K, R, S, stride, padding): the ResNet-18, ResNet-50 (batch 128) and CaffeNet (batch 256)
# layers with a direction more than 128 columns wide: tf32_channels_last_convolution's, and four more.
LAYERS = [layer for layer in TF32_LAYERS if max(layer[2], layer[5]) > 128] + [
    ("resnet18.layer4.conv1_stride2", 128, 256, 14, 14, 512, 3, 3, 2, 1),
    ("resnet50.layer2.conv3_1x1", 128, 128, 28, 28, 512, 1, 1, 1, 0),
    ("resnet50.layer4.conv1_1x1", 128, 2048, 7, 7, 512, 1, 1, 1, 0),
    ("caffenet.conv3", 256, 256, 13, 13, 384, 3, 3, 1, 1),
]
# label -> (tile width, its pipeline)
BUILDS = {"128": (128, None), "256": (256, (3, 0)), "256x4": (256, (4, 0))}


def kernel_of(direction):
    """The kernel that runs ``direction``: backward-data runs forward's."""
    return "backward_filter" if direction == "backward_filter" else "forward"


def run_build(direction, layer, cupy, width, pipeline, tf32):
    """The kernel-only call at ``width`` (and ``pipeline``), timed, and its output widened to float32."""
    chosen, pipelines = wgmma.tile_width, dict(wgmma.PIPELINES)
    wgmma.tile_width = lambda columns, kernel: width
    if pipeline is not None:
        wgmma.PIPELINES[width] = pipeline
    try:
        call = kernel_only(direction, layer, cupy, np.random.default_rng(7), wgmma, tf32)
        if call is None:
            return None, None
        call()
        output = call.output
        output = output.copy() if output.dtype == np.float32 else convert.half_to_float(output, "bfloat16")
        return timed(call, cupy), output
    finally:
        wgmma.tile_width = chosen
        wgmma.PIPELINES.clear()
        wgmma.PIPELINES.update(pipelines)


def main() -> None:
    args, torch, cupy, _ = start(__doc__.splitlines()[0], lambda parser: parser.add_argument(
        "--bf16", action="store_true", help="bfloat16 operands (the half build), not float32 on TF32"))
    tf32 = not args.bf16
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    _cuda.set_allow_tf32(tf32)
    dtype = torch.float32 if tf32 else torch.bfloat16
    rows = []
    for layer in LAYERS:
        name = layer[0]
        flops = layer_flops(layer)
        for direction in DIRECTIONS:
            columns = columns_of(layer, direction)
            if columns <= 128:
                continue
            row = {"layer": name, "direction": direction, "columns": columns,
                   "rule": wgmma.tile_width(columns, kernel_of(direction)), "gflop": flops / 1e9}
            first = None
            for label, (width, pipeline) in BUILDS.items():
                row[label], output = run_build(direction, layer, cupy, width, pipeline, tf32)
                if output is None:
                    break
                first = output if first is None else first
                row[f"difference {label}"] = float(cupy.abs(output - first).max() / cupy.abs(first).max())
            if row["128"] is None:  # the build does not take it (strided backward-data)
                continue
            against_cudnn(row, lambda last: torch_call(direction, layer, dtype, last, torch), tuple(BUILDS), cupy)
            for label in BUILDS:
                row[f"{label} TFLOP/s"] = flops / row[label] / 1e9
            rows.append(row)
            print(f"{name:32s} {direction:15s} " + "  ".join(f"{label} {row[label]:.3f}" for label in BUILDS)
                  + f"  cuDNN {row['cudnn_nchw']:.3f} / {row['cudnn_channels_last']:.3f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    columns = [*BUILDS, "cudnn_nchw", "cudnn_channels_last", *(f"{label}_over_cudnn" for label in BUILDS),
               *(f"{label} TFLOP/s" for label in BUILDS), *(f"difference {label}" for label in list(BUILDS)[1:])]
    lines = ["| layer | direction | columns | rule | " + " | ".join(columns) + " |", "|---" * (len(columns) + 4) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['direction']} | {row['columns']} | {row['rule']} | "
                     + " | ".join(f"{row[c]:.3g}" for c in columns) + " |")
    write_report(args.out, "wgmma-tile-width" + ("-bf16" if args.bf16 else ""), rows,
                 ("float32 on TF32" if tf32 else "bfloat16") + ", the wgmma kernel alone on channels-last "
                 "operands, ms (median of 20, CUDA events); builds: tile width and stages; ratios over the faster "
                 "cuDNN layout; rule: the width tile_width picks.\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
