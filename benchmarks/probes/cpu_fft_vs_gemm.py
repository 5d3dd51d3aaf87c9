# Justifies selection.preference's CPU rules: fft only from 7x7 filters, no F(4x4, 5x5) (minidnn/primitives/conv/selection.py).
"""On the CPU, `fft` (and on 5x5 filters `winograd_4x4_5x5`) against `gemm` (im2col + one BLAS call) for stride-1
filters of 5x5 to 9x9, every direction: the evidence behind `get`'s CPU rules (fft only from 7x7 filters, no
F(4x4, 5x5) on the CPU). Milliseconds per call, mean of two after a warm-up:

    PYTHONPATH=. python benchmarks/probes/cpu_fft_vs_gemm.py
"""
import os
import platform
import time

import numpy as np

from minidnn.primitives import conv

CASES = [  # N, C, H, K, R, groups
    (8, 96, 27, 256, 5, 2),    # CaffeNet conv2 at batch 8
    (16, 64, 32, 64, 5, 1),
    (32, 3, 32, 32, 5, 1),
    (8, 32, 64, 32, 7, 1),
    (4, 16, 128, 16, 9, 1),
]


def milliseconds(call) -> float:
    call()
    start = time.perf_counter()
    call()
    call()
    return (time.perf_counter() - start) / 2 * 1e3


def main() -> None:
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, NumPy {np.__version__}")
    rng = np.random.default_rng(0)
    for N, C, H, K, R, G in CASES:
        x = rng.standard_normal((N, C, H, H)).astype(np.float32)
        w = rng.standard_normal((K, C // G, R, R)).astype(np.float32)
        dy = rng.standard_normal((N, K, H, H)).astype(np.float32)
        args, limit = (1, R // 2, 1, G), 1 << 40
        times = {}
        for algo in ("gemm", "fft") + (("winograd_4x4_5x5",) if R == 5 else ()):
            times[algo] = [milliseconds(lambda: conv.conv2d_forward(x, w, *args, algo=algo, workspace_limit=limit)),
                           milliseconds(lambda: conv.conv2d_backward_data(dy, w, x.shape, *args, algo=algo,
                                                                          workspace_limit=limit)),
                           milliseconds(lambda: conv.conv2d_backward_filter(x, dy, w.shape, *args, algo=algo,
                                                                            workspace_limit=limit))]
        print(f"N{N} C{C} {H}x{H} K{K} {R}x{R} groups {G}: forward / backward-data / backward-filter ms: "
              + "; ".join(f"{algo} " + " / ".join(f"{t:.1f}" for t in ts) for algo, ts in times.items()))


if __name__ == "__main__":
    main()
