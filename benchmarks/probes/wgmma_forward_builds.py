# Justifies implicit_gemm_wgmma.cu's FORWARD_CTAS_PER_SM (three CTAs an SM for a 64-wide tile) and implicit_gemm_wgmma.FORWARD_PRODUCER, FORWARD_TMA, FILTER_TMA and SPLIT_K_WITHIN_WAVES (which pipeline and copies the forward and backward-filter kernels run, and how backward-filter splits its pixels), and measures other builds and tile widths of its forward kernel (forward and stride-1 backward-data), per layer against cuDNN channels_last; and, with --directions backward_filter, its backward-filter's builds and tile widths.
"""Each layer-direction in one process, float32 on the TF32 build and bfloat16: the wgmma kernel alone on
operands already channels-last (nhwc_implicit_gemm_vs_cudnn.kernel_only), once per variant, and PyTorch's cuDNN
on channels_last tensors (cudnn.benchmark on). CUDA events around 10 calls in a row (the launches queue behind each
other, so no host gap counts), after 3 warm-ups; the median of 7 such groups, per call. A variant is
``NAME=MACRO:VALUE,...`` (``base`` takes the tree's builds as they are); its defines are added to every build of
implicit_gemm_wgmma.cu, except FORWARD_CTAS_PER_SM, added only to 64-wide tiles (a 128-wide tile's three stages
leave room for two CTAs an SM whatever the launch bounds say). TILE_WIDTH is not a macro: it sets the forward
kernel's tile width (implicit_gemm_wgmma.tile_width), whose builds then take the variant's FORWARD_CTAS_PER_SM;
FILTER_WIDTH, likewise, the backward-filter's (128 or 256 for the TF32 build of more than 128 filters).
PRODUCER_STAGES, PRODUCER_IN_FLIGHT (0 unless given) and PRODUCER_WARPGROUPS (1 unless given) run the forward
kernel's PRODUCER build at both widths (implicit_gemm_wgmma.FORWARD_PRODUCER: producer warpgroups, mbarriers, one
persistent CTA an SM). TMA:1 (or 0) runs the forward kernel's TMA build at both widths, where the problem fits
(implicit_gemm_wgmma.FORWARD_TMA: each stage copied by the bulk tensor copy engine; with PRODUCER_STAGES, in the
PRODUCER build, the producer warpgroup's first thread issuing the copies). FILTER_TMA:1 (or 0) runs the half
backward-filter's TMA build at both widths, where the problem fits (implicit_gemm_wgmma.FILTER_TMA);
SPLIT_WITHIN_WAVES:1 rounds backward-filter's split down to the waves it aims at
(implicit_gemm_wgmma.SPLIT_K_WITHIN_WAVES), and SPLIT_WAVES sets those waves (SPLIT_K_WAVES). PIPELINE_STAGES and
PIPELINE_IN_FLIGHT (0 unless given) set implicit_gemm_wgmma.PIPELINES at both widths: every kernel's stages and
product groups in flight, and the shared memory its launch asks. Each
variant's output is held against the first variant's: the largest difference over the largest magnitude (the same
sums in the same order: 0).

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/wgmma_forward_builds.py --out DIR \
        --variants base two=FORWARD_CTAS_PER_SM:2 narrow=TILE_WIDTH:64 producer=PRODUCER_STAGES:4,PRODUCER_IN_FLIGHT:1 \
        [--dtypes float32,bfloat16] [--layers PART,...]
    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/wgmma_forward_builds.py --out DIR --dtypes bfloat16 \
        --directions backward_filter --variants gather=FILTER_TMA:0 tma=FILTER_TMA:1 within=SPLIT_WITHIN_WAVES:1

Writes DIR/wgmma-forward-builds.json and DIR/wgmma-forward-builds.md.
"""
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import layer_flops, start, timed, torch_call, write_report  # this folder's probes
from nhwc_implicit_gemm_vs_cudnn import kernel_only
from minidnn.primitives import _cuda, convert
from minidnn.primitives.conv import implicit_gemm_wgmma as wgmma

