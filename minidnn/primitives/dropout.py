"""Dropout with a counter-based random generator: the mask is a pure function of (seed, offset).

No RNG state is stored or advanced: element i (C order) of a draw is a hash of (seed, offset + i),
so a mask can be recomputed instead of saved, a draw can be split across devices or kernels, and
the CPU and the GPU (a CUDA kernel computing the same hash per element) give identical masks. The
caller owns the counter: after drawing ``size`` values it passes ``offset + size`` next time, as
PyTorch advances its Philox offset.

The hash is SplitMix64 (Steele, Lea & Flood 2014; Vigna's ``splitmix64.c``), evaluated at a
counter instead of stepped. All arithmetic is on unsigned 64-bit integers modulo 2^64:

    GAMMA       = 0x9E3779B97F4A7C15                    (2^64 / golden ratio, odd)
    mix64(z)    = z ^= z >> 30;  z *= 0xBF58476D1CE4E5B9;
                  z ^= z >> 27;  z *= 0x94D049BB133111EB;
                  z ^ (z >> 31)                         (SplitMix64's finaliser, a bijection)
    key         = mix64(seed)                           (once per call, on the host)
    counter     = offset + i                            (i: the C-order index of the element)
    bits(i)     = mix64(key + (counter + 1)·GAMMA)
    uniform(i)  = (bits(i) >> 40) · 2^-24               (top 24 bits: exact in float32, in [0, 1))
    keep(i)     = (bits(i) >> 40) >= ceil(p · 2^24)     (the same as uniform(i) >= p, in integers)

So element ``counter`` is the (counter + 1)-th output of the standard SplitMix64 generator seeded
with ``key`` (for seed 0, key = 0: Vigna's reference stream itself). The seed goes through mix64
first because SplitMix64 has a single cycle: with key = seed, seeds a multiple of GAMMA apart
(and, since GAMMA/2^64 is the golden ratio, also seeds some Fibonacci-like distance apart) would
replay each other's streams at modest offsets; mixed keys land at unrelated points of the cycle.
The keep test compares integers so that it does not depend on the precision of a float compare
(a float32 p would round 0.1 to 0.10000000149...).

On the GPU (CuPy arrays, or ``xp`` = CuPy for :func:`uniform`) the kernels of dropout.cu compute the
same hash per element, bit for bit: the mask and y come out of one kernel, and no generator state
lives in memory (which is what lets dropout run inside a captured CUDA graph).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from types import ModuleType
from typing import Any

import numpy as np

from .. import backend
from . import _cuda, convert
from ._checks import check_float_or_half, check_int

_MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
_MIX_MULTIPLIER_2 = 0x94D049BB133111EB
UNIFORM_BITS = 24  # float32 has a 24-bit significand: k · 2^-24 is exact for every 24-bit k


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def check_probability(p: Any) -> float:
    """The drop probability: a real number in [0, 1] (F.dropout and nn.Dropout check with this too)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"dropout: p must be a real number in [0, 1], got {p!r}")
    p = float(p)
    if not 0.0 <= p <= 1.0:  # NaN fails too
        raise ValueError(f"dropout: probability p must be in [0, 1], got {p!r}")
    return p


def _check_mask(mask: Any, dy: Any) -> None:
    if getattr(mask, "dtype", None) != bool:
        raise TypeError(f"dropout: mask must be a bool array, got {getattr(mask, 'dtype', type(mask).__name__)}")
    if tuple(mask.shape) != tuple(dy.shape):
        raise ValueError(f"dropout: mask must have dy's shape {tuple(dy.shape)}, got {tuple(mask.shape)}")


def _check_shape(shape: Any) -> tuple[int, ...]:
    values = (shape,) if isinstance(shape, numbers.Integral) and not isinstance(shape, bool) else shape
    try:
        values = tuple(values)
    except TypeError:
        raise TypeError(f"uniform: shape must be an int or a tuple of ints, got {shape!r}") from None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        raise TypeError(f"uniform: shape must be an int or a tuple of ints, got {shape!r}")
    if any(v < 0 for v in values):
        raise ValueError(f"uniform: shape must have non-negative sizes, got {shape!r}")
    return tuple(int(v) for v in values)


# ----------------------------------------------------------------------------------------------
# The counter-based generator
# ----------------------------------------------------------------------------------------------


def _mix64_int(z: int) -> int:
    """SplitMix64's finaliser on one Python int (used once per call, for the key)."""
    z = ((z ^ (z >> 30)) * _MIX_MULTIPLIER_1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX_MULTIPLIER_2) & _MASK64
    return z ^ (z >> 31)


