# Justifies running CaffeNet's grouped layers (conv2, conv4, conv5: groups 2) on the channels-last kernels: each algorithm's whole bf16 call against implicit_gemm's and cuDNN's, per direction, and the agreement of their results.
"""Each layer-direction timed in one process, bfloat16, batch 256: minidnn's whole call (``conv2d_*`` with
``algo=`` forced) on ``implicit_gemm`` (the grouped layers' path before), ``implicit_gemm_nhwc`` and
``implicit_gemm_wgmma``, the last also on channels-last operands (no layout copies); PyTorch's cuDNN in bf16, NCHW
and channels_last, cudnn.benchmark on. CUDA events around 20 calls after 3 warm-ups, median; TFLOP/s from
2·N·K·P·Q·(C/G)·R·S. Each minidnn result is held against implicit_gemm's: the largest difference over the largest
magnitude, which a rounding or two of bf16 bounds (a wrong group's channels would be of the values' own size).

    PYTHONPATH=. python benchmarks/probes/grouped_half_convolution.py --out DIR

Writes DIR/grouped-conv.json and DIR/grouped-conv.md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import DIRECTIONS, against_cudnn, start, timed, write_report  # this folder's probe
from minidnn.primitives import conv, convert, layout

# (name, N, C, H, W, K, R, S, stride, padding, groups): CaffeNet's grouped layers at batch 256.
LAYERS = [("caffenet.conv2", 256, 96, 27, 27, 256, 5, 5, 1, 2, 2),
          ("caffenet.conv4", 256, 384, 13, 13, 384, 3, 3, 1, 1, 2),
          ("caffenet.conv5", 256, 384, 13, 13, 256, 3, 3, 1, 1, 2)]
ALGORITHMS = ("implicit_gemm", "implicit_gemm_nhwc", "implicit_gemm_wgmma")


def operands(direction, layer, cupy, rng):
    """The direction's two bf16 operands (NCHW) and the call's arguments."""
    _, N, C, H, W, K, R, S, stride, padding, groups = layer
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    x_shape, w_shape, y_shape = (N, C, H, W), (K, C // groups, R, S), (N, K, P, Q)
    shapes = {"forward": (x_shape, w_shape), "backward_data": (y_shape, w_shape),
              "backward_filter": (x_shape, y_shape)}[direction]
    first, second = (convert.float_to_half(cupy.asarray(rng.standard_normal(s).astype(np.float32)), "bfloat16")
                     for s in shapes)
    return first, second, dict(stride=stride, padding=padding, groups=groups), x_shape, w_shape


def minidnn_call(direction, first, second, args, x_shape, w_shape, algo):
    if direction == "forward":
        return lambda: conv.conv2d_forward(first, second, algo=algo, **args)
    if direction == "backward_data":
        return lambda: conv.conv2d_backward_data(first, second, x_shape, algo=algo, **args)
    return lambda: conv.conv2d_backward_filter(first, second, w_shape, algo=algo, dtype=np.float32, **args)


def torch_call(direction, layer, channels_last, torch):
    _, N, C, H, W, K, R, S, stride, padding, groups = layer
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(N, C, H, W, device="cuda", dtype=torch.bfloat16).to(memory_format=fmt)
    w = torch.randn(K, C // groups, R, S, device="cuda", dtype=torch.bfloat16).to(memory_format=fmt)
    dy = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding, groups=groups).to(memory_format=fmt)
    if direction == "forward":
        return lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=padding, groups=groups)
    mask = [direction == "backward_data", direction == "backward_filter", False]
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1], False,
                                                       [0, 0], groups, mask)


def as_float(array, cupy):
    return cupy.asnumpy(array if array.dtype == np.float32 else convert.half_to_float(layout.contiguous(array),
                                                                                       "bfloat16"))


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    rows = []
    with conv.settings(workspace_limit=1 << 30):
        for layer in LAYERS:
            name, N, C, H, W, K, R, S, stride, padding, groups = layer
            P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
            flops = 2 * N * K * P * Q * (C // groups) * R * S
            for direction in DIRECTIONS:
                row = {"layer": name, "direction": direction, "gflop": flops / 1e9}
                first, second, call_args, x_shape, w_shape = operands(direction, layer, cupy, rng)
                reference = None
                for algo in ALGORITHMS:
                    call = minidnn_call(direction, first, second, call_args, x_shape, w_shape, algo)
                    result = as_float(call(), cupy)
                    reference = result if reference is None else reference
                    row[f"{algo}_difference"] = float(np.abs(result - reference).max() / np.abs(reference).max())
                    row[algo] = timed(call, cupy)
                last = [layout.to_channels_last(a) for a in (first, second)]  # read as they are
                row["wgmma_channels_last"] = timed(minidnn_call(direction, *last, call_args, x_shape, w_shape,
                                                                "implicit_gemm_wgmma"), cupy)
                against_cudnn(row, lambda last: torch_call(direction, layer, last, torch),
                              ("implicit_gemm", "implicit_gemm_nhwc", "implicit_gemm_wgmma", "wgmma_channels_last"),
                              cupy)
                row["wgmma_channels_last_tflops"] = flops / row["wgmma_channels_last"] / 1e9
                rows.append(row)
                print(f"{name:15s} {direction:16s} " + "  ".join(
                    f"{k} {row[k]:.3f}" for k in ("implicit_gemm", "implicit_gemm_nhwc", "implicit_gemm_wgmma",
                                                  "wgmma_channels_last", "cudnn_nchw", "cudnn_channels_last"))
                    + f"  differences {row['implicit_gemm_nhwc_difference']:.1e} "
                      f"{row['implicit_gemm_wgmma_difference']:.1e}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    columns = ["implicit_gemm", "implicit_gemm_nhwc", "implicit_gemm_wgmma", "wgmma_channels_last", "cudnn_nchw",
               "cudnn_channels_last", "implicit_gemm_over_cudnn", "implicit_gemm_wgmma_over_cudnn",
               "wgmma_channels_last_over_cudnn", "implicit_gemm_nhwc_difference", "implicit_gemm_wgmma_difference"]
    lines = ["| layer | direction | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['direction']} | "
                     + " | ".join(f"{row[c]:.1e}" if c.endswith("difference") else f"{row[c]:.3f}" for c in columns)
                     + " |")
    write_report(args.out, "grouped-conv", rows, "bfloat16, batch 256, times in ms (median of 20, CUDA events); "
                 "ratios over the faster cuDNN layout; differences: the largest against implicit_gemm's result over "
                 "its largest magnitude.\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
