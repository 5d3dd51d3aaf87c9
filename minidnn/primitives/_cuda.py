"""minidnn's CUDA runtime: compiling and launching our own kernels through CuPy, the TF32 math mode,
GPU memory statistics, and the reference profile of the GPU the launch rules were tuned on. It imports
no CuPy itself: :func:`minidnn.backend.when_cupy_loads` tells it when CuPy is there.

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

import contextlib
import dataclasses
import functools
import hashlib
import os
import re
import tempfile
import threading
from types import ModuleType
from typing import Any, Iterator, Sequence

import numpy as np

from .. import backend

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)  # minidnn/: kernels outside the primitives (the naive engine's) live there too
DTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
INT32_LIMIT = 2**31 - 1
THREADS = 256
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y (and .z): longer loops go inside the kernels


# ----------------------------------------------------------------------------------------------
# The reference profile: the GPU the launch rules were tuned on
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GpuProfile:
    """A GPU as the launch rules see it. Rules that only fill the GPU ask the device itself
    (:func:`sm_count`); a rule whose answer must not depend on the machine (a workspace size, which
    the CPU twin must reproduce) uses the reference profile's count instead."""

    name: str
    sm_count: int


# The GPU the rules were measured on (docs/gpu.md, "The reference profile").
REFERENCE_PROFILE = GpuProfile(name="NVIDIA H200", sm_count=132)
# Grid-stride kernels: enough blocks to fill every SM this many times over; their loops cover the rest.
BLOCKS_PER_SM = 32


def source_path(relative: str) -> str:
    """Absolute path of a ``.cu`` file given relative to ``minidnn/primitives``."""
    return os.path.join(HERE, relative)


def package_source(path_in_package: str) -> str:
    """A ``.cu`` file elsewhere in the package, e.g. ``"naive/caffe_layers.cu"``, as the path relative to
    ``minidnn/primitives`` that :func:`function` takes (``"../naive/caffe_layers.cu"``), so that every
    kernel of minidnn compiles and is cached through the one :func:`function`."""
    return os.path.relpath(os.path.join(PACKAGE, path_in_package), HERE)


def read_source(relative: str) -> str:
    """The ``.cu`` file with its local ``#include "x.cuh"`` lines replaced by the headers' text, headers'
    own includes too, each header once (as ``#pragma once`` would).

    NVRTC compiles a string and knows no directory; inlining the headers also makes their text
    part of CuPy's kernel-cache key, so editing a header recompiles the kernels that use it.
    """
    return _inlined(source_path(relative), set())


def _inlined(path: str, seen: set[str]) -> str:
    """``path``'s text with its local includes inlined; ``seen`` (the headers inlined so far) grows."""
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines(keepends=True)
    for index, line in enumerate(lines):
        match = re.match(r'\s*#include\s+"([^"]+)"', line)
        if match:
            header = os.path.normpath(os.path.join(os.path.dirname(path), match.group(1)))
            if header in seen:
                lines[index] = ""
            else:
                seen.add(header)
                lines[index] = _inlined(header, seen) + "\n"
    return "".join(lines)


# Sources written with one architecture's own instructions, compiled for it alone: Hopper's warpgroup MMA
# (wgmma) exists only in sm_90a code, which runs on compute capability 9.0 and nowhere else (has_wgmma).
ARCHITECTURES = {"conv/implicit_gemm_wgmma.cu": "sm_90a"}


@functools.lru_cache(maxsize=None)
def _module(relative: str, scalar: str, defines: tuple[tuple[str, int], ...]) -> Any:
    options = ("--std=c++17", f"-DSCALAR={scalar}", *(f"-D{name}={value}" for name, value in defines))
    architecture = ARCHITECTURES.get(relative)
    if architecture is None:
        return backend.cupy().RawModule(code=read_source(relative), options=options)
    # CuPy names the architecture itself, from the device's compute capability (sm_90, never sm_90a), so
    # these sources are compiled by NVRTC here and CuPy loads the cubin.
    return backend.cupy().RawModule(path=_cubin(relative, (*options, f"--gpu-architecture={architecture}")))


