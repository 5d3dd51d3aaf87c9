"""The backend seam: the one module that knows about devices, NumPy and CuPy.

Every other module asks this one which array module (``numpy`` or ``cupy``) an array belongs
to, moves arrays between devices through it, and reads GPU memory statistics from it. CuPy is
imported lazily, on the first call that needs it, so ``import minidnn`` works on a machine
without CuPy or a GPU and costs nothing there.

Device names follow PyTorch: ``"cpu"``, ``"cuda"`` (the current GPU) and ``"cuda:N"``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from types import ModuleType
from typing import Any, Iterator

import numpy as np

__all__ = [
    "Device", "device", "cuda_is_available", "cuda_device_count", "cupy", "get_array_module",
    "device_of", "to_device", "is_cuda_array", "add_at", "on_device", "synchronize", "set_allow_tf32", "allow_tf32",
    "tf32", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "memory_stats",
]


@dataclasses.dataclass(frozen=True)
class Device:
    """A device: ``Device("cpu")`` or ``Device("cuda", index)``."""

    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device({str(self)!r})"


CPU = Device("cpu")


def device(spec: "str | Device") -> Device:
    """Parse ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (or pass a :class:`Device` through).

    ``"cuda"`` without an index means GPU 0, as a tensor created there reports ``cuda:0``.
    """
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"device must be a string such as 'cpu', 'cuda' or 'cuda:0', got {type(spec).__name__}")
    name, _, index = spec.strip().lower().partition(":")
    if name == "cpu" and not index:
        return CPU
    if name == "cuda":
        if not index:
            return Device("cuda", 0)
        if index.isdigit():
            return Device("cuda", int(index))
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' with N a GPU index, got {spec!r}")


# ----------------------------------------------------------------------------------------------
# CuPy, imported on first use
# ----------------------------------------------------------------------------------------------
_cupy_module: ModuleType | None = None
_cupy_error: str | None = None


def _import_cupy() -> ModuleType | None:
    """Import CuPy once; remember why it failed so the error message can say it."""
    global _cupy_module, _cupy_error
    if _cupy_module is None and _cupy_error is None:
        try:
            import cupy as module  # noqa: PLC0415 - deliberately lazy

            if module.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("CuPy found no CUDA device")
        except Exception as error:  # ImportError, CUDA driver errors, no device...
            _cupy_error = f"{type(error).__name__}: {error}"
            return None
        # Outside the try: a failure here is a bug to see, not a reason to call CUDA unavailable.
        _install_memory_tracker(module)
        _apply_tf32(module)
        _cupy_module = module
    return _cupy_module


def cuda_is_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return _import_cupy() is not None


def cuda_device_count() -> int:
    """Number of CUDA devices CuPy sees (0 without CuPy)."""
    module = _import_cupy()
    return 0 if module is None else module.cuda.runtime.getDeviceCount()


def cupy() -> ModuleType:
    """The CuPy module, or a clear ``RuntimeError`` saying why CUDA cannot be used."""
    module = _import_cupy()
    if module is None:
        raise RuntimeError(
            "CUDA is not available: install CuPy (pip install -e '.[cuda13]' or '.[cuda12]') on a "
            f"machine with an NVIDIA GPU ({_cupy_error})"
        )
    return module


# ----------------------------------------------------------------------------------------------
# Arrays and devices
# ----------------------------------------------------------------------------------------------
def is_cuda_array(array: Any) -> bool:
    """True for a CuPy array (checked without importing CuPy)."""
    return type(array).__module__.startswith("cupy")


def device_of(array: Any) -> Device:
    """The device an array lives on."""
    if is_cuda_array(array):
        return Device("cuda", int(array.device.id))
    return CPU


def get_array_module(*arrays: Any) -> ModuleType:
    """``numpy`` or ``cupy`` for the given arrays; mixing devices is a ``ValueError``.

    ``None`` entries and Python scalars are ignored.
    """
    # Every primitive calls this, several times a layer: devices are compared as plain integers
    # (-1 for the CPU, else the GPU's index), and a Device is built only for the error message.
    found = None
    for array in arrays:
        if array is None or isinstance(array, (int, float, bool, np.generic)):
            continue
        where = array.data.device_id if is_cuda_array(array) else -1
        if found is None:
            found = where
        elif where != found:
            raise ValueError(f"expected all arrays on one device, got {_device_at(found)} and {_device_at(where)}")
    return np if found is None or found == -1 else cupy()


def _device_at(index: int) -> Device:
    return CPU if index == -1 else Device("cuda", index)


def to_device(array: Any, target: "str | Device") -> Any:
    """Copy ``array`` to ``target`` (no copy when it is already there)."""
    target = device(target)
    if target.type == "cpu":
        return array.get() if is_cuda_array(array) else np.asarray(array)
    module = cupy()
    if target.index >= module.cuda.runtime.getDeviceCount():
        raise ValueError(f"device {target} does not exist: CuPy sees {module.cuda.runtime.getDeviceCount()} GPU(s)")
    if is_cuda_array(array) and array.device.id == target.index:
        return array
    with module.cuda.Device(target.index):
        return module.asarray(array)


@contextlib.contextmanager
def on_device(target: "str | Device") -> Iterator[None]:
    """Make ``target`` the current device for allocations inside the block (no-op on the CPU)."""
    target = device(target)
    if target.type == "cpu":
        yield
        return
    with cupy().cuda.Device(target.index):
        yield


def add_at(target: Any, index: Any, values: Any) -> None:
    """``target[index] += values`` with repeated indices adding up (NumPy's ``np.add.at``)."""
    get_array_module(target).add.at(target, index, values)


def synchronize(target: "str | Device | None" = None) -> None:
    """Wait for all work queued on a GPU (no-op on the CPU)."""
    if target is not None and device(target).type == "cpu":
        return
    module = _import_cupy()
    if module is None:
        return
    index = 0 if target is None else device(target).index
    with module.cuda.Device(index):
        module.cuda.Device(index).synchronize()


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
    if _cupy_module is not None:
        _apply_tf32(_cupy_module)


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


def _require_tracker(target: "str | Device | None") -> _PeakTracker:
    if target is not None and device(target).type != "cuda":
        raise ValueError(f"memory statistics are kept for CUDA devices only, got device {target!r}")
    cupy()  # a clear error without CUDA
    assert _tracker is not None
    return _tracker


def memory_allocated(target: "str | Device | None" = None) -> int:
    """Bytes of GPU memory held by live arrays (CuPy's pool ``used_bytes``)."""
    return _require_tracker(target).pool.used_bytes()


def max_memory_allocated(target: "str | Device | None" = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last :func:`reset_peak_memory_stats`."""
    tracker = _require_tracker(target)
    return max(tracker.peak, tracker.pool.used_bytes())


def reset_peak_memory_stats(target: "str | Device | None" = None) -> None:
    """Restart the peak from the bytes in use now."""
    tracker = _require_tracker(target)
    tracker.peak = tracker.pool.used_bytes()


def memory_stats(target: "str | Device | None" = None) -> dict[str, int]:
    """``allocated``, ``peak`` and ``reserved`` (pool total, cached blocks included) in bytes."""
    tracker = _require_tracker(target)
    return {
        "allocated": tracker.pool.used_bytes(),
        "peak": max(tracker.peak, tracker.pool.used_bytes()),
        "reserved": tracker.pool.total_bytes(),
    }
