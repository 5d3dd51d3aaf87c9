"""Session 26 experiment: batch norm's channels-last float32 kernels with float sums (FLOAT_SUMS) and float math
(FLOAT_MATH) instead of double, per call (queued GPU time, median of 15), PyTorch channels_last beside."""
import functools, json, statistics, sys
import numpy as np
sys.path.insert(0, "benchmarks/probes")
from batch_norm_kernels import LAYERS, gpu_ms
from minidnn.primitives import _cuda, batchnorm, layout
import cupy, torch

VARIANTS = {"base": (), "sums": (("FLOAT_SUMS", 1),), "math": (("FLOAT_MATH", 1),),
            "both": (("FLOAT_SUMS", 1), ("FLOAT_MATH", 1))}
original = _cuda.function
extra = ()
def function(relative, name, dtype, defines=()):
    if relative.endswith("batchnorm.cu"):
        defines = tuple(defines) + extra
    return original(relative, name, dtype, defines)
_cuda.function = function
rng = np.random.default_rng(0)
rows = []
for name, N, C, H, W in LAYERS:
    x = layout.to_channels_last(cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32) * 2 + 0.5))
    dy = layout.to_channels_last(cupy.asarray(rng.standard_normal((N, C, H, W)).astype(np.float32)))
    weight = cupy.asarray(rng.uniform(0.5, 1.5, C).astype(np.float32))
    bias = cupy.asarray(rng.standard_normal(C).astype(np.float32))
    row = {"layer": name}
    first = None
    for variant, defines in VARIANTS.items():
        extra = defines
        rm, rv = cupy.zeros(C, np.float32), cupy.ones(C, np.float32)
        y, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, rm, rv)
        grads = batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd)
        outs = [cupy.asnumpy(a).astype(np.float64) for a in (y, grads[0], grads[1], grads[2])]
        first = outs if first is None else first
        row[variant + "_difference"] = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(outs, first))
        row[variant + "_forward"] = gpu_ms(functools.partial(batchnorm.batch_norm_forward_training, x, weight, bias,
                                                             rm, rv))
        row[variant + "_backward"] = gpu_ms(functools.partial(batchnorm.batch_norm_backward_training, dy, x, weight,
                                                              mean, invstd))
    extra = ()
    tx = torch.randn(N, C, H, W, device="cuda").contiguous(memory_format=torch.channels_last).requires_grad_(True)
    tw = torch.ones(C, device="cuda", requires_grad=True); tb = torch.zeros(C, device="cuda", requires_grad=True)
    trm, trv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
    forward = functools.partial(torch.nn.functional.batch_norm, tx, trm, trv, tw, tb, True)
    ty = forward(); tdy = torch.randn_like(ty)
    row["torch_forward"] = gpu_ms(forward)
    row["torch_backward"] = gpu_ms(functools.partial(torch.autograd.grad, ty, (tx, tw, tb), tdy, retain_graph=True))
    rows.append(row)
    print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