def _cubin(relative: str, options: tuple[str, ...]) -> str:
    """The path of ``relative``'s cubin for ``options``, compiled by NVRTC once per source text, options and
    NVRTC version, and kept beside CuPy's own kernel cache (written to a temporary file, then renamed)."""
    from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415 - GPU only

    source = read_source(relative)
    key = hashlib.sha256(repr((source, options, nvrtc.getVersion())).encode()).hexdigest()
    directory = os.path.join(os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache")),
                             "minidnn")
    path = os.path.join(directory, key + ".cubin")
    if os.path.exists(path):
        return path
    program = nvrtc.createProgram(source, os.path.basename(relative), (), ())
    try:
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"NVRTC failed on {relative}:\n{nvrtc.getProgramLog(program)}") from error
        cubin = nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)
    os.makedirs(directory, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=directory, suffix=".part")
    with os.fdopen(descriptor, "wb") as file:
        file.write(cubin)
    os.replace(temporary, path)
    return path


@functools.lru_cache(maxsize=None)
def _compute_capability_of(device_id: int) -> str:
    return backend.cupy().cuda.Device(device_id).compute_capability


def current_device() -> int:
    """The index of the current GPU (CuPy's, set by ``with cupy.cuda.Device(i)``)."""
    return backend.cupy().cuda.runtime.getDevice()


def has_wgmma() -> bool:
    """Whether the current GPU runs sm_90a code (compute capability 9.0, Hopper): False without a GPU."""
    if not backend.cuda_is_available():
        return False
    return _compute_capability_of(backend.cupy().cuda.runtime.getDevice()) == "90"


# (device, source, kernel, dtype, defines) -> the kernel, looked up once: asking CuPy's module for a kernel
# costs several microseconds of host time, and a step launches hundreds.
_kernels: dict[tuple, Any] = {}


def function(relative: str, name: str, dtype: Any, defines: tuple[tuple[str, int], ...] = ()) -> Any:
    """The kernel ``name`` of the ``.cu`` file ``relative``, compiled for ``dtype`` (float32/float64);
    ``defines`` ((macro, value), ...) select a further build of the same source, cached apart."""
    key = (current_device(), relative, name, dtype, defines)
    kernel = _kernels.get(key)
    if kernel is None:
        dtype = np.dtype(dtype)
        if dtype not in DTYPES:
            raise TypeError(f"GPU kernels are compiled for float32 and float64, got {dtype}")
        kernel = _kernels[key] = _module(relative, DTYPES[dtype], defines).get_function(name)
    return kernel


# The half builds of a source that includes elements.cuh: its element type 16-bit words, its arithmetic float.
HALF_BUILDS = {"float16": (("HALF", 1),), "bfloat16": (("HALF", 2),)}


def element_function(relative: str, name: str, half: str | None, dtype: Any) -> Any:
    """The kernel ``name`` for arrays of ``dtype``, or for half storage (``half``: "float16" or "bfloat16",
    as convert.half_type_of names it) the source's half build, compiled with SCALAR float."""
    if half is not None:
        return function(relative, name, np.float32, HALF_BUILDS[half])
    return function(relative, name, dtype)


@functools.lru_cache(maxsize=4096)  # a step passes the same few sizes every time: make each scalar once
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


def max_blocks() -> int:
    """The most blocks a grid-stride launch uses on the current device (:data:`BLOCKS_PER_SM` per SM)."""
    return BLOCKS_PER_SM * sm_count()


# Kernels with pack builds (elements.cuh's Pack) move this many bytes of elements per access there.
PACK_BYTES = 16


