"""Compiling and launching minidnn's own CUDA kernels through CuPy (GPU only; imported lazily).

Conventions every ``.cu`` file follows, so that it compiles both here (``cupy.RawModule``, NVRTC)
and with ``nvcc`` in the CPU test suite:

* kernels are ``extern "C" __global__`` (no C++ name mangling) and written on ``scalar_t``, which
  the file defines from the macro ``SCALAR`` (``float`` unless given). Each file is compiled once
  per dtype, with ``-DSCALAR=float`` or ``-DSCALAR=double``: two cached modules, no templates.
* sizes and indices are ``int``: :func:`check_int32` refuses arrays of 2^31 elements or more
  rather than let an index wrap; hyper-parameters (learning rates, epsilons) are ``double`` and
  converted once at the top of the kernel.
* element-wise kernels use grid-stride loops, so :func:`launch` may cap the grid.
* shared device code lives in ``.cuh`` headers beside the sources (``#include "channels.cuh"``),
  inlined by :func:`read_source` before compiling.
* kernels elsewhere in the package (the naive engine's ``minidnn/naive/caffe_layers.cu``) follow the
  same conventions and compile through the same :func:`function`, named by :func:`package_source`.

Python scalars must be wrapped before a launch (CuPy would pass an ``int`` as a 64-bit integer):
use :func:`i32` and :func:`f64`.
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Sequence

import numpy as np

from .. import backend

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)  # minidnn/: kernels outside the primitives (the naive engine's) live there too
DTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
INT32_LIMIT = 2**31 - 1
THREADS = 256
MAX_BLOCKS = 132 * 32  # enough blocks to fill an H200 (132 SMs) many times; loops cover the rest


def source_path(relative: str) -> str:
    """Absolute path of a ``.cu`` file given relative to ``minidnn/primitives``."""
    return os.path.join(HERE, relative)


def package_source(path_in_package: str) -> str:
    """A ``.cu`` file elsewhere in the package, e.g. ``"naive/caffe_layers.cu"``, as the path relative to
    ``minidnn/primitives`` that :func:`function` takes (``"../naive/caffe_layers.cu"``), so that every
    kernel of minidnn compiles and is cached through the one :func:`function`."""
    return os.path.relpath(os.path.join(PACKAGE, path_in_package), HERE)


def read_source(relative: str) -> str:
    """The ``.cu`` file with its local ``#include "x.cuh"`` lines replaced by the headers' text.

    NVRTC compiles a string and knows no directory; inlining the headers also makes their text
    part of CuPy's kernel-cache key, so editing a header recompiles the kernels that use it.
    """
    path = source_path(relative)
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines(keepends=True)
    for index, line in enumerate(lines):
        match = re.match(r'\s*#include\s+"([^"]+)"', line)
        if match:
            header = os.path.join(os.path.dirname(path), match.group(1))
            with open(header, encoding="utf-8") as file:
                lines[index] = file.read() + "\n"
    return "".join(lines)


@functools.lru_cache(maxsize=None)
def _module(relative: str, scalar: str, defines: tuple[tuple[str, int], ...]) -> Any:
    options = ("--std=c++17", f"-DSCALAR={scalar}", *(f"-D{name}={value}" for name, value in defines))
    return backend.cupy().RawModule(code=read_source(relative), options=options)


def function(relative: str, name: str, dtype: Any, defines: tuple[tuple[str, int], ...] = ()) -> Any:
    """The kernel ``name`` of the ``.cu`` file ``relative``, compiled for ``dtype`` (float32/float64);
    ``defines`` ((macro, value), ...) select a further build of the same source, cached apart."""
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise TypeError(f"GPU kernels are compiled for float32 and float64, got {dtype}")
    return _module(relative, DTYPES[dtype], defines).get_function(name)


def i32(value: int) -> np.int32:
    if not -INT32_LIMIT - 1 <= value <= INT32_LIMIT:
        raise ValueError(f"{value} does not fit the kernels' 32-bit indices")
    return np.int32(value)


def f64(value: float) -> np.float64:
    return np.float64(value)


def check_int32(*arrays_or_sizes: Any) -> None:
    """Refuse problems whose element counts would overflow 32-bit kernel indices."""
    for item in arrays_or_sizes:
        size = item if isinstance(item, (int, np.integer)) else item.size
        if size > INT32_LIMIT:
            raise ValueError(f"an array of {size} elements is too large for the GPU kernels' 32-bit indexing; "
                             "use a smaller batch (or a smaller workspace limit for convolutions)")


def launch(kernel: Any, count: int, args: Sequence[Any], threads: int = THREADS, shared_bytes: int = 0) -> None:
    """Run ``kernel`` with enough blocks of ``threads`` for ``count`` grid-stride iterations."""
    if count <= 0:
        return
    blocks = min((count + threads - 1) // threads, MAX_BLOCKS)
    kernel((blocks,), (threads,), tuple(args), shared_mem=shared_bytes)


def launch_blocks(kernel: Any, blocks: int | tuple[int, ...], threads: int, args: Sequence[Any],
                  shared_bytes: int = 0) -> None:
    """Run ``kernel`` on an explicit grid (one block per row, per channel, ...)."""
    grid = blocks if isinstance(blocks, tuple) else (blocks,)
    if min(grid) <= 0:
        return
    kernel(grid, (threads,), tuple(args), shared_mem=shared_bytes)


@functools.lru_cache(maxsize=None)
def _sm_count_of(device_id: int) -> int:
    return backend.cupy().cuda.Device(device_id).attributes["MultiProcessorCount"]


def sm_count() -> int:
    """The current device's number of SMs (queried once per device): how many CTAs make a wave."""
    return _sm_count_of(backend.cupy().cuda.runtime.getDevice())


