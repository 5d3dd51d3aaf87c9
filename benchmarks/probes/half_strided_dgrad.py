# Justifies selection.preference's strided_dgrad ahead of implicit GEMM for half-precision strided backward-data
# (the phases gather only the taps that reach each dx pixel; a 1x1 shortcut's one phase runs as gemm_1x1).
"""The strided backward-data layers of ResNet-18/50 at batch 128 in bfloat16, timed in one process: minidnn's
``implicit_gemm`` and ``strided_dgrad`` forced, and cuDNN's bf16 (channels_last, cudnn.benchmark on). CUDA events
around 20 calls after 3 warm-ups, median; each call is a whole conv2d_backward_data (its allocations included).

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/half_strided_dgrad.py --out DIR

Writes DIR/half-strided-dgrad.json and DIR/half-strided-dgrad.md.
"""
import os

from half_implicit_gemm_vs_cudnn import minidnn_call, start, timed, torch_call, write_report

# (name, N, C, H, W, K, R, S, stride, padding): C and H, W are dx's (the layer's input), K dy's channels.
LAYERS = [
    ("resnet18.layer2.0.conv1", 128, 64, 56, 56, 128, 3, 3, 2, 1),
    ("resnet18.layer2.0.downsample", 128, 64, 56, 56, 128, 1, 1, 2, 0),
    ("resnet18.layer3.0.conv1", 128, 128, 28, 28, 256, 3, 3, 2, 1),
    ("resnet18.layer3.0.downsample", 128, 128, 28, 28, 256, 1, 1, 2, 0),
    ("resnet18.layer4.0.conv1", 128, 256, 14, 14, 512, 3, 3, 2, 1),
    ("resnet18.layer4.0.downsample", 128, 256, 14, 14, 512, 1, 1, 2, 0),
    ("resnet50.layer2.0.conv2", 128, 128, 56, 56, 128, 3, 3, 2, 1),
    ("resnet50.layer2.0.downsample", 128, 256, 56, 56, 512, 1, 1, 2, 0),
]
ALGORITHMS = ("implicit_gemm", "strided_dgrad")


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    rows = []
    for layer in LAYERS:
        row = {"layer": layer[0]}
        for algo in ALGORITHMS:
            row[algo] = timed(minidnn_call("backward_data", layer, "bfloat16", cupy, rng, algo=algo), cupy)
        row["cudnn_bf16_nhwc"] = timed(torch_call("backward_data", layer, torch.bfloat16, True, torch), cupy)
        row["implicit_gemm_over_strided_dgrad"] = row["implicit_gemm"] / row["strided_dgrad"]
        rows.append(row)
        print(f"{layer[0]:30s} implicit_gemm {row['implicit_gemm']:.3f} ms  strided_dgrad {row['strided_dgrad']:.3f} "
              f"ms  cuDNN {row['cudnn_bf16_nhwc']:.3f} ms", flush=True)
    os.makedirs(args.out, exist_ok=True)
    lines = ["| layer | implicit_gemm ms | strided_dgrad ms | cuDNN bf16 channels_last ms | implicit_gemm / strided_dgrad |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['layer']} | {r['implicit_gemm']:.3f} | {r['strided_dgrad']:.3f} | {r['cudnn_bf16_nhwc']:.3f} | "
              f"{r['implicit_gemm_over_strided_dgrad']:.2f} |" for r in rows]
    write_report(args.out, "half-strided-dgrad", rows, "Backward-data in bfloat16, batch 128; median of 20 "
                 "(CUDA events).\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