@dataclasses.dataclass(frozen=True)
class DeviceOffset:
    """A counter offset read from the device, so a captured CUDA graph draws new masks at each replay.

    The draw starts ``delta`` counters after an offset whose start value, ``stream_start(seed,
    offset)``, the caller keeps in ``start[0]`` (a uint64 (1,) array on the GPU) and refreshes
    before every replay; the kernel adds delta·GAMMA to it. See :mod:`minidnn.cuda.graphs`.
    """

    start: Any
    delta: int


def stream_start(seed: int, offset: int) -> int:
    """key + (offset + 1)·GAMMA mod 2^64: the hash input of element 0, so bits(i) = mix64(start + i·GAMMA)."""
    return (_mix64_int(seed) + (offset + 1) * GOLDEN_GAMMA) & _MASK64


def _keep_threshold(p: float) -> int:
    """ceil(p·2^24): keep(i) = top-24-bits(i) >= threshold (p·2^24 is exact in float64)."""
    return math.ceil(p * (1 << UNIFORM_BITS))


def _random_bits(size: int, seed: int, offset: int, xp: ModuleType) -> Any:
    """The 64-bit hashes bits(i) for i = 0 .. size − 1 (the module docstring's formula), uint64 (size,).

    The scalar part, key + (offset + 1)·GAMMA, is reduced mod 2^64 in Python ints, so only the
    per-element part runs on arrays, where uint64 arithmetic wraps silently (NumPy warns about
    overflow only for scalar operations, never for arrays). Updates are in place to keep the
    temporaries to two uint64 arrays.
    """
    start = stream_start(seed, offset)
    if xp is not np:
        bits = xp.empty(size, dtype=xp.uint64)
        _launch("dropout_bits", np.float32, size, (bits, np.uint64(start)))
        return bits
    u64 = xp.uint64
    z = xp.arange(size, dtype=u64)
    z *= u64(GOLDEN_GAMMA)
    z += u64(start)
    z ^= z >> u64(30)
    z *= u64(_MIX_MULTIPLIER_1)
    z ^= z >> u64(27)
    z *= u64(_MIX_MULTIPLIER_2)
    z ^= z >> u64(31)
    return z


def _top_bits(size: int, seed: int, offset: int, xp: ModuleType) -> Any:
    """The top 24 bits of each hash as uint32 (size,): the integer k of uniform = k · 2^-24."""
    return (_random_bits(size, seed, offset, xp) >> xp.uint64(64 - UNIFORM_BITS)).astype(xp.uint32)


def uniform(shape: Any, seed: int, offset: int, xp: ModuleType) -> Any:
    """Counter-based uniform draws in [0, 1): float32 array of ``shape`` on ``xp``'s device.

    Element i (C order) is (bits(offset + i) >> 40) · 2^-24 (see the module docstring), so
    ``uniform(shape, seed, offset + k, xp)`` is the tail of a longer draw starting at ``offset``.
    """
    shape = _check_shape(shape)
    seed = check_int(seed, "dropout: seed", 0, (1 << 64) - 1)
    offset = check_int(offset, "dropout: offset", 0)
    if xp is not np:
        u = xp.empty(shape, dtype=xp.float32)
        _launch("dropout_uniform", np.float32, u.size, (u, np.uint64(stream_start(seed, offset))))
        return u
    k = _top_bits(math.prod(shape), seed, offset, xp)
    return (k.astype(xp.float32) * xp.float32(2.0 ** -UNIFORM_BITS)).reshape(shape)


def keep_mask(shape: tuple[int, ...], p: float, seed: int, offset: int, xp: ModuleType) -> Any:
    """keep = uniform >= p, decided on the 24-bit integers (exact: k·2^-24 >= p ⟺ k >= ceil(p·2^24))."""
    threshold = _keep_threshold(p)
    if xp is not np:
        mask = xp.empty(shape, dtype=bool)
        _launch("dropout_mask", np.float32, mask.size,
                (mask, np.uint64(stream_start(seed, offset)), np.uint32(threshold)))
        return mask
    return (_top_bits(math.prod(shape), seed, offset, xp) >= xp.uint32(threshold)).reshape(shape)


# ----------------------------------------------------------------------------------------------
# Dropout
# ----------------------------------------------------------------------------------------------


def _keep_scale(p: float, dtype: Any) -> Any:
    """1/(1 − p) in the array's dtype (0 for p = 1: every element is dropped, nothing to rescale)."""
    return dtype.type(0.0 if p == 1.0 else 1.0 / (1.0 - p))


