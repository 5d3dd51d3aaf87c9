# Justifies implicit_gemm_wgmma.PAIRED_FILTER (a first layer's bf16 backward-filter on pixel pairs, two taps a 16-byte copy, instead of its channels padded to 8) and measures it against cuDNN.
"""The first layers of ResNet (7×7, stride 2, 3 channels, batch 128) and CaffeNet (11×11, stride 4, batch 256),
bfloat16, channels-last x and dy: minidnn's whole backward-filter call (``conv2d_backward_filter``, algo
implicit_gemm_wgmma) with PAIRED_FILTER off (the padded copy) and on (the pairs), and cuDNN's (PyTorch's
``aten.convolution_backward``, channels_last, cudnn.benchmark on). CUDA events around 10 calls in a row (their
launches queue behind each other, so the host's time between them hides behind the GPU's), 20 times after 3 warm-ups,
median per call; the two ways' float32 dw held against each other.

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/first_layer_filter_pairs.py --out DIR

Writes DIR/first-layer-filter-pairs.json and .md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import start, timed, torch_call, write_report  # this folder's probes
from minidnn.primitives import conv, convert, layout
from minidnn.primitives.conv import implicit_gemm_wgmma

# (name, N, C, H, W, K, R, S, stride, padding)
LAYERS = [("resnet.conv1", 128, 3, 224, 224, 64, 7, 7, 2, 3),
          ("caffenet.conv1", 256, 3, 227, 227, 96, 11, 11, 4, 0)]


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    rows = []
    for layer in LAYERS:
        name, N, C, H, W, K, R, S, stride, padding = layer
        problem = conv.problem.make_problem((N, C, H, W), (K, C, R, S), (stride, stride), (padding, padding), (1, 1),
                                            1, np.dtype(np.uint16), "cuda")

        def operand(shape):
            return layout.to_channels_last(convert.float_to_half(
                cupy.asarray(rng.standard_normal(shape).astype(np.float32)), "bfloat16"))

        x, dy = operand(problem.x_shape), operand(problem.y_shape)
        row, outputs = {"layer": name}, {}
        for paired in (False, True):
            implicit_gemm_wgmma.PAIRED_FILTER = paired
            conv.registry.clear_caches()
            out = cupy.zeros(problem.w_shape, np.float32)

            def call(out=out):
                conv.conv2d_backward_filter(x, dy, problem.w_shape, stride=stride, padding=padding,
                                            algo="implicit_gemm_wgmma", dtype=np.float32, out=out)

            label = "pairs" if paired else "padded"
            row[label] = timed(call, cupy, calls=10)
            out.fill(0)
            call()
            outputs[label] = out
        implicit_gemm_wgmma.PAIRED_FILTER = False
        row["cudnn"] = timed(torch_call("backward_filter", layer, torch.bfloat16, True, torch), cupy)
        row["pairs_over_padded"] = row["pairs"] / row["padded"]
        row["pairs_speed_over_cudnn"] = row["cudnn"] / row["pairs"]
        row["padded_speed_over_cudnn"] = row["cudnn"] / row["padded"]
        row["difference"] = float(cupy.abs(outputs["pairs"] - outputs["padded"]).max()
                                  / cupy.abs(outputs["padded"]).max())
        rows.append(row)
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    os.makedirs(args.out, exist_ok=True)
    columns = ["padded", "pairs", "cudnn", "pairs_over_padded", "padded_speed_over_cudnn", "pairs_speed_over_cudnn",
               "difference"]
    lines = ["| layer | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {row['layer']} | " + " | ".join(f"{row[c]:.4g}" for c in columns) + " |" for row in rows]
    write_report(args.out, "first-layer-filter-pairs", rows, "A first layer's bf16 backward-filter, whole calls, ms "
                 "a call (10 in a row, median of 20, CUDA events); difference: the largest |pairs − padded| over the "
                 "largest |padded| of the float32 dw.\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
