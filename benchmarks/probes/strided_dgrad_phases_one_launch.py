# Justifies strided_dgrad's channels-last phases on wgmma in one launch (implicit_gemm_wgmma.cu's phase kernel) and its
# sub-filters in one pass (strided_dgrad.cu), run against the tree before them (two launches a phase) by pointing
# PYTHONPATH at either tree; and, with --phases-tma, the phase kernel's TMA build (implicit_gemm_wgmma.PHASES_TMA).
"""The strided 3×3 backward-data layers of ResNet-18/50 at batch 128, channels-last, bfloat16 and float32 on TF32:
minidnn's ``strided_dgrad`` on wgmma on operands already channels-last (the filter's turned copies and the phases'
products), called eagerly and replayed from a CUDA graph (a captured step's way: no host time between launches),
beside it the filter turns alone (replayed); and cuDNN's backward-data in the same type and layout (PyTorch's
``aten.convolution_backward``, as autograd calls it; cudnn.benchmark on). CUDA events around 20 calls after 3
warm-ups, median.

    PYTHONPATH=<tree>:benchmarks/probes python benchmarks/probes/strided_dgrad_phases_one_launch.py --out DIR \
        [--phases-tma]

Writes DIR/strided-dgrad-phases.json and DIR/strided-dgrad-phases.md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import start, timed, torch_call, write_report  # this folder's probes
from half_strided_dgrad import LAYERS as HALF_STRIDED_LAYERS
from minidnn.primitives import _cuda, convert, layout
from minidnn.primitives.conv import implicit_gemm_wgmma, registry, strided_dgrad
from minidnn.primitives.conv.problem import ConvProblem

# (name, N, C, H, W, K, R, S, stride, padding): half_strided_dgrad's 3×3 layers, and ResNet-50's two deeper ones.
LAYERS = [layer for layer in HALF_STRIDED_LAYERS if layer[6] == 3] + [
    ("resnet50.layer3.0.conv2", 128, 256, 28, 28, 256, 3, 3, 2, 1),
    ("resnet50.layer4.0.conv2", 128, 512, 14, 14, 512, 3, 3, 2, 1),
]


def minidnn_call(layer, half, cupy, rng):
    """strided_dgrad's run on channels-last dy and dx, its workspace allocated once."""
    _, N, C, H, W, K, R, S, stride, padding = layer
    storage = np.float32 if half is None else convert.storage_dtype(half, cupy)
    problem = ConvProblem(N, C, H, W, K, R, S, (stride, stride), (padding, padding), (1, 1), 1, np.dtype(storage),
                          "cuda", True)
    assert strided_dgrad.on_wgmma(problem), layer[0]

    def operand(shape):
        values = cupy.asarray(rng.standard_normal(shape).astype(np.float32))
        return values if half is None else convert.float_to_half(values, half)

    dy, w = layout.to_channels_last(operand(problem.y_shape)), operand(problem.w_shape)
    dx = layout.empty(problem.x_shape, storage, cupy, True)
    algorithm = registry.get("strided_dgrad")
    workspace = cupy.empty(algorithm.workspace_bytes(problem, "backward_data"), np.uint8)
    return lambda: algorithm.run_in_layout("backward_data", dy, w, problem, dx, False, workspace), \
        turns_call(problem, w, cupy)


def turns_call(problem, w, cupy):
    """The filter's part alone: every phase's turned sub-filter, as the tree does it (``turn_phase_filters``' one
    pass, or before it one ``layout.filter_to_channels_last`` launch a phase)."""
    if hasattr(strided_dgrad, "turn_phase_filters"):
        filters = cupy.empty(strided_dgrad._placed_launches(problem)[1], w.dtype)
        return lambda: strided_dgrad.turn_phase_filters(w, filters, problem)
    (u, v), found = problem.stride, strided_dgrad.phases(problem)
    outs = [cupy.empty((problem.C, phase.R, phase.S, problem.K), w.dtype) for _, _, phase, _, _ in found]

    def call():
        for (a, b, _, _, _), out in zip(found, outs):
            layout.filter_to_channels_last(w[:, :, a::u, b::v], out, True, 1)
    return call


def replayed(call, cupy):
    """The median ms of ``call`` captured once into a CUDA graph and launched from it."""
    call()  # compiled and warm before the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        call()
        graph = stream.end_capture()
        return timed(lambda: graph.launch(stream), cupy)


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0], extra=_options)
    if args.phases_tma:
        implicit_gemm_wgmma.PHASES_TMA = {128: True, 64: True}
    rows = []
    for precision in ("bf16", "tf32"):
        half = "bfloat16" if precision == "bf16" else None
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = half is None
        _cuda.set_allow_tf32(half is None)
        for layer in LAYERS:
            row = {"layer": layer[0], "precision": precision}
            whole, turns = minidnn_call(layer, half, cupy, rng)
            row["eager"], row["minidnn"] = timed(whole, cupy), replayed(whole, cupy)
            row["turns"] = replayed(turns, cupy)
            row["cudnn"] = timed(torch_call("backward_data", layer, torch.float32 if half is None else torch.bfloat16,
                                            True, torch), cupy)
            row["speed_over_cudnn"] = row["cudnn"] / row["minidnn"]
            rows.append(row)
            print(f"{precision} {layer[0]:26s} eager {row['eager']:.3f} ms, replayed {row['minidnn']:.3f} ms (turns "
                  f"{row['turns']:.3f}), cuDNN {row['cudnn']:.3f} ms: {row['speed_over_cudnn']:.2f}x cuDNN's speed",
                  flush=True)
    os.makedirs(args.out, exist_ok=True)
    lines = ["| precision | layer | minidnn eager ms | minidnn replayed ms | its filter turns alone ms | cuDNN ms | "
             "minidnn's speed (replayed) / cuDNN's |", "|---" * 7 + "|"]
    lines += [f"| {r['precision']} | {r['layer']} | {r['eager']:.3f} | {r['minidnn']:.3f} | {r['turns']:.3f} | "
              f"{r['cudnn']:.3f} | {r['speed_over_cudnn']:.2f} |" for r in rows]
    write_report(args.out, "strided-dgrad-phases", rows, "Channels-last backward-data of the strided 3×3 layers, batch "
                 "128; median of 20 (CUDA events).\n\n" + "\n".join(lines) + "\n", torch)


def _options(parser) -> None:
    parser.add_argument("--phases-tma", action="store_true",
                        help="the phase kernel's TMA build at both widths (implicit_gemm_wgmma.PHASES_TMA)")


if __name__ == "__main__":
    main()