def dropout_forward(x: Any, p: float, seed: int, offset: int = 0) -> tuple[Any, Any]:
    """y = x·mask/(1 − p) with mask = keep(seed, offset + i) per element (module docstring).

    x: any shape, float32, float64, float16 or bfloat16 (half: float math, one rounding, as the widened
    float32 call rounded back); p in [0, 1] is the drop probability; seed in [0, 2^64) and
    offset >= 0 are ints. Returns y: x's shape and dtype, and mask: bool, x's shape, True = kept
    (save it for the backward, or recompute it from (seed, offset)). The draw uses the counters
    offset .. offset + x.size − 1.
    p == 0: y is a copy of x, mask all True. p == 1: mask all False and y = x·0 (zeros; a NaN or
    inf in x stays NaN, as in PyTorch), no division by zero.
    """
    xp = backend.get_array_module(x)
    check_float_or_half(x, "x")
    p = check_probability(p)
    seed = check_int(seed, "dropout: seed", 0, (1 << 64) - 1)
    if isinstance(offset, DeviceOffset):
        if not backend.is_cuda_array(x):
            raise TypeError("dropout: a DeviceOffset (CUDA-graph capture) needs x on the GPU")
        return _dropout_forward_gpu(x, p, seed, offset)
    offset = check_int(offset, "dropout: offset", 0)
    if backend.is_cuda_array(x):
        return _dropout_forward_gpu(x, p, seed, offset)
    if convert.half_type_of(x) is not None:
        return convert.on_widened_first(dropout_forward, x, p, seed, offset)
    shape = tuple(x.shape)
    if p == 0.0:
        return x.copy(), xp.ones(shape, dtype=bool)
    if p == 1.0:
        return x * x.dtype.type(0), xp.zeros(shape, dtype=bool)
    mask = keep_mask(shape, p, seed, offset, xp)
    # Multiply rather than select, so the semantics are exactly x·mask/(1 − p) (as PyTorch's).
    return x * (mask * _keep_scale(p, x.dtype)), mask


def dropout_backward(dy: Any, mask: Any, p: float) -> Any:
    """dx = dy·mask/(1 − p) (dy·0 for p = 1).

    dy: any shape, float32, float64, float16 or bfloat16; mask: bool of dy's shape, from
    :func:`dropout_forward`. Returns dx: dy's shape and dtype.
    """
    backend.get_array_module(dy, mask)  # one device for both
    check_float_or_half(dy, "dy")
    p = check_probability(p)
    _check_mask(mask, dy)
    if backend.is_cuda_array(dy):
        return _dropout_backward_gpu(dy, mask, p)
    if convert.half_type_of(dy) is not None:
        return convert.on_widened(dropout_backward, dy, mask, p)
    return dy * (mask * _keep_scale(p, dy.dtype))


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of dropout.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------


def _launch(name: str, dtype: Any, count: int, args: tuple, half: str | None = None) -> None:
    """Run kernel ``name`` of dropout.cu, compiled for ``dtype`` (or ``half``'s build for half storage), on
    ``count`` elements (grid-stride); every kernel takes the element count as its last argument."""
    _cuda.check_int32(count)
    kernel = _cuda.element_function("dropout.cu", name, half, dtype)
    _cuda.launch(kernel, count, (*args, _cuda.i32(count)))


def _dropout_forward_gpu(x: Any, p: float, seed: int, offset: "int | DeviceOffset") -> tuple[Any, Any]:
    """mask and y in one launch. p = 0 and p = 1 need no special case: threshold 0 keeps every element
    (y = x·1), threshold 2^24 none (y = x·0, as the NumPy twin's x·0). A :class:`DeviceOffset` reads
    the start from device memory (the kernel variant a CUDA graph replays with new masks)."""
    xp = backend.get_array_module(x)
    x = x if x.flags.c_contiguous else xp.ascontiguousarray(x)  # the hash follows the C-order index
    y = xp.empty(x.shape, dtype=x.dtype)
    mask = xp.empty(x.shape, dtype=bool)
    scale = _keep_scale(p, np.dtype(np.float64))  # rounded to x's dtype in the kernel, as _keep_scale would
    if isinstance(offset, DeviceOffset):
        delta_gamma = np.uint64((offset.delta * GOLDEN_GAMMA) & _MASK64)
        _launch("dropout_forward_from_device", x.dtype, x.size,
                (x, y, mask, offset.start, delta_gamma, np.uint32(_keep_threshold(p)), _cuda.f64(scale)),
                convert.half_type_of(x))
    else:
        _launch("dropout_forward", x.dtype, x.size,
                (x, y, mask, np.uint64(stream_start(seed, offset)), np.uint32(_keep_threshold(p)), _cuda.f64(scale)),
                convert.half_type_of(x))
    return y, mask


def _dropout_backward_gpu(dy: Any, mask: Any, p: float) -> Any:
    xp = backend.get_array_module(dy)
    dy = dy if dy.flags.c_contiguous else xp.ascontiguousarray(dy)
    mask = mask if mask.flags.c_contiguous else xp.ascontiguousarray(mask)
    dx = xp.empty(dy.shape, dtype=dy.dtype)
    _launch("dropout_backward", dy.dtype, dy.size,
            (dy, mask, dx, _cuda.f64(_keep_scale(p, np.dtype(np.float64)))), convert.half_type_of(dy))
    return dx