# (name, N, C, H, W, K, R, S, stride, padding): ResNet-18's and ResNet-50's 3x3 layers at batch 128 (the strided ones
# forward only: their backward-data is strided_dgrad's), and CaffeNet's conv3 at batch 256.
LAYERS = [("resnet18.layer1", 128, 64, 56, 56, 64, 3, 3, 1, 1),
          ("resnet18.layer2", 128, 128, 28, 28, 128, 3, 3, 1, 1),
          ("resnet18.layer3", 128, 256, 14, 14, 256, 3, 3, 1, 1),
          ("resnet18.layer4", 128, 512, 7, 7, 512, 3, 3, 1, 1),
          ("resnet50.layer1.conv2", 128, 64, 56, 56, 64, 3, 3, 1, 1),
          ("resnet50.layer2.conv2", 128, 128, 28, 28, 128, 3, 3, 1, 1),
          ("resnet50.layer3.conv2", 128, 256, 14, 14, 256, 3, 3, 1, 1),
          ("resnet18.layer2.stride2", 128, 64, 56, 56, 128, 3, 3, 2, 1),
          ("resnet18.layer3.stride2", 128, 128, 28, 28, 256, 3, 3, 2, 1),
          ("resnet18.layer4.stride2", 128, 256, 14, 14, 512, 3, 3, 2, 1),
          ("caffenet.conv3", 256, 256, 13, 13, 384, 3, 3, 1, 1)]
DIRECTIONS = ("forward", "backward_data")
# A variant's entries that are Python settings, not macros.
SETTINGS = ("TILE_WIDTH", "FILTER_WIDTH", "PRODUCER_STAGES", "PRODUCER_IN_FLIGHT", "PRODUCER_WARPGROUPS", "TMA",
            "FILTER_TMA", "SPLIT_WITHIN_WAVES", "SPLIT_WAVES", "PIPELINE_STAGES", "PIPELINE_IN_FLIGHT")


def per_call_ms(call, cupy):
    """Seven groups of ten calls in a row, after three warm-ups: the median group's time per call."""
    return timed(call, cupy, repeats=7, calls=10)


def parse_variant(text):
    name, _, rest = text.partition("=")
    return name, tuple((macro, int(value)) for macro, value in (item.split(":") for item in rest.split(",") if item))


