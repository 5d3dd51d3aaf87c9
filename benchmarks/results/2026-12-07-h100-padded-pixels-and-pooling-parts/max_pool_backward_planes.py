# Justifies pooling.cu's MAX_POOL_PLANES (the planes a max-pool backward thread takes a turn of its loop) and which gradients in two parts max_pool2d_backward gathers in one pass rather than summing them first.
"""Channels-last max pooling's backward from the uint8 record on the reference models' pooling layers, float32 and
bfloat16, with pooling.cu built at each MAX_POOL_PLANES: one gradient; two parts read by the gather (the *_sum
kernels); and two parts summed first (convert.add), then the one-gradient gather. CUDA events around ten calls in
a row (the launches queue, no host gap counts), median of 15 after 3 warm-ups, in one process. Every build's dx is
checked bit for bit against the default build's and the two-part ways against each other.

    PYTHONPATH=.:benchmarks/probes python benchmarks/probes/max_pool_backward_planes.py --out DIR

Kept here as call 3 ran it, from benchmarks/probes/ and with max-pool-planes.patch applied to pooling.cu (the
MAX_POOL_PLANES builds, not kept: one plane a turn was fastest).

Writes DIR/max-pool-backward-planes.json and .md.
"""
import functools
import os

import numpy as np

from half_implicit_gemm_vs_cudnn import print_row, start, timed, write_report  # this folder's probes
from minidnn.primitives import _cuda, convert, layout, pooling

PLANES = (1, 2, 4)
# (name, N, C, H, W, kernel, stride, padding): ResNet's stem pool and CaffeNet's first.
LAYERS = [("resnet.maxpool", 128, 64, 112, 112, 3, 2, 1), ("caffenet.pool1", 256, 96, 55, 55, 3, 2, 0)]
COLUMNS = ("one", "parts_gathered", "parts_summed_first")


def kernels_with_planes(planes: int):
    """A stand-in for pooling._kernel that compiles pooling.cu with MAX_POOL_PLANES = ``planes``."""
    def kernel(name, arrays):
        _cuda.check_int32(*arrays)
        half = convert.half_type_of(arrays[0])
        defines = (_cuda.HALF_BUILDS[half] if half else ()) + (("MAX_POOL_PLANES", planes),)
        return _cuda.function("pooling.cu", name, np.float32 if half else arrays[0].dtype, defines)
    return kernel


def main() -> None:
    args, torch, cupy, rng = start(__doc__.splitlines()[0])
    default_kernel, rows = pooling._kernel, []

    def channels_last(shape, dtype_name):
        values = cupy.asarray(rng.standard_normal(shape).astype(np.float32))
        values = convert.float_to_half(values, "bfloat16") if dtype_name == "bfloat16" else values
        return layout.to_channels_last(values)

    for name, N, C, H, W, kernel, stride, padding in LAYERS:
        for dtype_name in ("float32", "bfloat16"):
            x = channels_last((N, C, H, W), dtype_name)
            y, taps = pooling.max_pool2d_forward(x, kernel, stride, padding)
            dy, dy_other = channels_last(y.shape, dtype_name), channels_last(y.shape, dtype_name)
            backward = functools.partial(pooling.max_pool2d_backward, indices=taps, x_shape=x.shape,
                                         kernel_size=kernel, stride=stride, padding=padding)
            want_one, want_parts = backward(dy), backward(dy, dy_other=dy_other)
            assert cupy.array_equal(want_parts, backward(convert.add(dy, dy_other)))
            for planes in PLANES:
                pooling._kernel = kernels_with_planes(planes)
                try:
                    assert cupy.array_equal(backward(dy), want_one) and \
                        cupy.array_equal(backward(dy, dy_other=dy_other), want_parts)
                    row = {"layer": name, "dtype": dtype_name, "planes": planes,
                           "one": timed(lambda: backward(dy), cupy, repeats=15, calls=10),
                           "parts_gathered": timed(lambda: backward(dy, dy_other=dy_other), cupy, repeats=15,
                                                   calls=10),
                           "parts_summed_first": timed(lambda: backward(convert.add(dy, dy_other)), cupy,
                                                       repeats=15, calls=10)}
                finally:
                    pooling._kernel = default_kernel
                rows.append(row)
                print_row(row)
    os.makedirs(args.out, exist_ok=True)
    lines = ["| layer | dtype | planes | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 3) + "|"]
    lines += [f"| {r['layer']} | {r['dtype']} | {r['planes']} | " + " | ".join(f"{r[c]:.4f}" for c in COLUMNS)
              + " |" for r in rows]
    write_report(args.out, "max-pool-backward-planes", rows, "ms a call, median of 15 (CUDA events around ten "
                 "calls); channels-last, from the uint8 record.\n\n" + "\n".join(lines) + "\n", torch)


if __name__ == "__main__":
    main()
