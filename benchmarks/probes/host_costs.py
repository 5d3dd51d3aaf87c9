# Measures the host cost of the CuPy operations a GPU primitive is built from (an allocation, a kernel launch by argument count, a view, a fill, a launch-struct field read): the floor under issue 22's eager host time, which says which per-call work is worth taking out of a primitive's path.
"""Each operation called 3000 times after 200 warm-ups, perf_counter around the loop, µs per call (median of 5
loops), the device synchronised before each loop. The stream is not held: a held stream fills the driver's
queue of pending launches (about a thousand) and every launch after that waits for the GPU, which is what the
first run of this probe measured for its launch and fill rows (2026-12-04-h200-eager-host-costs/NOTE.md).

    PYTHONPATH=. python benchmarks/probes/host_costs.py --out DIR

Writes DIR/host-costs.json and DIR/host-costs.md.
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

from minidnn import backend
from minidnn.primitives import _cuda, convert

KERNEL = r"""
extern "C" __global__ void four(const unsigned short* a, unsigned short* b, int n, int m) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && n < 0) b[0] = a[m];
}
extern "C" __global__ void sixteen(const unsigned short* a, double* b, unsigned int* c, int n, int d, int e,
                                   int f, const float* g, float* h, float* i, float* j, float* k, double* l,
                                   double m, double o, long long* p) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && n < 0) b[0] = a[d] + m + o;
}
"""


def per_call_us(call, repeats=3000, loops=5, cupy=None):
    for _ in range(200):
        call()
    samples = []
    for _ in range(loops):
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        samples.append((time.perf_counter() - start) / repeats * 1e6)
    cupy.cuda.Device().synchronize()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cupy = backend.cupy()
    module = cupy.RawModule(code=KERNEL)
    four, sixteen = module.get_function("four"), module.get_function("sixteen")
    a = cupy.zeros((128, 64, 56, 56), dtype=np.uint16)
    b = cupy.zeros(1024, dtype=np.float64)
    counters = cupy.zeros(64, dtype=np.uint32)
    vectors = [cupy.zeros(64, dtype=np.float32) for _ in range(5)]
    tracked = cupy.zeros(1, dtype=np.int64)
    small = cupy.zeros((64, 3, 3, 64), dtype=np.float32)
    shape = np.zeros(1, dtype=np.dtype([(f"f{i}", np.int32) for i in range(15)]))[0]
    i32, f64 = _cuda.i32, _cuda.f64
    operations = {
        "cupy.empty (128, 64, 56, 56) uint16": lambda: cupy.empty((128, 64, 56, 56), dtype=np.uint16),
        "cupy.empty (64,) float32": lambda: cupy.empty(64, dtype=np.float32),
        "launch, 4 arguments": lambda: four((1,), (32,), (a, a, i32(1), i32(2))),
        "launch, 16 arguments": lambda: sixteen((1, 1), (32,), (a, b, counters, i32(1), i32(2), i32(3), i32(4),
                                                             *vectors, b, f64(0.1), f64(0.2), tracked)),
        "launch, 4 arguments, struct last": lambda: four((1,), (32,), (a, a, i32(1), shape)),
        "_cuda.launch_blocks, 4 arguments": lambda: _cuda.launch_blocks(four, (1,), 32, (a, a, i32(1), i32(2))),
        "a[0:64] (a view)": lambda: a[0:64],
        "cupy.ascontiguousarray (already contiguous)": lambda: cupy.ascontiguousarray(a),
        "small.fill(0)": lambda: small.fill(0),
        "np.void field read": lambda: int(shape["f3"]),
        "convert.half_type_of": lambda: convert.half_type_of(a),
        "backend.get_array_module, two arrays": lambda: backend.get_array_module(a, a),
        "_cuda.function (cached)": lambda: _cuda.function("batchnorm.cu", "bn_apply", np.float32,
                                                          _cuda.HALF_BUILDS["bfloat16"]),
        "_cuda.i32 (cached)": lambda: i32(56),
        "_cuda.steady_key, six arrays": lambda: _cuda.steady_key("forward", a, b, counters, *vectors[:3]),
        "a.data.ptr": lambda: a.data.ptr,
        "get_current_stream().is_capturing()": lambda: cupy.cuda.get_current_stream().is_capturing(),
    }
    # The same sixteen-argument launch straight through the driver, its parameters packed once into host memory
    # (every argument is at most 8 bytes: one 8-byte slot each, little-endian), and with three pointers rewritten
    # per call as a kept launch whose arrays change would: what CuPy's per-argument conversion costs on top.
    arguments = (a, b, counters, i32(1), i32(2), i32(3), i32(4), *vectors, b, f64(0.1), f64(0.2), tracked)
    slots = np.zeros(len(arguments), dtype=np.uint64)
    for position, argument in enumerate(arguments):
        if isinstance(argument, cupy.ndarray):
            slots[position] = argument.data.ptr
        else:
            slots[position:position + 1].view(np.uint8)[:argument.itemsize] = \
                np.frombuffer(argument.tobytes(), dtype=np.uint8)
    parameters = np.array([slots.ctypes.data + 8 * i for i in range(len(arguments))], dtype=np.uint64)
    launch = cupy.cuda.driver.launchKernel
    function = getattr(sixteen, "kernel", sixteen).ptr  # a RawKernel holds its Function per device
    stream = cupy.cuda.get_current_stream().ptr
    parameters_address = parameters.ctypes.data

    def rewritten():
        slots[0] = a.data.ptr
        slots[1] = b.data.ptr
        slots[15] = tracked.data.ptr
        launch(function, 1, 1, 1, 32, 1, 1, 0, stream, parameters_address, 0)

    operations["driver.launchKernel, 16 arguments packed once"] = \
        lambda: launch(function, 1, 1, 1, 32, 1, 1, 0, stream, parameters_address, 0)
    operations["driver.launchKernel, 16 arguments, 3 pointers rewritten"] = rewritten
    # The allocation with and without minidnn's peak tracker (_cuda._PeakTracker) between CuPy and its pool.
    pool = cupy.get_default_memory_pool()
    operations["pool.malloc(4096), freed"] = lambda: pool.malloc(4096)
    operations["peak tracker malloc(4096), freed"] = lambda: _cuda._tracker.malloc(4096)
    rows = []
    for name, call in operations.items():
        rows.append({"operation": name, "us_per_call": per_call_us(call, cupy=cupy)})
        print(f"{name}: {rows[-1]['us_per_call']:.2f} us", flush=True)
    cupy.cuda.set_allocator(pool.malloc)
    try:
        name = "cupy.empty (64,) float32, the pool's malloc as allocator"
        rows.append({"operation": name, "us_per_call": per_call_us(lambda: cupy.empty(64, dtype=np.float32),
                                                                   cupy=cupy)})
        print(f"{name}: {rows[-1]['us_per_call']:.2f} us", flush=True)
    finally:
        cupy.cuda.set_allocator(_cuda._tracker.malloc)
    os.makedirs(args.out, exist_ok=True)
    lines = ["| operation | µs per call |", "|---|---|"] + [f"| {r['operation']} | {r['us_per_call']:.2f} |"
                                                          for r in rows]
    for stem, text in (("host-costs.json", json.dumps({"rows": rows}, indent=1)),
                       ("host-costs.md", "Host µs per call, median of 5 loops of 3000 (perf_counter).\n\n"
                        + "\n".join(lines) + "\n")):
        temporary = os.path.join(args.out, stem + ".part")
        with open(temporary, "w") as file:
            file.write(text)
        os.replace(temporary, os.path.join(args.out, stem))


if __name__ == "__main__":
    main()
