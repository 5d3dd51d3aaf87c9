# Justifies the TF32 errors of Winograd F(4x4) and F(4x4, 5x5), whose GEMMs follow the TF32 switch (docs/convolution.md, Winograd, Measured; minidnn/primitives/conv/winograd.py).
"""Winograd's error when its GEMMs run in TF32, emulated on the CPU: every float32 GEMM operand rounded to TF32's 10
mantissa bits (to nearest) before NumPy multiplies in float32, as cuBLAS's FAST_TF32 compute type does; against float64.

    PYTHONPATH=. python benchmarks/probes/winograd_tf32_error.py

On the H200 the same F(4x4, 5x5) measured 5.7e-3 relative error in TF32 on CaffeNet conv2
(results/2026-12-01-h200-winograd-5x5-caffenet-conv2/winograd-5x5.md, against implicit_gemm in TF32), as this emulation gives.
"""
import numpy as np

from minidnn.primitives import blas
from minidnn.primitives.conv import api


def tf32(array: np.ndarray) -> np.ndarray:
    """float32 values rounded to 10 mantissa bits (ties away from zero)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).reshape(array.shape)


def call(direction, first, second, shape, args, algo):
    if direction == "forward":
        return api.conv2d_forward(first, second, *args, algo=algo, workspace_limit=1 << 40)
    if direction == "backward_data":
        return api.conv2d_backward_data(first, second, shape, *args, algo=algo, workspace_limit=1 << 40)
    return api.conv2d_backward_filter(first, second, shape, *args, algo=algo, workspace_limit=1 << 40)


def main() -> None:
    exact_gemm = blas._numpy_gemm

    def tf32_gemm(a, b, out, alpha, beta):
        if a.dtype == np.float32:
            a, b = tf32(a), tf32(b)
        return exact_gemm(a, b, out, alpha, beta)

    rng = np.random.default_rng(3)
    # CaffeNet conv2 (5x5, groups 2) and conv3 (3x3), batch 2.
    for N, C, H, K, G, R in [(2, 96, 27, 256, 2, 5), (2, 256, 13, 384, 1, 3)]:
        x = rng.standard_normal((N, C, H, H)).astype(np.float32)
        w = (rng.standard_normal((K, C // G, R, R)) / np.sqrt(R * R * C / G)).astype(np.float32)
        dy = rng.standard_normal((N, K, H, H)).astype(np.float32)
        args = (1, R // 2, 1, G)
        winograd = "winograd_4x4" if R == 3 else "winograd_4x4_5x5"
        for direction, (a, b, shape) in {"forward": (x, w, None), "backward_data": (dy, w, x.shape),
                                         "backward_filter": (x, dy, w.shape)}.items():
            want = call(direction, a.astype(np.float64), b.astype(np.float64), shape, args, "reference")
            errors = {}
            for algo in ("gemm", winograd):
                for label, gemm in (("fp32", exact_gemm), ("tf32", tf32_gemm)):
                    blas._numpy_gemm = gemm
                    try:
                        got = call(direction, a, b, shape, args, algo)
                    finally:
                        blas._numpy_gemm = exact_gemm
                    errors[f"{algo} {label}"] = f"{np.linalg.norm(got - want) / np.linalg.norm(want):.1e}"
            print(f"{R}x{R} N{N} C{C} K{K} G{G} {direction}: " + ", ".join(f"{k} {v}" for k, v in errors.items()))


if __name__ == "__main__":
    main()
