# Sweeps the launch constants of batch norm's channels-last kernels over the batch-norm layers of ResNet-18 and ResNet-50 at batch 128 in bfloat16 (or --dtype float32): the rule of batchnorm.py's _rows_packing, _rows_split and _element_count (_LAST_BLOCK_BYTES, _LAST_PASSES_PER_SPLIT, _ROW_PACKS_PER_THREAD).
"""Each setting changes one constant from the library's default; every layer's training forward (statistics,
normalise) and backward (sums, dx) is timed as batch_norm_kernels.py times it (GPU time queued behind a hold,
median of 15 after 3 warm-ups), in one process.

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/batch_norm_rows_sweep.py --out DIR [--dtype float32]

Writes DIR/batch-norm-rows.json and DIR/batch-norm-rows.md.
"""
import functools
import os

import numpy as np
from batch_norm_kernels import LAYERS, gpu_ms  # this folder's probes
from half_implicit_gemm_vs_cudnn import start, write_report

from minidnn.primitives import batchnorm, convert, layout

SETTINGS = [("default", {})]
SETTINGS += [(f"block bytes {b}", {"_LAST_BLOCK_BYTES": b}) for b in (64, 256, 512)]
SETTINGS += [(f"passes {p}", {"_LAST_PASSES_PER_SPLIT": p}) for p in (4, 16, 32)]
SETTINGS += [(f"packs a thread {k}", {"_ROW_PACKS_PER_THREAD": k}) for k in (1, 2, 4, 16)]


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0], extra=_options)
    defaults = {name: getattr(batchnorm, name)
                for name in ("_LAST_BLOCK_BYTES", "_LAST_PASSES_PER_SPLIT", "_ROW_PACKS_PER_THREAD")}
    rows = []
    for name, N, C, H, W in LAYERS:
        x, dy = (cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32) * 2 + 0.5) for _ in range(2))
        if args.dtype == "bfloat16":
            x, dy = convert.float_to_half(x, "bfloat16"), convert.float_to_half(dy, "bfloat16")
        x, dy = layout.to_channels_last(x), layout.to_channels_last(dy)
        weight = cupy.asarray(rng.uniform(0.5, 1.5, C).astype(np.float32))
        bias = cupy.asarray(rng.standard_normal(C).astype(np.float32))
        running_mean, running_var = cupy.zeros(C, np.float32), cupy.ones(C, np.float32)
        _, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, running_mean, running_var)
        row = {"layer": name}
        for label, changes in SETTINGS:
            for constant, value in {**defaults, **changes}.items():
                setattr(batchnorm, constant, value)
            batchnorm._launches.clear()  # a call's kept launch was sized under the last setting's constants
            row[label] = (gpu_ms(functools.partial(batchnorm.batch_norm_forward_training, x, weight, bias,
                                                   running_mean, running_var)),
                          gpu_ms(functools.partial(batchnorm.batch_norm_backward_training, dy, x, weight, mean,
                                                   invstd)))
        for constant, value in defaults.items():
            setattr(batchnorm, constant, value)
        batchnorm._launches.clear()
        rows.append(row)
        print(name, " ".join(f"{k}: {v[0]:.4g}/{v[1]:.4g}" for k, v in row.items() if k != "layer"), flush=True)
    os.makedirs(args.out, exist_ok=True)
    labels = [label for label, _ in SETTINGS]
    lines = [f"defaults: {defaults}; {args.dtype}", "", "| layer | " + " | ".join(labels) + " |",
             "|---" * (len(labels) + 1) + "|"]
    lines += [f"| {r['layer']} | " + " | ".join(f"{r[k][0]:.4g} / {r[k][1]:.4g}" for k in labels) + " |" for r in rows]
    for stem, layers in (("r18 step", {"stem": 1, "r18.layer1": 4, "r18.layer2": 5, "r18.layer3": 5, "r18.layer4": 5}),
                         ("nine shapes", {r["layer"]: 1 for r in rows})):
        sums = [sum(layers.get(r["layer"], 0) * sum(r[k]) for r in rows) for k in labels]
        lines.append(f"| **{stem}, fwd + bwd** | " + " | ".join(f"{v:.4g}" for v in sums) + " |")
    write_report(args.out, "batch-norm-rows", rows, "ms of GPU time per call (forward / backward), median of 15 "
                 "(queued behind a hold); each setting changes one constant from the defaults; the sums weigh "
                 "each layer by its count in a ResNet-18 step.\n\n" + "\n".join(lines) + "\n", torch)


def _options(parser) -> None:
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="x's and dy's type")


if __name__ == "__main__":
    main()
