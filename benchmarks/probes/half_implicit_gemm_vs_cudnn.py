# Measures the half build of implicit GEMM (mma.sync m16n8k16, bf16/fp16) against cuDNN per layer and direction, for issue 24's ">= 0.8x cuDNN bf16 on each" (docs/convolution.md, Half precision, Measured).
"""Each layer-direction timed in one process: minidnn's implicit GEMM in bfloat16 and float16 and in float32 (TF32
on and off), PyTorch's cuDNN in bfloat16 (NCHW and channels_last, cudnn.benchmark on) and in TF32. CUDA events
around 20 calls after 3 warm-ups, median; TFLOP/s from the direction's 2·N·K·P·Q·C/G·R·S.

    PYTHONPATH=. python benchmarks/probes/half_implicit_gemm_vs_cudnn.py --out DIR

Writes DIR/half-conv.json and DIR/half-conv.md.
"""
import argparse
import json
import os
import statistics
import tempfile
from typing import Any

import numpy as np

from minidnn import backend
from minidnn.primitives import _cuda, conv, convert

# (name, N, C, H, W, K, R, S, stride, padding): ResNet-50's 3x3 layers of layer1-3 and a 1x1, CaffeNet's conv2/conv3.
LAYERS = [
    ("resnet50.layer1.conv2", 128, 64, 56, 56, 64, 3, 3, 1, 1),
    ("resnet50.layer2.conv2", 128, 128, 28, 28, 128, 3, 3, 1, 1),
    ("resnet50.layer3.conv2", 128, 256, 14, 14, 256, 3, 3, 1, 1),
    ("resnet50.layer3.conv3_1x1", 128, 256, 14, 14, 1024, 1, 1, 1, 0),
    ("caffenet.conv2", 256, 96, 27, 27, 256, 5, 5, 1, 2),
    ("caffenet.conv3", 256, 256, 13, 13, 384, 3, 3, 1, 1),
]
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def timed(call, cupy, repeats=20, warmup=3, calls=1):
    """The median over ``repeats`` of the ms between CUDA events around ``calls`` calls in a row, per call (with
    several, the launches queue behind each other and no host gap between them counts)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(calls):
            call()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / calls)
    return statistics.median(times)


def layer_flops(layer) -> int:
    """One direction's 2·N·K·P·Q·C·R·S of a (name, N, C, H, W, K, R, S, stride, padding) layer (all three cost the
    same)."""
    _, N, C, H, W, K, R, S, stride, padding = layer
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    return 2 * N * K * P * Q * C * R * S


def minidnn_call(direction, layer, dtype_name, cupy, rng, algo="implicit_gemm"):
    _, N, C, H, W, K, R, S, stride, padding = layer
    x_shape, w_shape = (N, C, H, W), (K, C, R, S)
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    shapes = {"forward": (x_shape, w_shape), "backward_data": ((N, K, P, Q), w_shape),
              "backward_filter": (x_shape, (N, K, P, Q))}[direction]

    def operand(shape):
        values = cupy.asarray(rng.standard_normal(shape).astype(np.float32))
        return values if dtype_name == "float32" else convert.float_to_half(values, dtype_name)

    first, second = (operand(s) for s in shapes)
    args = dict(stride=stride, padding=padding, algo=algo)
    if direction == "forward":
        return lambda: conv.conv2d_forward(first, second, **args)
    if direction == "backward_data":
        return lambda: conv.conv2d_backward_data(first, second, x_shape, **args)
    return lambda: conv.conv2d_backward_filter(first, second, w_shape, **args)


def torch_call(direction, layer, dtype, channels_last, torch):
    _, N, C, H, W, K, R, S, stride, padding = layer
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(N, C, H, W, device="cuda", dtype=dtype).to(memory_format=fmt)
    w = torch.randn(K, C, R, S, device="cuda", dtype=dtype).to(memory_format=fmt)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding)
    dy = torch.randn_like(y).to(memory_format=fmt)
    if direction == "forward":
        return lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=padding)
    if direction == "backward_data":
        return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1], False,
                                                           [0, 0], 1, [True, False, False])
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1], False,
                                                       [0, 0], 1, [False, True, False])


def against_cudnn(row: dict, cudnn_call: Any, keys: tuple, cupy: Any) -> None:
    """Time cuDNN's call in both layouts into ``row`` (``cudnn_call(channels_last)`` gives the call), then each of
    ``keys``' time over the faster of them as ``row[key + "_over_cudnn"]``."""
    for label, channels_last in (("cudnn_nchw", False), ("cudnn_channels_last", True)):
        row[label] = timed(cudnn_call(channels_last), cupy)
    best = min(row["cudnn_nchw"], row["cudnn_channels_last"])
    for key in keys:
        row[f"{key}_over_cudnn"] = row[key] / best


