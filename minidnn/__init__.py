"""minidnn: a small deep-learning framework on its own cuDNN-like primitives library.

    import minidnn
    import minidnn.nn as nn
    import minidnn.functional as F

Layers: :mod:`minidnn.primitives` (functions on NumPy/CuPy arrays) <- :mod:`minidnn.functional`
(graph nodes) <- :mod:`minidnn.nn` (modules) and :mod:`minidnn.optim`. See docs/architecture.md.
"""
from typing import Any as _Any

import numpy as _np

from ._version import __version__
from . import backend, cuda, functional, nn, optim, primitives
from . import amp
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .backend import Device, device
from .checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from .serialization import load, save
from . import engine
from .engine import get_engine, set_engine, use_engine
from .creation import arange, empty, from_numpy, full, ones, ones_like, rand, randn, zeros, zeros_like
from .autocast_mode import autocast, get_autocast_dtype, is_autocast_enabled
from .memory_format import channels_last, contiguous_format, memory_format, preserve_format
from .tensor import Tensor, argmax, argmin, cat, clamp, clone, flatten, stack, std, tensor, topk, var, where
from .random import get_rng_state, manual_seed, set_rng_state
from .primitives.conv.registry import are_deterministic_algorithms_enabled, use_deterministic_algorithms


float16, float32, float64 = _np.float16, _np.float32, _np.float64
int8, int16, int32, int64, uint8, bool_ = _np.int8, _np.int16, _np.int32, _np.int64, _np.uint8, _np.bool_
half, float, double, long = float16, float32, float64, int64  # noqa: A001 - PyTorch's aliases

__all__ = [
    "Tensor", "tensor", "no_grad", "enable_grad", "inference_mode", "set_grad_enabled", "is_grad_enabled", "device",
    "Device", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "rand", "randn", "arange", "from_numpy", "cat",
    "stack", "where", "argmax", "argmin", "clamp", "clone", "topk", "var", "std", "flatten", "manual_seed",
    "get_rng_state", "set_rng_state", "use_deterministic_algorithms",
    "are_deterministic_algorithms_enabled", "amp", "backend", "cuda", "functional", "nn",
    "optim", "primitives", "engine", "use_engine", "set_engine", "get_engine", "save_checkpoint", "load_checkpoint", "read_checkpoint", "save", "load", "autocast",
    "is_autocast_enabled", "get_autocast_dtype", "channels_last", "contiguous_format", "preserve_format",
    "memory_format", "bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool_",
]


def __getattr__(name: str) -> _Any:
    # minidnn.bfloat16: ml_dtypes' bfloat16 (a GPU tensor stores it as uint16 words), imported when first asked
    # for, since ml_dtypes' import takes most of a second (minidnn/tensor.py).
    if name == "bfloat16":
        return primitives.convert.bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "bfloat16"})
