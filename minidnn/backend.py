"""The backend seam: the one module that knows about devices, NumPy and CuPy.

Every other module asks this one which array module (``numpy`` or ``cupy``) an array belongs to
and moves arrays between devices through it. CuPy is imported lazily, on the first call that
needs it, so ``import minidnn`` works on a machine without CuPy or a GPU and costs nothing there.
What runs on the GPU once CuPy is there (kernels, the TF32 switch, memory statistics) is the CUDA
runtime's, :mod:`minidnn.primitives._cuda`, which asks to hear of CuPy's import through
:func:`when_cupy_loads`.

Device names follow PyTorch: ``"cpu"``, ``"cuda"`` (the current GPU) and ``"cuda:N"``.
"""
from __future__ import annotations

import contextlib
import dataclasses
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np

__all__ = [
    "Device", "device", "cuda_is_available", "cuda_device_count", "cupy", "loaded_cupy", "when_cupy_loads",
    "get_array_module", "device_of", "to_device", "is_cuda_array", "add_at", "on_device", "synchronize",
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
_cupy_ndarray: type | None = None  # cupy.ndarray once CuPy is loaded: what every device check compares with
_cupy_error: str | None = None
_on_load: list[Callable[[ModuleType], None]] = []


def _import_cupy() -> ModuleType | None:
    """Import CuPy once; remember why it failed so the error message can say it."""
    global _cupy_module, _cupy_error, _cupy_ndarray
    if _cupy_module is None and _cupy_error is None:
        try:
            import cupy as module  # noqa: PLC0415 - deliberately lazy

            if module.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("CuPy found no CUDA device")
        except Exception as error:  # ImportError, CUDA driver errors, no device...
            _cupy_error = f"{type(error).__name__}: {error}"
            return None
        # Outside the try: a failure here is a bug to see, not a reason to call CUDA unavailable.
        for callback in _on_load:
            callback(module)
        _cupy_module, _cupy_ndarray = module, module.ndarray
    return _cupy_module


def when_cupy_loads(callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(cupy)`` once CuPy is imported (now, if it already is), before any array exists
    on the GPU: the CUDA runtime installs its memory tracker and math mode this way."""
    _on_load.append(callback)
    if _cupy_module is not None:
        callback(_cupy_module)


def loaded_cupy() -> ModuleType | None:
    """The CuPy module if it has been imported and sees a GPU, else None (never imports it)."""
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
    module = _cupy_module or _import_cupy()  # every GPU primitive asks: the loaded module first, no call
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
    kind = type(array)
    return kind is _cupy_ndarray or (kind is not np.ndarray and kind.__module__.startswith("cupy"))


def device_of(array: Any) -> Device:
    """The device an array lives on."""
    if is_cuda_array(array):
        return Device("cuda", int(array.device.id))
    return CPU


def device_index(array: Any) -> int:
    """The device an array lives on as a plain integer, cheap to hash and compare: -1 for the CPU, else the GPU's
    index (a step that sorts a hundred parameters by device asks once each)."""
    if type(array) is _cupy_ndarray or is_cuda_array(array):
        return array.data.device_id
    return -1


def get_array_module(*arrays: Any) -> ModuleType:
    """``numpy`` or ``cupy`` for the given arrays; mixing devices is a ``ValueError``.

    ``None`` entries and Python scalars are ignored.
    """
    # Every primitive calls this, several times a layer: the one-array case is answered by its type
    # alone; otherwise devices are compared as plain integers (-1 for the CPU, else the GPU's index),
    # and a Device is built only for the error message.
    if len(arrays) == 1:
        kind = type(arrays[0])
        if kind is np.ndarray:
            return np
        if kind is _cupy_ndarray:
            return _cupy_module
    found = None
    for array in arrays:
        kind = type(array)
        if kind is np.ndarray:
            where = -1
        elif kind is _cupy_ndarray:
            where = array.data.device_id
        elif array is None or isinstance(array, (int, float, bool, np.generic)):
            continue
        else:
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
