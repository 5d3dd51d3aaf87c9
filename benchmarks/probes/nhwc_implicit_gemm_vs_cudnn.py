# Measures implicit_gemm_nhwc (channels-last copies, 16-byte cp.async, mma.sync bf16) against implicit_gemm's half build and cuDNN bf16, per layer and direction, and splits its time into the kernel and the layout copies: issue 24's ">= 0.8x cuDNN bf16 on each" and the rule that puts it first for half problems (selection.preference).
"""Each layer-direction timed in one process: minidnn in bfloat16 through ``conv2d_*`` with ``algo=`` forced
(``implicit_gemm``, ``implicit_gemm_nhwc``: the whole call, layout copies included), the NHWC kernel alone on
inputs already channels-last, and PyTorch's cuDNN in bfloat16 NCHW and channels_last (cudnn.benchmark on).
CUDA events around 20 calls after 3 warm-ups, median; TFLOP/s from 2·N·K·P·Q·C·R·S.

    PYTHONPATH=. python benchmarks/probes/nhwc_implicit_gemm_vs_cudnn.py --out DIR

Writes DIR/nhwc-conv.json and DIR/nhwc-conv.md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import DIRECTIONS, LAYERS, layer_flops, minidnn_call, start, timed, torch_call, write_report  # this folder's probe
from minidnn.primitives import conv, convert
from minidnn.primitives.conv import implicit_gemm_nhwc as nhwc

# ResNet-18's 3x3 layers at batch 128 beside ResNet-50's and CaffeNet's.
LAYERS = [("resnet18.layer1.conv", 128, 64, 56, 56, 64, 3, 3, 1, 1),
          ("resnet18.layer4.conv", 128, 512, 7, 7, 512, 3, 3, 1, 1)] + LAYERS


def kernel_only(direction, layer, cupy, rng, kernels=nhwc, tf32=False):
    """The NHWC kernel alone, on operands already in its layouts (what a channels-last tensor would skip): the
    ``_launch_forward`` and ``_launch_backward_filter`` of ``kernels`` (implicit_gemm_wgmma's, in its probe), on
    bfloat16 operands, or float32 ones with ``tf32`` (implicit_gemm_wgmma's TF32 build). The call's ``output`` is
    the array it writes; None where the kernels do not take the layer-direction."""
    _, N, C, H, W, K, R, S, stride, padding = layer
    value = np.dtype(np.float32 if tf32 else np.uint16)
    problem = conv.problem.make_problem((N, C, H, W), (K, C, R, S), (stride, stride), (padding, padding), (1, 1), 1,
                                        value, "cuda")
    if not (kernels.ImplicitGemmWgmma() if tf32 else nhwc.ImplicitGemmNhwc()).supports(problem, direction):
        return None

    def operand(shape):
        values = cupy.asarray(rng.standard_normal(shape).astype(np.float32))
        return values if tf32 else convert.float_to_half(values, "bfloat16")

    if direction == "backward_filter":
        x, dy = operand((N, H, W, C)), operand((N, problem.P, problem.Q, K))
        dw = cupy.zeros(problem.w_shape, np.float32)
        return _with_output(lambda: kernels._launch_backward_filter(x, dy, dw, problem), dw)
    shape = problem if direction == "forward" else nhwc.backward_data_problem(problem)
    source = operand((N, shape.H, shape.W, shape.C))
    weights = operand((shape.K, R, S, shape.C))
    out = cupy.empty((N, shape.K, shape.P, shape.Q), value)
    return _with_output(lambda: kernels._launch_forward(source, weights, out, nhwc._shape_struct(shape)), out)


def _with_output(call, output):
    call.output = output
    return call


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    rows = []
    with conv.settings(workspace_limit=1 << 30):  # the layout copies of the largest layers
        for layer in LAYERS:
            name = layer[0]
            flops = layer_flops(layer)
            for direction in DIRECTIONS:
                row = {"layer": name, "direction": direction, "gflop": flops / 1e9}
                row["implicit_gemm"] = timed(minidnn_call(direction, layer, "bfloat16", cupy, rng), cupy)
                call = minidnn_call(direction, layer, "bfloat16", cupy, rng, algo="implicit_gemm_nhwc")
                try:
                    call()
                    row["nhwc_call"] = timed(call, cupy)
                except ValueError:  # not supported (backward-data of a strided layer)
                    row["nhwc_call"] = None
                kernel = kernel_only(direction, layer, cupy, rng)
                row["nhwc_kernel"] = None if kernel is None else timed(kernel, cupy)
                for label, channels_last in (("cudnn_bf16_nchw", False), ("cudnn_bf16_nhwc", True)):
                    row[label] = timed(torch_call(direction, layer, torch.bfloat16, channels_last, torch), cupy)
                best = min(row["cudnn_bf16_nchw"], row["cudnn_bf16_nhwc"])
                for key in ("nhwc_call", "nhwc_kernel"):
                    row[f"{key}_over_cudnn"] = None if row[key] is None else row[key] / best
                    row[f"{key}_tflops"] = None if row[key] is None else flops / row[key] / 1e9
                rows.append(row)
                print(f"{name:26s} {direction:16s} implicit_gemm {row['implicit_gemm']:.3f}  nhwc call "
                      f"{row['nhwc_call'] or 0:.3f}  kernel {row['nhwc_kernel'] or 0:.3f} "
                      f"({row['nhwc_kernel_tflops'] or 0:.0f} TFLOP/s)  cuDNN best {best:.3f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    columns = ["implicit_gemm", "nhwc_call", "nhwc_kernel", "cudnn_bf16_nchw", "cudnn_bf16_nhwc",
               "nhwc_call_over_cudnn", "nhwc_kernel_over_cudnn", "nhwc_kernel_tflops"]
    lines = ["| layer | direction | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['direction']} | "
                     + " | ".join("-" if row[c] is None else f"{row[c]:.3f}" if c != "nhwc_kernel_tflops"
                                  else f"{row[c]:.0f}" for c in columns) + " |")
    write_report(args.out, "nhwc-conv", rows, "bfloat16, times in ms (median of 20, CUDA events); ratios over the "
                 "best cuDNN bf16 layout.\n\n" + "\n".join(lines) + "\n", torch)

if __name__ == "__main__":
    main()