def start(description: str, extra: Any = None) -> tuple[argparse.Namespace, Any, Any, np.random.Generator]:
    """What every per-layer probe of this folder opens with: its --out argument (and those ``extra(parser)``
    adds), PyTorch (cudnn.benchmark on), CuPy and a seeded generator."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True)
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    import torch  # noqa: PLC0415 - the reference only

    cupy = backend.cupy()
    torch.backends.cudnn.benchmark = True
    return args, torch, cupy, np.random.default_rng(0)


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    rows = []
    for layer in LAYERS:
        name = layer[0]
        flops = layer_flops(layer)
        for direction in DIRECTIONS:
            row = {"layer": name, "direction": direction, "gflop": flops / 1e9}
            for label, dtype_name, tf32 in (("minidnn_bf16", "bfloat16", False), ("minidnn_fp16", "float16", False),
                                            ("minidnn_tf32", "float32", True), ("minidnn_fp32", "float32", False)):
                with _cuda.tf32(tf32):
                    row[label] = timed(minidnn_call(direction, layer, dtype_name, cupy, rng), cupy)
            for label, dtype, channels_last, tf32 in (("cudnn_bf16_nchw", torch.bfloat16, False, False),
                                                      ("cudnn_bf16_nhwc", torch.bfloat16, True, False),
                                                      ("cudnn_tf32_nchw", torch.float32, False, True)):
                torch.backends.cudnn.allow_tf32 = tf32
                row[label] = timed(torch_call(direction, layer, dtype, channels_last, torch), cupy)  # one device, one stream
            best_cudnn = min(row["cudnn_bf16_nchw"], row["cudnn_bf16_nhwc"])
            row["bf16_over_best_cudnn_bf16"] = row["minidnn_bf16"] / best_cudnn
            row["bf16_tflops"] = flops / row["minidnn_bf16"] / 1e9
            rows.append(row)
            print(f"{name:28s} {direction:16s} bf16 {row['minidnn_bf16']:.3f} ms ({row['bf16_tflops']:.0f} TFLOP/s)  "
                  f"cuDNN bf16 {best_cudnn:.3f}  ratio {row['bf16_over_best_cudnn_bf16']:.2f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    columns = ["minidnn_bf16", "minidnn_fp16", "minidnn_tf32", "minidnn_fp32", "cudnn_bf16_nchw", "cudnn_bf16_nhwc",
               "cudnn_tf32_nchw"]
    lines = ["| layer | direction | " + " | ".join(columns) + " | bf16 / best cuDNN bf16 | bf16 TFLOP/s |",
             "|---" * (len(columns) + 4) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['direction']} | " + " | ".join(f"{row[c]:.3f}" for c in columns)
                     + f" | {row['bf16_over_best_cudnn_bf16']:.2f} | {row['bf16_tflops']:.0f} |")
    write_report(args.out, "half-conv", rows, "Times in ms (median of 20, CUDA events).\n\n" + "\n".join(lines) + "\n",
                 torch)


# The per-layer probes' rows of a layer's two directions against PyTorch's and the memory time (ms).
LAYER_COLUMNS = ["forward", "torch_forward", "forward_memory", "backward", "torch_backward", "backward_memory"]


def keep_faster(best: dict, times: dict) -> None:
    """Each ``best[key]`` (None at first) becomes the smaller of itself and ``times[key]``: PyTorch's faster layout."""
    for key, value in times.items():
        best[key] = value if best[key] is None else min(best[key], value)


def print_row(row: dict) -> None:
    print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)


def layer_table(rows: list) -> list[str]:
    """Markdown lines of ``rows`` (each with its layer, dtype and LAYER_COLUMNS)."""
    lines = ["| layer | dtype | " + " | ".join(LAYER_COLUMNS) + " |", "|---" * (len(LAYER_COLUMNS) + 2) + "|"]
    return lines + [f"| {r['layer']} | {r['dtype']} | " + " | ".join(f"{r[c]:.4g}" for c in LAYER_COLUMNS) + " |"
                    for r in rows]


def write_report(out: str, stem: str, rows: list, markdown: str, torch) -> None:
    """DIR/stem.json (the rows, with torch's, cuDNN's and the GPU's names) and DIR/stem.md, each written whole
    (temporary file, then rename)."""
    data = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
            "rows": rows}
    for name, text in ((f"{stem}.json", json.dumps(data, indent=1)), (f"{stem}.md", markdown)):
        with tempfile.NamedTemporaryFile("w", dir=out, delete=False) as file:
            file.write(text)
        os.replace(file.name, os.path.join(out, name))


if __name__ == "__main__":
    main()
