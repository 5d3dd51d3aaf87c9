# Justifies the half backward-filter kernels' pixel walk without divisions and their (K, R, S, C) float32 sums
# (conv/channels_last.cuh's PixelWalk, implicit_gemm_nhwc.py's _finish_filter_gradient), and their split of N·P·Q.
"""Backward-filter per layer, bfloat16, channels-last operands, in one process: implicit_gemm_wgmma's and
implicit_gemm_nhwc's kernels alone (the launch on operands already channels-last, into float32 sums), wgmma's at
several splits of the pixels (``SPLIT_K_CTAS_PER_SM``), each algorithm's whole call as a channels-last step makes it
(``conv2d_backward_filter`` of channels-last x and dy, float32 dw), and cuDNN's (PyTorch, channels_last,
cudnn.benchmark on). CUDA events around 20 calls after 3 warm-ups, median; TFLOP/s from 2·N·K·P·Q·C·R·S.

The tree measured is the one ``PYTHONPATH`` puts first, so that two trees run the same probe:

    PYTHONPATH=scratch/base:benchmarks/probes python3 benchmarks/probes/backward_filter_kernels.py --out D --label base
    PYTHONPATH=.:benchmarks/probes python3 benchmarks/probes/backward_filter_kernels.py --out D --label new

Writes D/backward-filter-LABEL.json and .md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import start, timed, torch_call, write_report  # this folder's probes
from minidnn.primitives import conv, convert, layout
from minidnn.primitives.conv import implicit_gemm_nhwc as nhwc, implicit_gemm_wgmma as wgmma

# (name, N, C, H, W, K, R, S, stride, padding): ResNet-18's and ResNet-50's layers at batch 128.
LAYERS = [
    ("resnet18.layer1.conv", 128, 64, 56, 56, 64, 3, 3, 1, 1),
    ("resnet18.layer2.conv", 128, 128, 28, 28, 128, 3, 3, 1, 1),
    ("resnet18.layer2.0.conv1_s2", 128, 64, 56, 56, 128, 3, 3, 2, 1),
    ("resnet18.layer3.conv", 128, 256, 14, 14, 256, 3, 3, 1, 1),
    ("resnet18.layer4.conv", 128, 512, 7, 7, 512, 3, 3, 1, 1),
    ("resnet18.layer2.0.downsample", 128, 64, 56, 56, 128, 1, 1, 2, 0),
    ("resnet50.layer1.conv1_1x1", 128, 64, 56, 56, 64, 1, 1, 1, 0),
    ("resnet50.layer1.conv3_1x1", 128, 64, 56, 56, 256, 1, 1, 1, 0),
    ("resnet50.layer3.conv1_1x1", 128, 1024, 14, 14, 256, 1, 1, 1, 0),
    ("resnet50.layer4.conv2", 128, 512, 7, 7, 512, 3, 3, 1, 1),
]
SPLITS = (2, 4, 8, 16)  # wgmma's CTAs per SM the split aims at (the tree's is wgmma.SPLIT_K_CTAS_PER_SM)
COLUMNS = ["wgmma_kernel", *(f"wgmma_kernel_split{n}" for n in SPLITS), "nhwc_kernel", "wgmma_call", "nhwc_call",
           "cudnn", "wgmma_kernel_tflops", "best_call_over_cudnn"]


def operands(layer, cupy, rng):
    """Channels-last bfloat16 x and dy of ``layer`` (CuPy arrays of 16-bit words, NHWC buffers) and its problem."""
    _, N, C, H, W, K, R, S, stride, padding = layer
    problem = conv.problem.make_problem((N, C, H, W), (K, C, R, S), (stride, stride), (padding, padding), (1, 1), 1,
                                        np.dtype(np.uint16), "cuda")

    def channels_last(shape):
        values = convert.float_to_half(cupy.asarray(rng.standard_normal(shape).astype(np.float32)), "bfloat16")
        return layout.to_channels_last(values)

    return problem, channels_last((N, C, H, W)), channels_last((N, K, problem.P, problem.Q))


def measure(layer, torch, cupy, rng) -> dict:
    """One layer's row: every time of COLUMNS, in ms, and the rates."""
    name, N, C, _, _, K, R, S, stride, padding = layer
    problem, x, dy = operands(layer, cupy, rng)
    flops = 2 * N * K * problem.P * problem.Q * C * R * S
    sums = cupy.zeros(problem.w_shape, np.float32)
    x_last, dy_last = layout.buffer(x), layout.buffer(dy)

    def kernel(kernels):
        return lambda: kernels._launch_backward_filter(x_last, dy_last, sums, problem)

    def call(algo):
        return lambda: conv.conv2d_backward_filter(x, dy, problem.w_shape, stride=stride, padding=padding, algo=algo,
                                                   dtype=np.float32)

    row = {"layer": name, "gflop": flops / 1e9, "wgmma_kernel": timed(kernel(wgmma), cupy),
           "nhwc_kernel": timed(kernel(nhwc), cupy), "wgmma_call": timed(call("implicit_gemm_wgmma"), cupy),
           "nhwc_call": timed(call("implicit_gemm_nhwc"), cupy)}
    # Trees from before wgmma had a split of its own (6e05c55 and earlier) use implicit_gemm_nhwc's.
    owner = wgmma if hasattr(wgmma, "SPLIT_K_CTAS_PER_SM") else nhwc
    default_split = owner.SPLIT_K_CTAS_PER_SM
    for split in SPLITS:
        owner.SPLIT_K_CTAS_PER_SM = split
        try:
            row[f"wgmma_kernel_split{split}"] = timed(kernel(wgmma), cupy)
        finally:
            owner.SPLIT_K_CTAS_PER_SM = default_split
    row["cudnn"] = timed(torch_call("backward_filter", layer, torch.bfloat16, True, torch), cupy)
    row["wgmma_kernel_tflops"] = flops / row["wgmma_kernel"] / 1e9
    row["best_call_over_cudnn"] = min(row["wgmma_call"], row["nhwc_call"]) / row["cudnn"]
    return row


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0], lambda parser: parser.add_argument("--label",
                                                                                                required=True))
    rows = []
    for layer in LAYERS:
        rows.append(measure(layer, torch, cupy, rng))
        print(f"{layer[0]:30s} " + "  ".join(f"{c} {rows[-1][c]:.4g}" for c in COLUMNS), flush=True)
    os.makedirs(args.out, exist_ok=True)
    lines = ["| layer | GFLOP | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    lines += [f"| {row['layer']} | {row['gflop']:.1f} | " + " | ".join(f"{row[c]:.3g}" for c in COLUMNS) + " |"
              for row in rows]
    split = getattr(wgmma, "SPLIT_K_CTAS_PER_SM", nhwc.SPLIT_K_CTAS_PER_SM)
    write_report(args.out, f"backward-filter-{args.label}", rows,
                 f"Tree {args.label}; bfloat16, channels-last operands; times in ms (median of 20, CUDA events); "
                 f"wgmma_kernel at the tree's split ({split} CTAs per SM), the others at the split named.\n\n"
                 + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
