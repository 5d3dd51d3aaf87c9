# Justifies gemm_1x1's gathered and scattered rows for strided 1x1 channels-last layers (ResNet's shortcuts), first in selection.preference for their backward-data, and strided_dgrad's phases on implicit_gemm_wgmma for channels-last strided 3x3 backward-data: each algorithm's whole call on those layers against cuDNN's.
"""Each layer-direction timed in one process, batch 128, channels-last operands, TF32 float32 and bfloat16: every
minidnn algorithm that supports the call, forced by name (one over the 64 MiB workspace runs in micro-batches, as a
forced algorithm does), and PyTorch's cuDNN on channels_last tensors (cudnn.benchmark on). CUDA events around 20
calls after 3 warm-ups, median; TFLOP/s from 2·N·K·P·Q·C·R·S. The layer's subject (gemm_1x1 on a 1x1 layer,
strided_dgrad on a 3x3 one) is held against implicit_gemm's result: their largest difference over the largest
magnitude (TF32 and bfloat16 roundings differ in their last bits; a pixel written wrong, or left unwritten, would be
of the values' own size).

    PYTHONPATH=. python benchmarks/probes/strided_1x1_channels_last.py --out DIR [--layers 3x3]

By default the 1x1 shortcuts, forward and backward-data; ``--layers 3x3`` the strided 3x3 layers' backward-data.
Writes DIR/strided-1x1.json and DIR/strided-1x1.md (DIR/strided-3x3.* with --layers 3x3).
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import layer_flops, start, timed, torch_call, write_report  # this folder's probe
from minidnn.primitives import _cuda, conv, convert, layout
from minidnn.primitives.conv import registry

# (name, N, C, H, W, K, R, S, stride, padding): the stride-2 1x1 shortcuts of ResNet-50 and ResNet-18 at batch 128.
LAYERS = [
    ("resnet50.layer2.downsample", 128, 256, 56, 56, 512, 1, 1, 2, 0),
    ("resnet50.layer3.downsample", 128, 512, 28, 28, 1024, 1, 1, 2, 0),
    ("resnet50.layer4.downsample", 128, 1024, 14, 14, 2048, 1, 1, 2, 0),
    ("resnet18.layer2.downsample", 128, 64, 56, 56, 128, 1, 1, 2, 0),
    ("resnet18.layer3.downsample", 128, 128, 28, 28, 256, 1, 1, 2, 0),
    ("resnet18.layer4.downsample", 128, 256, 14, 14, 512, 1, 1, 2, 0),
]
# The strided 3x3 layers (conv2 of each stage's first block), backward-data only: strided_dgrad's phases.
LAYERS_3X3 = [
    ("resnet50.layer2.conv2_3x3_stride2", 128, 128, 56, 56, 128, 3, 3, 2, 1),
    ("resnet50.layer3.conv2_3x3_stride2", 128, 256, 28, 28, 256, 3, 3, 2, 1),
    ("resnet50.layer4.conv2_3x3_stride2", 128, 512, 14, 14, 512, 3, 3, 2, 1),
    ("resnet18.layer2.conv1_3x3_stride2", 128, 64, 56, 56, 128, 3, 3, 2, 1),
    ("resnet18.layer3.conv1_3x3_stride2", 128, 128, 28, 28, 256, 3, 3, 2, 1),
    ("resnet18.layer4.conv1_3x3_stride2", 128, 256, 14, 14, 512, 3, 3, 2, 1),
]
DIRECTIONS = ("forward", "backward_data")
PRECISIONS = (("tf32", "float32"), ("bf16", "bfloat16"))


def operands(direction, layer, dtype_name, cupy, rng):
    """The direction's two operands, channels-last activations, and the shapes (x's, w's)."""
    _, N, C, H, W, K, R, S, stride, padding = layer
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    x_shape, w_shape = (N, C, H, W), (K, C, R, S)
    first_shape = x_shape if direction == "forward" else (N, K, P, Q)

    def operand(shape, scale=1.0):
        values = cupy.asarray((rng.standard_normal(shape) * scale).astype(np.float32))
        return values if dtype_name == "float32" else convert.float_to_half(values, dtype_name)

    return layout.to_channels_last(operand(first_shape)), operand(w_shape, 1 / np.sqrt(C * R * S)), \
        (x_shape, w_shape)


