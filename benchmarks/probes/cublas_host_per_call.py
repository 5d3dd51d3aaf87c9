# Justifies how an eager step's 1x1-convolution GEMMs are launched (issue 22, the GPU-bound steps' host time): through
# cuBLAS, or through a kernel of our own, whose launch costs the host less if cuBLAS's own call is what costs here.
"""Host microseconds per GEMM call on ResNet-50 b64's 1x1-convolution shapes, enqueue time only.

    PYTHONPATH=. python3 benchmarks/probes/cublas_host_per_call.py --out DIR

Each shape is gemm_1x1's forward: out[n] (K × H·W) = W (K × C) · x[n] (C × H·W) for the N images, one strided-batched
GEMM with W repeated at stride 0. The calls timed, ``--calls`` at a time, host time up to the last call's return:

- ``minidnn ready``: :class:`minidnn.primitives.blas.ReadyGemm`, the form a steady eager step calls (stream set on the
  handle, then cuBLAS's ``cublasGemmStridedBatchedEx`` through CuPy's Cython binding);
- ``cuBLAS alone``: the same binding with the same arguments, without minidnn's stream lookup and ``setStream``;
- ``setStream alone``: ``cublasSetStream`` on the current stream, which resets the handle's workspace to cuBLAS's
  default pool;
- ``setStream, GEMM``: the stream set before each GEMM, as minidnn's ready call does, without its Python;
- ``setStream, setWorkspace, GEMM``: PyTorch's order, a workspace of its own set after the stream, then the GEMM;
- ``torch.bmm``: PyTorch's call of the same product (``W.expand(N, K, C)`` times x, into an out tensor);
- ``empty kernel``: a one-thread CuPy RawKernel, the cost of one launch from Python.

Two conditions: ``idle`` (the device synchronised first) and ``backlog`` (a spin kernel of ``--backlog-ms`` queued
first, so that no call can wait on an earlier kernel). Writes DIR/cublas-host.json and DIR/cublas-host.md: the
median (least-greatest) µs per call over ``--repeats`` batches of calls.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

# (label, K, C, H·W) of ResNet-50's 1x1 convolutions at 224², one per stage and kind.
SHAPES = (("layer1 reduce 256->64, 56²", 64, 256, 56 * 56), ("layer1 expand 64->256, 56²", 256, 64, 56 * 56),
          ("layer3 reduce 1024->256, 14²", 256, 1024, 14 * 14), ("layer4 expand 512->2048, 7²", 2048, 512, 7 * 7))
WORKSPACE_BYTES = 32 << 20
EMPTY = r"""
extern "C" __global__ void empty(int unused) { }
"""


def per_call_us(call, calls: int, before) -> float:
    """µs per call of ``calls`` calls, timed on the host after ``before()`` (a sync, or a sync and a queued spin)."""
    before()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return 1e6 * (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=40, help="calls timed together")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backlog-ms", type=float, default=40.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import cupy  # a GPU probe: imported once the arguments are read
    import torch

    from benchmarks.probes.step_host_under_backlog import SPIN
    from benchmarks.probes.train_throughput import write_outputs
    from minidnn.primitives import blas

    module = cupy.RawModule(code=SPIN + EMPTY)
    spin, empty = module.get_function("spin"), module.get_function("empty")
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    spin((1,), (1,), (cupy.int64(20_000_000),))
    stop.record()
    stop.synchronize()
    cycles_per_ms = 20_000_000 / cupy.cuda.get_elapsed_time(start, stop)

    def idle() -> None:
        cupy.cuda.Device().synchronize()
        torch.cuda.synchronize()

    def backlog() -> None:
        idle()
        spin((1,), (1,), (cupy.int64(int(args.backlog_ms * cycles_per_ms)),))
        torch.cuda._sleep(int(args.backlog_ms * cycles_per_ms))  # PyTorch's stream waits too

    workspace = cupy.cuda.memory.Memory(WORKSPACE_BYTES)
    rows = []
    N = args.batch
    for label, K, C, HW in SHAPES:
        w = cupy.random.standard_normal((K, C), dtype=cupy.float32)
        x = cupy.random.standard_normal((N, C, HW), dtype=cupy.float32)
        out = cupy.empty((N, K, HW), dtype=cupy.float32)
        repeated = cupy.broadcast_to(w, (N, K, C))
        ready = blas.ReadyGemm(repeated, x, out)
        addresses = (w.data.ptr, x.data.ptr, out.data.ptr)
        cublas = ready.cublas
        arguments = list(ready.arguments)
        for slot, address in zip(ready.slots, addresses):
            arguments[slot] = address
        cublas.call(ready.entry, *arguments)  # the stream set once; the alone calls keep it
        entry = cublas.eager[ready.entry]
        tw, tx = torch.as_tensor(w, device="cuda"), torch.as_tensor(x, device="cuda")
        tout = torch.empty((N, K, HW), device="cuda")
        tw_repeated = tw.expand(N, K, C)
        stream_pointer = cupy.cuda.get_current_stream().ptr
        set_stream, set_workspace = cublas.eager["setStream"], cublas.capturable["setWorkspace"]

        def with_stream() -> None:  # minidnn's order without its Python: the stream (its workspace reset), the GEMM
            set_stream(cublas.handle, stream_pointer)
            entry(cublas.handle, *arguments)  # noqa: B023

        def with_workspace() -> None:  # PyTorch's order: the stream, then a workspace of its own, then the GEMM
            set_stream(cublas.handle, stream_pointer)
            set_workspace(cublas.handle, workspace.ptr, WORKSPACE_BYTES)
            entry(cublas.handle, *arguments)  # noqa: B023

        calls = {  # each run within this iteration: the loop's names are bound when called
            "minidnn ready": lambda: ready(*addresses),  # noqa: B023
            "cuBLAS alone": lambda: entry(cublas.handle, *arguments),  # noqa: B023
            "setStream alone": lambda: set_stream(cublas.handle, stream_pointer),
            "setStream, GEMM": with_stream,
            "setStream, setWorkspace, GEMM": with_workspace,
            "torch.bmm": lambda: torch.bmm(tw_repeated, tx, out=tout),  # noqa: B023
            "empty kernel": lambda: empty((1,), (1,), (cupy.int32(0),)),
        }
        reference = cupy.matmul(w, x)
        ready(*addresses)
        agree = float(cupy.abs(out - reference).max() / cupy.abs(reference).max())
        for name, call in calls.items():
            call()  # warm: heuristics, first launch
            for condition, before in (("idle", idle), ("backlog", backlog)):
                values = [per_call_us(call, args.calls, before) for _ in range(args.repeats)]
                rows.append({"shape": label, "K": K, "C": C, "HW": HW, "call": name, "condition": condition,
                             "median_us": statistics.median(values), "least_us": min(values),
                             "greatest_us": max(values), "ready_vs_matmul_error": agree})
                print(f"{label:32s} {name:14s} {condition:8s} {statistics.median(values):7.1f} µs", flush=True)
        idle()

    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    meta = {"device": device, "cupy": cupy.__version__, "torch": torch.__version__, "batch": N, "calls": args.calls,
            "repeats": args.repeats, "backlog_ms": args.backlog_ms}
    lines = [(f"{device}, CuPy {cupy.__version__}, PyTorch {torch.__version__}; N = {N}, {args.calls} calls a "
              f"batch, {args.repeats} batches; µs per call, median (least-greatest)"), "",
             "| shape | call | idle | backlog |", "|---|---|---|---|"]
    for label, *_ in SHAPES:
        for name in calls:
            cells = {row["condition"]: row for row in rows if row["shape"] == label and row["call"] == name}
            lines.append(f"| {label} | {name} | " + " | ".join(
                f"{cells[c]['median_us']:.1f} ({cells[c]['least_us']:.1f}-{cells[c]['greatest_us']:.1f})"
                for c in ("idle", "backlog")) + " |")
    write_outputs(args.out, "cublas-host", {"meta": meta, "rows": rows}, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
