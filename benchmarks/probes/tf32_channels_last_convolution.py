# Justifies implicit_gemm_wgmma's TF32 build (float32, all three directions, on channels-last operands): its whole calls on ResNet's layers against find's choice before it, implicit_gemm's, and cuDNN's TF32.
"""Each layer-direction timed in one process, float32 with TF32 allowed, batch 128: minidnn's whole call on
``implicit_gemm`` (NCHW operands), on ``implicit_gemm_wgmma`` (channels-last operands, read as they are: no layout
copies), and ``algo="auto"`` with ``find`` (benchmark on, the default 64 MiB workspace) on channels-last operands
with the TF32 build excluded and included: the choice a channels-last TF32 step had before and has now. Beside them
PyTorch's cuDNN in TF32, NCHW and channels_last, cudnn.benchmark on. CUDA events around 20 calls after 3 warm-ups,
median; TFLOP/s from 2·N·K·P·Q·C·R·S. The wgmma result is held against ``implicit_gemm``'s TF32 result: their
largest difference over the largest magnitude (operands cut and rounded to TF32 differ by a few units of 2^-11; a
wrong tap would be of the values' own size). find's disk cache is off, so each choice is measured here.

    PYTHONPATH=. python benchmarks/probes/tf32_channels_last_convolution.py --out DIR [--layers NAME,...]

``--layers`` times only the layers whose names hold one of the given parts (the first layer: ``conv1_7x7``, whose
3 channels the wgmma kernels take padded to 4).

Writes DIR/tf32-conv.json and DIR/tf32-conv.md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import against_cudnn, layer_flops, start, timed, write_report  # this folder's probe
from minidnn.primitives import _cuda, conv, layout
from minidnn.primitives.conv import registry

# (name, N, C, H, W, K, R, S, stride, padding): ResNet-18's and ResNet-50's layers at batch 128 (224 x 224 input).
LAYERS = [
    ("resnet18.layer1.conv", 128, 64, 56, 56, 64, 3, 3, 1, 1),
    ("resnet18.layer2.conv1_stride2", 128, 64, 56, 56, 128, 3, 3, 2, 1),
    ("resnet18.layer2.conv2", 128, 128, 28, 28, 128, 3, 3, 1, 1),
    ("resnet18.layer2.downsample_1x1", 128, 64, 56, 56, 128, 1, 1, 2, 0),
    ("resnet18.layer3.conv2", 128, 256, 14, 14, 256, 3, 3, 1, 1),
    ("resnet18.layer4.conv2", 128, 512, 7, 7, 512, 3, 3, 1, 1),
    ("resnet50.layer1.conv1_1x1", 128, 64, 56, 56, 64, 1, 1, 1, 0),
    ("resnet50.layer1.conv3_1x1", 128, 64, 56, 56, 256, 1, 1, 1, 0),
    ("resnet50.layer3.conv3_1x1", 128, 256, 14, 14, 1024, 1, 1, 1, 0),
    ("resnet.conv1_7x7_stride2", 128, 3, 224, 224, 64, 7, 7, 2, 3),
]
DIRECTIONS = ("forward", "backward_data", "backward_filter")
WGMMA = "implicit_gemm_wgmma"


def operands(direction, layer, cupy, rng):
    _, N, C, H, W, K, R, S, stride, padding = layer
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    x_shape, w_shape, y_shape = (N, C, H, W), (K, C, R, S), (N, K, P, Q)
    first_shape = x_shape if direction != "backward_data" else y_shape
    second_shape = y_shape if direction == "backward_filter" else w_shape
    first = cupy.asarray(rng.standard_normal(first_shape).astype(np.float32))
    second = cupy.asarray((rng.standard_normal(second_shape) / np.sqrt(C * R * S)).astype(np.float32))
    return first, second, dict(stride=stride, padding=padding), x_shape, w_shape


def minidnn_call(direction, first, second, args, shapes, algo):
    """``shapes``: (x's, w's)."""
    if direction == "forward":
        return lambda: conv.conv2d_forward(first, second, algo=algo, **args)
    if direction == "backward_filter":
        return lambda: conv.conv2d_backward_filter(first, second, shapes[1], algo=algo, **args)
    return lambda: conv.conv2d_backward_data(first, second, shapes[0], algo=algo, **args)


def torch_call(direction, layer, channels_last, torch):
    _, N, C, H, W, K, R, S, stride, padding = layer
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(N, C, H, W, device="cuda").to(memory_format=fmt)
    w = torch.randn(K, C, R, S, device="cuda").to(memory_format=fmt)
    dy = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding).to(memory_format=fmt)
    if direction == "forward":
        return lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=padding)
    mask = [direction == "backward_data", direction == "backward_filter", False]
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1], False,
                                                       [0, 0], 1, mask)


def found(direction, first, second, args, shapes, cupy, without_wgmma):
    """find's choice on channels-last operands, timed; the TF32 build withheld when ``without_wgmma``."""
    algorithms = registry._algorithms
    withheld = algorithms.pop(WGMMA) if without_wgmma else None
    registry.clear_caches()
    try:
        with conv.settings(algo="auto", benchmark=True):
            call = minidnn_call(direction, first, second, args, shapes, "auto")
            call()
            plan = conv.api._plans[next(reversed(conv.api._plans))]
            chosen = "+".join(algorithm.name for _, algorithm in plan.segments)
            return timed(call, cupy), chosen
    finally:
        if withheld is not None:
            algorithms[WGMMA] = withheld
        registry.clear_caches()