def call(direction, first, second, layer, shapes, algo):
    args = dict(stride=layer[8], padding=layer[9], algo=algo)
    if direction == "forward":
        return lambda: conv.conv2d_forward(first, second, **args)
    return lambda: conv.conv2d_backward_data(first, second, shapes[0], **args)


def as_float(array, dtype_name):
    array = layout.contiguous(array)
    return array if dtype_name == "float32" else convert.half_to_float(array, dtype_name)


def main() -> None:
    def layers_argument(parser):
        parser.add_argument("--layers", choices=("1x1", "3x3"), default="1x1")

    args, torch, cupy, rng = start(__doc__.splitlines()[0], layers_argument)
    os.makedirs(args.out, exist_ok=True)
    three = args.layers == "3x3"
    subject = "strided_dgrad" if three else "gemm_1x1"
    rows = []
    for layer in LAYERS_3X3 if three else LAYERS:
        for direction in ("backward_data",) if three else DIRECTIONS:
            for label, dtype_name in PRECISIONS:
                first, second, shapes = operands(direction, layer, dtype_name, cupy, rng)
                x_shape, w_shape = shapes
                problem = conv.problem.make_problem(x_shape, w_shape, (layer[8],) * 2, (layer[9],) * 2, (1, 1), 1,
                                                    first.dtype, "cuda").laid_out(True)
                row = {"layer": layer[0], "direction": direction, "precision": label, "gflop": layer_flops(layer) / 1e9,
                       "ms": {}}
                with _cuda.tf32(True):
                    for algorithm in registry.algorithms().values():
                        if algorithm.automatic and registry.supports(algorithm, problem, direction):
                            row["ms"][algorithm.name] = timed(call(direction, first, second, layer, shapes,
                                                                   algorithm.name), cupy)
                    got = as_float(call(direction, first, second, layer, shapes, subject)(), dtype_name)
                    want = as_float(call(direction, first, second, layer, shapes, "implicit_gemm")(), dtype_name)
                row["difference"] = float(cupy.abs(got - want).max() / cupy.abs(want).max())
                dtype = torch.float32 if dtype_name == "float32" else torch.bfloat16
                row["cudnn_channels_last"] = timed(torch_call(direction, layer, dtype, True, torch), cupy)
                rows.append(row)
                print(row, flush=True)
    names = sorted({name for row in rows for name in row["ms"]})
    lines = ["| layer | direction | precision | " + " | ".join(names) + f" | cuDNN channels_last | {subject} / cuDNN |"
             f" {subject} TFLOP/s | {subject} difference |",
             "|---" * (len(names) + 7) + "|"]
    for r in rows:
        times = " | ".join(f"{r['ms'][n]:.3f}" if n in r["ms"] else "-" for n in names)
        ours = r["ms"][subject]
        lines.append(f"| {r['layer']} | {r['direction']} | {r['precision']} | {times} | {r['cudnn_channels_last']:.3f}"
                     f" | {ours / r['cudnn_channels_last']:.2f} | {r['gflop'] / ours:.0f} | {r['difference']:.1e} |")
    title = "Strided 3x3 channels-last layers' backward-data" if three else "Strided 1x1 channels-last layers"
    markdown = (f"# {title}: every algorithm's whole call against cuDNN\n\n"
                "Milliseconds, median of 20 (CUDA events), batch 128.\n\n" + "\n".join(lines) + "\n")
    write_report(args.out, "strided-3x3" if three else "strided-1x1", rows, markdown, torch)
    print(markdown)


if __name__ == "__main__":
    main()