def hold_stream(milliseconds: float) -> None:
    """Keep the current stream busy for ``milliseconds`` (hold.cu), so that what is queued next runs
    back to back however slowly the host queues it."""
    kernel = function("hold.cu", "hold_stream", np.float32)
    kernel((1,), (1,), (np.int64(milliseconds * 1e6),))


def queued_milliseconds(call: Any, hold_ms: float, max_hold_ms: float) -> float:
    """The GPU time of one ``call()``: CUDA events around it, the whole call queued behind a hold of the
    stream (:func:`hold_stream`) so that its kernels run back to back and the gaps in which the GPU would
    wait for the host to launch the next kernel do not count. When the hold ended before the host had
    queued the call, the sample is taken again behind a hold four times as long, up to ``max_hold_ms``
    (a call that waits for the GPU itself can never be queued ahead: it is then timed as it runs)."""
    cupy = backend.cupy()
    hold = hold_ms
    while True:
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        hold_stream(hold)
        begin.record()
        call()
        end.record()
        queued_in_time = not begin.done
        end.synchronize()
        if queued_in_time or hold >= max_hold_ms:
            return cupy.cuda.get_elapsed_time(begin, end)
        hold *= 4


# Per-channel reductions split each channel's values over several blocks so that even a layer with
# few channels fills the GPU: about TARGET_BLOCKS blocks in all, none with fewer than a minimum.
TARGET_BLOCKS = 132 * 8
MIN_VALUES_PER_BLOCK = 4096


def reduction_split(channels: int, values: int, minimum: int = MIN_VALUES_PER_BLOCK) -> tuple[int, int]:
    """(splits, per): each channel's ``values`` in ``splits`` ranges of ``per`` values (the last may be
    shorter, none is empty; one split even for no values)."""
    wanted = -(-TARGET_BLOCKS // max(channels, 1))
    splits = max(1, min(wanted, values // minimum))
    per = max(1, -(-values // splits))
    return max(1, -(-values // per)), per


def cuda_sources() -> list[str]:
    """Every ``.cu`` file of the package (the primitives' and the naive engine's), relative to
    ``minidnn/primitives`` as :func:`function` takes them (for the nvcc test)."""
    found = []
    for directory, _, names in os.walk(PACKAGE):
        found.extend(os.path.relpath(os.path.join(directory, n), HERE) for n in names if n.endswith(".cu"))
    return sorted(found)