def main() -> None:
    os.environ["MINIDNN_CACHE_DIR"] = ""  # no disk cache: the choice without the TF32 build must not be kept
    args, torch, cupy, rng = start(__doc__.splitlines()[0], lambda parser: parser.add_argument(
        "--layers", default="", help="comma-separated parts of layer names to time (default: every layer)"))
    parts = [part for part in args.layers.split(",") if part]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    _cuda.set_allow_tf32(True)
    rows = []
    for layer in LAYERS:
        name, stride = layer[0], layer[8]
        if parts and not any(part in name for part in parts):
            continue
        flops = layer_flops(layer)
        for direction in DIRECTIONS:
            if direction == "backward_data" and stride != 1:
                continue  # the TF32 build's backward-data is stride 1
            row = {"layer": name, "direction": direction, "gflop": flops / 1e9}
            first, second, call_args, *shapes = operands(direction, layer, cupy, rng)
            last = [layout.to_channels_last(a) for a in (first, second)]
            plain = minidnn_call(direction, first, second, call_args, shapes, "implicit_gemm")
            wgmma = minidnn_call(direction, *last, call_args, shapes, WGMMA)
            expected, got = cupy.asnumpy(plain()), cupy.asnumpy(layout.contiguous(wgmma()))
            row["wgmma_difference"] = float(np.abs(got - expected).max() / np.abs(expected).max())
            row["implicit_gemm"] = timed(plain, cupy)
            row["wgmma_channels_last"] = timed(wgmma, cupy)
            row["find_before"], row["find_before_choice"] = found(direction, *last, call_args, shapes, cupy, True)
            row["find_now"], row["find_now_choice"] = found(direction, *last, call_args, shapes, cupy, False)
            against_cudnn(row, lambda last: torch_call(direction, layer, last, torch),
                          ("implicit_gemm", "wgmma_channels_last", "find_before", "find_now"), cupy)
            row["wgmma_tflops"] = flops / row["wgmma_channels_last"] / 1e9
            rows.append(row)
            print(f"{name:32s} {direction:14s} " + "  ".join(
                f"{k} {row[k]:.3f}" for k in ("implicit_gemm", "wgmma_channels_last", "find_before", "find_now",
                                              "cudnn_nchw", "cudnn_channels_last"))
                + f"  ({row['find_before_choice']} -> {row['find_now_choice']})"
                + f"  difference {row['wgmma_difference']:.1e}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    columns = ["implicit_gemm", "wgmma_channels_last", "find_before", "find_now", "cudnn_nchw",
               "cudnn_channels_last", "wgmma_channels_last_over_cudnn", "find_before_over_cudnn",
               "find_now_over_cudnn", "wgmma_tflops"]
    lines = ["| layer | direction | " + " | ".join(columns) + " | find: before -> now | difference |",
             "|---" * (len(columns) + 4) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['direction']} | " + " | ".join(f"{row[c]:.3f}" for c in columns)
                     + f" | {row['find_before_choice']} -> {row['find_now_choice']} | {row['wgmma_difference']:.1e} |")
    write_report(args.out, "tf32-conv", rows, "float32 with TF32 allowed, batch 128, times in ms (median of 20, CUDA "
                 "events); ratios over the faster cuDNN layout; find: algo='auto' with benchmark on, channels-last "
                 "operands, the TF32 build withheld (before) and offered (now); difference: wgmma's result against "
                 "implicit_gemm's TF32 result, the largest difference over the largest magnitude.\n\n"
                 + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