def main() -> None:
    args, torch, cupy, _ = start(__doc__.splitlines()[0], extra=_options)
    variants = [parse_variant(text) for text in args.variants]
    parts = [part for part in args.layers.split(",") if part]
    original = _cuda.function
    extra = ()

    def function(relative, name, dtype, defines=()):
        if relative == wgmma.SOURCE:
            block_n = dict(defines).get("BLOCK_N")
            defines = tuple(defines) + tuple(d for d in extra if d[0] not in SETTINGS
                                             and (d[0] != "FORWARD_CTAS_PER_SM" or block_n == 64))
        return original(relative, name, dtype, defines)

    original_width = wgmma.tile_width
    original_producer = wgmma.FORWARD_PRODUCER
    original_tma = wgmma.FORWARD_TMA
    original_filter_tma = wgmma.FILTER_TMA
    original_within = wgmma.SPLIT_K_WITHIN_WAVES
    original_waves = wgmma.SPLIT_K_WAVES
    original_pipelines = wgmma.PIPELINES

    def tile_width(columns, kernel):
        width = dict(extra).get("TILE_WIDTH" if kernel == "forward" else "FILTER_WIDTH")
        return width or original_width(columns, kernel)

    _cuda.function = function
    wgmma.tile_width = tile_width
    rows = []
    for dtype_name in args.dtypes.split(","):
        tf32 = dtype_name == "float32"
        _cuda.set_allow_tf32(tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        for layer in LAYERS:
            if parts and not any(part in layer[0] for part in parts):
                continue
            flops = layer_flops(layer)
            for direction in args.directions.split(","):
                row = {"layer": layer[0], "dtype": dtype_name, "direction": direction}
                first = None
                for name, defines in variants:
                    extra = defines
                    settings = dict(defines)
                    if "PRODUCER_STAGES" in settings:
                        pipeline = (settings["PRODUCER_STAGES"], settings.get("PRODUCER_IN_FLIGHT", 0),
                                    settings.get("PRODUCER_WARPGROUPS", 1))
                        wgmma.FORWARD_PRODUCER = {128: pipeline, 64: pipeline, 256: None}
                    else:
                        wgmma.FORWARD_PRODUCER = original_producer
                    wgmma.FORWARD_TMA = ({128: bool(settings["TMA"]), 64: bool(settings["TMA"]), 256: False}
                                         if "TMA" in settings else original_tma)
                    wgmma.FILTER_TMA = ({128: bool(settings["FILTER_TMA"]), 64: bool(settings["FILTER_TMA"])}
                                        if "FILTER_TMA" in settings else original_filter_tma)
                    wgmma.SPLIT_K_WITHIN_WAVES = bool(settings.get("SPLIT_WITHIN_WAVES", original_within))
                    wgmma.SPLIT_K_WAVES = settings.get("SPLIT_WAVES", original_waves)
                    wgmma.PIPELINES = original_pipelines
                    if "PIPELINE_STAGES" in settings:
                        pipeline = (settings["PIPELINE_STAGES"], settings.get("PIPELINE_IN_FLIGHT", 0))
                        wgmma.PIPELINES = {**original_pipelines, 128: pipeline, 64: pipeline}
                    run = kernel_only(direction, layer, cupy, np.random.default_rng(0), wgmma, tf32)
                    if run is None:
                        break
                    row[name] = per_call_ms(run, cupy)
                    row[f"{name}_tflops"] = flops / row[name] / 1e9
                    out = run.output  # backward-filter's float32 sums, or forward's bfloat16 words widened
                    out = out if out.dtype == np.float32 else convert.half_to_float(out, "bfloat16")
                    out = out.astype(np.float32, copy=True)
                    first = out if first is None else first
                    row[f"{name}_difference"] = float(cupy.abs(out - first).max() / cupy.abs(first).max())
                extra = ()
                if first is None:
                    continue
                dtype = torch.float32 if tf32 else torch.bfloat16
                row["cudnn_channels_last"] = per_call_ms(torch_call(direction, layer, dtype, True, torch), cupy)
                for name, _ in variants:
                    row[f"{name}_over_cudnn"] = row[name] / row["cudnn_channels_last"]
                rows.append(row)
                print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                      flush=True)
    _cuda.function = original
    wgmma.tile_width = original_width
    wgmma.FORWARD_PRODUCER = original_producer
    wgmma.FORWARD_TMA = original_tma
    wgmma.FILTER_TMA = original_filter_tma
    wgmma.SPLIT_K_WITHIN_WAVES = original_within
    wgmma.SPLIT_K_WAVES = original_waves
    wgmma.PIPELINES = original_pipelines
    names = [name for name, _ in variants]
    columns = names + ["cudnn_channels_last"] + [f"{n}_over_cudnn" for n in names] + [f"{n}_tflops" for n in names]
    lines = ["| layer | dtype | direction | " + " | ".join(columns) + " |", "|---" * (len(columns) + 3) + "|"]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['dtype']} | {row['direction']} | "
                     + " | ".join(f"{row[c]:.4g}" for c in columns) + " |")
    os.makedirs(args.out, exist_ok=True)
    write_report(args.out, "wgmma-forward-builds", rows,
                 "The wgmma forward kernel alone, ms per call (median of 7 groups of 10 calls in a row, CUDA events), "
                 "against cuDNN channels_last; variants: " + "; ".join(args.variants) + ".\n\n" + "\n".join(lines)
                 + "\n", torch)


def _options(parser) -> None:
    parser.add_argument("--variants", nargs="+", default=["base"], help="NAME=MACRO:VALUE,... (base: as built)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--directions", default=",".join(DIRECTIONS),
                        help="comma-separated: forward, backward_data, backward_filter (its kernel's builds)")
    parser.add_argument("--layers", default="", help="comma-separated parts of layer names (default: every layer)")


if __name__ == "__main__":
    main()