def elements_per_access(arrays: Sequence[Any], plane: int | None = None, pack_bytes: int = PACK_BYTES) -> int:
    """How many elements each access of a kernel with a pack build moves over ``arrays`` (None entries
    skipped): a pack of ``pack_bytes`` when every array starts on a multiple of it and ``plane`` (the run of
    elements a pack must stay inside; None for a flat array) is a multiple of the pack, else 1 (the plain build)."""
    width = max(1, pack_bytes // arrays[0].itemsize)
    fits = plane is None or plane % width == 0
    return width if fits and all(a is None or a.data.ptr % pack_bytes == 0 for a in arrays) else 1


def steady_key(name: str, *arrays: Any) -> tuple | None:
    """The key under which a primitive keeps one call's launch for its repeats (a training step repeats every call):
    ``name``, and of each array (None kept as None) its type, shape, strides, dtype, GPU and address modulo
    :data:`PACK_BYTES` (which picks a pack build). None when an array is not a CuPy array: the call then takes its
    checks, which say what is wrong."""
    try:
        return (name, *[None if a is None else (type(a), a.shape, a.strides, a.dtype, a.data.device_id,
                                                 a.data.ptr % PACK_BYTES) for a in arrays])
    except (AttributeError, ValueError):  # a NumPy array's memoryview has no GPU (and bfloat16 no buffer format)
        return None


def pack_build(name: str, width: int) -> str:
    """The name of kernel ``name``'s build for ``width`` elements per access."""
    return name if width == 1 else name + "_vector"


def grid_stride_blocks(count: int, threads: int = THREADS) -> int:
    """The blocks :func:`launch` gives ``count`` grid-stride iterations: enough for one each, at most :func:`max_blocks`."""
    return min((count + threads - 1) // threads, max_blocks())


def launch(kernel: Any, count: int, args: Sequence[Any], threads: int = THREADS, shared_bytes: int = 0) -> None:
    """Run ``kernel`` with enough blocks of ``threads`` for ``count`` grid-stride iterations."""
    if count <= 0:
        return
    grid, args = (grid_stride_blocks(count, threads),), tuple(args)
    if _recording.steps is not None:
        _record_launch(kernel, grid, threads, shared_bytes, args)
    kernel(grid, (threads,), args, shared_mem=shared_bytes)


def launch_blocks(kernel: Any, blocks: int | tuple[int, ...], threads: int, args: Sequence[Any],
                  shared_bytes: int = 0) -> None:
    """Run ``kernel`` on an explicit grid (one block per row, per channel, ...)."""
    grid = blocks if isinstance(blocks, tuple) else (blocks,)
    if min(grid) <= 0:
        return
    args = tuple(args)
    if _recording.steps is not None:
        _record_launch(kernel, grid, threads, shared_bytes, args)
    kernel(grid, (threads,), args, shared_mem=shared_bytes)


class _Recording(threading.local):
    """The steps this thread records while recording() is active, or None: a launch from another thread (a data
    loader's, say) never lands in a recording of this one."""

    steps: list | None = None


_recording = _Recording()


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Collect the GPU work done inside the block, in order: every launch made through :func:`launch` and
    :func:`launch_blocks`, and every cuBLAS GEMM of :mod:`.blas` (a recording inside another adds its steps to the
    outer's too). Each step is ``(make, arrays)``: ``make()`` works the step out once, as a callable that takes the
    device addresses of ``arrays`` (the device arrays it was handed, in order) and does the step again on them. What
    a :class:`ReadyCall` is made from."""
    outer = _recording.steps
    inner = _recording.steps = []
    try:
        yield inner
    finally:
        _recording.steps = outer
        if outer is not None:
            outer.extend(inner)


def record(arrays: Sequence[Any], make: Any, *arguments: Any) -> None:
    """Add a step to the recording, if one is active (see :func:`recording`): ``make(*arguments)`` works it out."""
    steps = _recording.steps
    if steps is not None:
        steps.append((functools.partial(make, *arguments), tuple(arrays)))


def _record_launch(kernel: Any, grid: tuple[int, ...], threads: int, shared_bytes: int, args: tuple) -> None:
    ndarray = backend.cupy().ndarray
    arguments = tuple(PER_CALL if isinstance(a, ndarray) else a for a in args)
    make = functools.partial(_packed_at, kernel, grid, (threads,), arguments, shared_bytes)
    _recording.steps.append((make, tuple(a for a in args if isinstance(a, ndarray))))


def _packed_at(kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], arguments: tuple,
               shared_bytes: int) -> Any:
    return PackedLaunch(kernel, grid, block, arguments, shared_bytes).launch_at


class ReadyCall:
    """A primitive call kept for its repeats, which a training step makes with arrays of the same shapes at other
    addresses: the arrays it allocates, then its steps (packed launches, ready GEMMs) with each array address moved to
    the new arrays. A repeat allocates its new arrays and does its steps, without any check or choice.

    Made from a recording (:func:`recording`) of a call whose whole GPU work was those steps: ``inputs``, the call's
    arrays (None entries allowed; a scratch buffer the caller hands it, such as a convolution's workspace, is one),
    passed to each repeat in the same order and laid out the same way (the caller's key holds their shapes and
    strides); ``made``, the C-contiguous arrays the call allocated (outputs and scratch); ``results``, what it
    returned, each one of ``made``. A step may take any view that lies in one of those arrays: it gets the same byte
    offset into the repeat's array. An address in none of them (a copy the call made some other way) refuses the call
    with a ValueError, and it is then simply not kept."""

    __slots__ = ("outputs", "steps", "results", "empty")

    def __init__(self, steps: Sequence[tuple], inputs: Sequence[Any], made: Sequence[Any],
                 results: Sequence[Any]) -> None:
        arrays = [*inputs, *made]
        spans = [(a.data.ptr, a.data.ptr + max(a.nbytes, 1), index) for index, a in enumerate(arrays) if a is not None]

        def place(array: Any) -> tuple[int, int]:
            address = array.data.ptr
            for start, stop, index in spans:
                if start <= address < stop:
                    return index, address - start
            raise ValueError("a step takes an array that lies in no input of the call and in nothing it made")

        for array in made:
            if not array.flags.c_contiguous or array.base is not None:
                raise ValueError("a ready call allocates C-contiguous arrays of its own")
        self.outputs = tuple((tuple(array.shape), array.dtype) for array in made)
        self.steps = tuple((make(), tuple(place(array) for array in step_arrays)) for make, step_arrays in steps)
        self.results = tuple(_index_of(result, arrays) for result in results)
        self.empty = backend.cupy().empty

    def __call__(self, *inputs: Any) -> tuple:
        """The call's results for new ``inputs`` (in the order it was made with)."""
        empty = self.empty
        arrays = (*inputs, *[empty(shape, dtype=dtype) for shape, dtype in self.outputs])
        addresses = [0 if array is None else array.data.ptr for array in arrays]
        for step, places in self.steps:
            step(*[addresses[index] + offset for index, offset in places])
        return tuple(arrays[i] for i in self.results)


def _index_of(result: Any, arrays: Sequence[Any]) -> int:
    for index, candidate in enumerate(arrays):
        if candidate is result:
            return index
    raise ValueError("a ready call returns arrays it made")


class ReadyCalls:
    """A primitive's kept calls by key (its :func:`steady_key` and hyper-parameters), emptied when it reaches ``most``
    keys: a training step repeats each call, and a key whose call could not be kept is remembered as None."""

    def __init__(self, most: int = 1024) -> None:
        self.calls: dict[tuple, ReadyCall | None] = {}
        self.most = most

    def get(self, key: tuple | None) -> "ReadyCall | None":
        return None if key is None else self.calls.get(key)

    def keep(self, key: tuple | None, steps: Sequence[tuple], inputs: Sequence[Any], made: Sequence[Any],
             results: Sequence[Any]) -> None:
        """Keep the call recorded in ``steps`` under ``key`` (see :class:`ReadyCall`), if it can be."""
        if key is None or key in self.calls:
            return
        try:
            ready = ReadyCall(steps, inputs, made, results)
        except (ValueError, TypeError):  # an array it neither took nor made, an argument a packed launch cannot hold
            ready = None
        if len(self.calls) >= self.most:
            self.calls.clear()
        self.calls[key] = ready


class _PerCall:
    def __repr__(self) -> str:
        return "PER_CALL"


PER_CALL = _PerCall()  # in a PackedLaunch's arguments: an array (or None) that each call passes


class PackedLaunch:
    """One kernel launch kept for a call that repeats with its arrays at other addresses, as a training step's calls do.

    The arguments are packed once into host memory, an 8-byte-aligned slot each; a call writes its arrays' addresses
    into their slots and hands the driver the list of slot addresses (``cuLaunchKernel`` copies the values before it
    returns, so the next call may rewrite them). That skips CuPy's conversion of every argument into a new object, the
    larger part of a RawKernel launch's host time for a kernel of many arguments.

    ``arguments``: as a RawKernel takes them: CuPy arrays and None (a null pointer), NumPy scalars and structs
    (``np.void``); :data:`PER_CALL` marks the positions whose arrays (or None) each call passes, in that order.
    A scalar or struct may be rewritten between calls through :meth:`argument_view` (a multi-tensor update's table
    of addresses, its hyper-parameters). ``grid`` and ``block`` are fixed. A call made in another CUDA context than
    the one the launch was packed in (another GPU, a thread without one) goes through CuPy instead, with the same
    arguments. The slots are shared: not for two threads at once (minidnn queues its work on one stream, from one
    thread).
    """

    __slots__ = ("kernel", "grid", "block", "shared_bytes", "arguments", "_slots", "_offsets", "_per_call",
                 "_function", "_context", "_parameters", "_parameters_address", "_launch", "_context_now",
                 "_stream_now")

    def __init__(self, kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], arguments: Sequence[Any],
                 shared_bytes: int = 0) -> None:
        cupy = backend.cupy()
        self.kernel, self.shared_bytes, self.arguments = kernel, shared_bytes, tuple(arguments)
        self.grid, self.block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        offsets, end = [], 0
        for argument in self.arguments:
            if argument is PER_CALL or argument is None or isinstance(argument, cupy.ndarray):
                size = 8  # a device address
            elif isinstance(argument, np.generic):  # np.int32, np.float64, a struct (np.void)
                size = argument.itemsize
            else:
                raise TypeError(f"PackedLaunch arguments are CuPy arrays, None, PER_CALL or NumPy scalars and structs "
                                f"(use i32 and f64 for Python numbers), got {type(argument).__name__}")
            offsets.append(end)
            end += -(-size // 8) * 8
        self._slots = np.zeros(max(end, 8) // 8, dtype=np.uint64)
        raw = self._slots.view(np.uint8)
        for argument, start in zip(self.arguments, offsets):
            if isinstance(argument, cupy.ndarray):
                self._slots[start // 8] = argument.data.ptr
            elif isinstance(argument, np.generic):
                raw[start:start + argument.itemsize] = np.frombuffer(argument.tobytes(), dtype=np.uint8)
        self._offsets = tuple(offsets)
        self._per_call = tuple(start // 8 for argument, start in zip(self.arguments, offsets) if argument is PER_CALL)
        base = self._slots.ctypes.data
        self._parameters = np.array([base + start for start in offsets] or [base], dtype=np.uint64)
        self._parameters_address = self._parameters.ctypes.data
        self._function = getattr(kernel, "kernel", kernel).ptr  # a RawKernel holds its function per device
        driver = cupy.cuda.driver
        self._launch, self._context_now = driver.launchKernel, driver.ctxGetCurrent
        self._context = driver.ctxGetCurrent()
        stream = cupy.cuda.stream
        self._stream_now = getattr(stream, "get_current_stream_ptr", None) or (lambda: stream.get_current_stream().ptr)

    def __call__(self, *arrays: Any) -> None:
        """Launch with ``arrays`` (CuPy arrays or None) in the PER_CALL positions, on the current stream."""
        if len(arrays) != len(self._per_call):
            raise TypeError(f"this launch takes {len(self._per_call)} arrays, got {len(arrays)}")
        if self._context_now() != self._context:  # the scalars and structs as they are now packed
            arrays = iter(arrays)
            self.kernel(self.grid, self.block, tuple(
                next(arrays) if a is PER_CALL else self.argument_view(i)[0] if isinstance(a, np.generic) else a
                for i, a in enumerate(self.arguments)), shared_mem=self.shared_bytes)
            return
        slots = self._slots
        for slot, array in zip(self._per_call, arrays):
            slots[slot] = 0 if array is None else array.data.ptr
        (gx, gy, gz), (bx, by, bz) = self.grid, self.block
        self._launch(self._function, gx, gy, gz, bx, by, bz, self.shared_bytes, self._stream_now(),
                     self._parameters_address, 0)

    def launch_at(self, *addresses: int) -> None:
        """The same launch given the PER_CALL positions' device addresses (0 for a null pointer) instead of arrays:
        what a :class:`ReadyCall` passes for views inside its arrays."""
        if len(addresses) != len(self._per_call):
            raise TypeError(f"this launch takes {len(self._per_call)} addresses, got {len(addresses)}")
        if self._context_now() != self._context:  # CuPy passes a uint64 as the 8 bytes a pointer takes
            self(*[np.uint64(address) for address in addresses])
            return
        slots = self._slots
        for slot, address in zip(self._per_call, addresses):
            slots[slot] = address
        (gx, gy, gz), (bx, by, bz) = self.grid, self.block
        self._launch(self._function, gx, gy, gz, bx, by, bz, self.shared_bytes, self._stream_now(),
                     self._parameters_address, 0)

    def argument_view(self, position: int) -> np.ndarray:
        """Argument ``position`` (a scalar or struct) as packed: a one-element NumPy array of its dtype over its slot,
        so that what is written into it is what the next calls pass."""
        argument = self.arguments[position]
        if not isinstance(argument, np.generic):
            raise TypeError(f"argument {position} is not a scalar or struct, got {argument!r}")
        start = self._offsets[position]
        return self._slots.view(np.uint8)[start:start + argument.itemsize].view(argument.dtype)


def resident_blocks(kernel: Any, threads: int) -> int:
    """How many blocks of ``threads`` threads of ``kernel`` the current GPU runs at once: the blocks an SM holds (by
    the kernel's registers and shared memory, the driver's occupancy count) times the SMs. A grid of at most that
    many runs in one wave."""
    return _resident_blocks_of(current_device(), getattr(kernel, "kernel", kernel).ptr, threads)


@functools.lru_cache(maxsize=None)
def _resident_blocks_of(device_id: int, function: int, threads: int) -> int:
    per_sm = backend.cupy().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function, threads, 0)
    return max(1, per_sm) * _sm_count_of(device_id)


@functools.lru_cache(maxsize=None)
def _sm_count_of(device_id: int) -> int:
    return backend.cupy().cuda.Device(device_id).attributes["MultiProcessorCount"]


def sm_count() -> int:
    """The current device's number of SMs (queried once per device): how many CTAs make a wave."""
    return _sm_count_of(current_device())


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
# few channels fills the GPU: about REDUCTION_BLOCKS_PER_SM blocks per SM in all, none with fewer than
# a minimum of values.
REDUCTION_BLOCKS_PER_SM = 8
MIN_VALUES_PER_BLOCK = 4096


def reduction_split(channels: int, values: int, minimum: int = MIN_VALUES_PER_BLOCK,
                    sms: int | None = None, blocks: int | None = None) -> tuple[int, int]:
    """(splits, per): each channel's ``values`` in ``splits`` ranges of ``per`` values (the last may be
    shorter, none is empty; one split even for no values), for ``sms`` SMs (default: the current device's);
    with ``blocks``, at most that many blocks in all (one split a channel at least): a wave's, resident_blocks."""
    if blocks is None:
        sms = sm_count() if sms is None else sms
        wanted = -(-REDUCTION_BLOCKS_PER_SM * sms // max(channels, 1))
    else:
        wanted = blocks // max(channels, 1)
    splits = max(1, min(wanted, values // minimum))
    per = max(1, -(-values // splits))
    return max(1, -(-values // per)), per


# The per-channel reductions' "last block done" counters (channels.cuh, last_block_of_channel), per GPU: zeroed
# once, and every kernel leaves the counters it used at 0 again, so no launch needs a memset. The batch-norm and
# bias reductions share them, so their kernels must not run at once on two streams (minidnn queues a step's work
# on one stream). An array outgrown by a wider call is kept too: a kept launch or a captured CUDA graph may still
# hold its address.
_counters: dict[int, list] = {}
MIN_COUNTERS = 1024


def block_counters(array: Any, count: int) -> Any:
    """At least ``count`` zeroed uint32 counters on ``array``'s GPU, the same array for every call that fits."""
    device = array.data.device_id
    held = _counters.setdefault(device, [])
    if not held or held[-1].size < count:
        with backend.cupy().cuda.Device(device):
            held.append(backend.cupy().zeros(max(count, MIN_COUNTERS), dtype=np.uint32))
    return held[-1]


def cuda_sources() -> list[str]:
    """Every ``.cu`` file of the package (the primitives' and the naive engine's), relative to
    ``minidnn/primitives`` as :func:`function` takes them (for the nvcc test)."""
    found = []
    for directory, _, names in os.walk(PACKAGE):
        found.extend(os.path.relpath(os.path.join(directory, n), HERE) for n in names if n.endswith(".cu"))
    return sorted(found)


# ----------------------------------------------------------------------------------------------
# TF32 tensor-core math for float32 GEMMs
# ----------------------------------------------------------------------------------------------
# Off by default, as in PyTorch for convolutions' exactness tests: float32 results stay float32.
_tf32_enabled = os.environ.get("MINIDNN_TF32", "0") == "1"


def allow_tf32() -> bool:
    """Whether float32 GEMMs on the GPU may use TF32 tensor cores."""
    return _tf32_enabled


def set_allow_tf32(enabled: bool) -> None:
    """Let float32 GEMMs on the GPU use TF32 tensor cores (10-bit mantissa inputs, fp32 accumulate).

    CuPy reads ``CUPY_TF32`` only once, so the switch sets the compute type of 2-D matmuls and the
    math mode of the cuBLAS handle (used by batched matmuls) directly; see docs/gpu.md.
    """
    global _tf32_enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    _tf32_enabled = enabled
    module = backend.loaded_cupy()
    if module is not None:
        _apply_tf32(module)


@contextlib.contextmanager
def tf32(enabled: bool = True) -> Iterator[None]:
    """Context manager form of :func:`set_allow_tf32`."""
    before = _tf32_enabled
    set_allow_tf32(enabled)
    try:
        yield
    finally:
        set_allow_tf32(before)


def _apply_tf32(module: ModuleType) -> None:
    from cupy._core import _routines_linalg as linalg  # noqa: PLC0415 - CuPy internals, GPU only
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    compute_type = linalg.COMPUTE_TYPE_TF32 if _tf32_enabled else linalg.COMPUTE_TYPE_DEFAULT
    module._core.set_compute_type(module.float32, compute_type)
    cublas_tf32_tensor_op_math, cublas_default_math = 3, 0
    handle = module.cuda.device.get_cublas_handle()
    cublas.setMathMode(handle, cublas_tf32_tensor_op_math if _tf32_enabled else cublas_default_math)


# ----------------------------------------------------------------------------------------------
# GPU memory statistics
# ----------------------------------------------------------------------------------------------
class _PeakTracker:
    """Wraps CuPy's default memory pool to record the high-water mark of bytes in use.

    CuPy's pool has ``used_bytes()`` but no peak, so every allocation goes through ``malloc``
    below, which asks the pool and then records the largest ``used_bytes`` seen. Frees need no
    hook: ``used_bytes`` falls by itself, and the peak only has to rise.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.peak = 0

    def malloc(self, size: int) -> Any:
        memory = self.pool.malloc(size)
        used = self.pool.used_bytes()
        if used > self.peak:
            self.peak = used
        return memory


_tracker: _PeakTracker | None = None


def _install_memory_tracker(module: ModuleType) -> None:
    global _tracker
    _tracker = _PeakTracker(module.get_default_memory_pool())
    module.cuda.set_allocator(_tracker.malloc)


def _on_cupy_import(module: ModuleType) -> None:
    _install_memory_tracker(module)
    _apply_tf32(module)


backend.when_cupy_loads(_on_cupy_import)


def _require_tracker(target: "str | backend.Device | None") -> _PeakTracker:
    if target is not None and backend.device(target).type != "cuda":
        raise ValueError(f"memory statistics are kept for CUDA devices only, got device {target!r}")
    backend.cupy()  # a clear error without CUDA
    assert _tracker is not None
    return _tracker


def memory_allocated(target: "str | backend.Device | None" = None) -> int:
    """Bytes of GPU memory held by live arrays (CuPy's pool ``used_bytes``)."""
    return _require_tracker(target).pool.used_bytes()


def max_memory_allocated(target: "str | backend.Device | None" = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last :func:`reset_peak_memory_stats`."""
    tracker = _require_tracker(target)
    return max(tracker.peak, tracker.pool.used_bytes())


def reset_peak_memory_stats(target: "str | backend.Device | None" = None) -> None:
    """Restart the peak from the bytes in use now."""
    tracker = _require_tracker(target)
    tracker.peak = tracker.pool.used_bytes()


def memory_stats(target: "str | backend.Device | None" = None) -> dict[str, int]:
    """``allocated``, ``peak`` and ``reserved`` (pool total, cached blocks included) in bytes."""
    tracker = _require_tracker(target)
    return {
        "allocated": tracker.pool.used_bytes(),
        "peak": max(tracker.peak, tracker.pool.used_bytes()),
        "reserved": tracker.pool.total_bytes(),
    }
