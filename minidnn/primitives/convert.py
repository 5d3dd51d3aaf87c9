"""Converting float32 to the half types bfloat16 and float16 and back: storage for mixed precision, where the
arithmetic stays float32. Rounding to nearest, ties to even, bit for bit as ml_dtypes (bfloat16) and NumPy
(float16) round, NaNs included; the way back is exact.

    float_to_half(x, dtype)   x: float32, any shape  ->  the same shape in dtype's storage
    half_to_float(h, dtype)   h: dtype's storage      ->  float32, the same shape

``dtype`` is ``"bfloat16"`` or ``"float16"`` (or the NumPy dtype of either). Storage:

* on the CPU, ``ml_dtypes.bfloat16`` arrays (a well-kept NumPy dtype library) and NumPy ``float16`` arrays;
* on the GPU, CuPy ``float16`` arrays, and for bfloat16, which CuPy has no dtype for, ``uint16`` arrays of the
  bfloat16 words (the top 16 bits of the float32 each value rounds from).

The rounding, as convert.cu does it per element on the GPU, with the NumPy twins below:

* bfloat16 keeps float32's sign, its 8 exponent bits and the top 7 of its 23 fraction bits. Adding 0x7fff to the
  32 bits, plus 1 where the bit that will be the last one kept is set, and keeping the top 16 rounds to the
  nearest word, a tie to the even one, and the largest floats up to infinity. A NaN becomes the quiet NaN
  0x7fc0 with its sign (the addition would otherwise make some NaNs infinities).
* float16 has 5 exponent bits and 10 fraction bits: magnitudes from 65520 round to infinity, below 2^-14 the
  result is a subnormal multiple of 2^-24, and below 2^-25 it is a signed zero. The GPU's conversion
  instruction rounds to nearest even in all three; a NaN keeps its sign and top 10 fraction bits (made
  non-zero), as NumPy's own conversion, the CPU twin, does.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import backend
from . import _cuda, layout

HALF_TYPES = ("bfloat16", "float16")
_FULL_PRECISION = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
_SOURCE = "convert.cu"


@functools.lru_cache(maxsize=None)  # asked for on every GPU bfloat16 tensor's dtype
def bfloat16() -> np.dtype:
    """The CPU's bfloat16 dtype (``ml_dtypes.bfloat16``), imported when first asked for."""
    try:
        import ml_dtypes  # noqa: PLC0415 - only bfloat16 on the CPU needs it
    except ImportError as error:
        raise RuntimeError("bfloat16 on the CPU needs ml_dtypes (pip install ml_dtypes; minidnn depends on it)") \
            from error
    return np.dtype(ml_dtypes.bfloat16)


def half_type(dtype: Any) -> str:
    """``"bfloat16"`` or ``"float16"`` for a name or a NumPy dtype of either; otherwise a ``ValueError``."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in HALF_TYPES:
        raise ValueError(f"dtype must be one of {HALF_TYPES} (a name or a NumPy dtype), got {dtype!r}")
    return name


# (dtype, on_gpu) -> stored_half_type's answer: a half step asks hundreds of times, of a few dtypes.
_stored_half_types: dict[tuple[Any, bool], str | None] = {}


def stored_half_type(dtype: Any, on_gpu: bool) -> str | None:
    """``"float16"`` or ``"bfloat16"`` when ``dtype`` is the storage of a half type (see the module docstring:
    bfloat16 is ``ml_dtypes.bfloat16`` on the CPU and uint16 words on the GPU), None for any other dtype."""
    if dtype in _FULL_PRECISION:  # the common case first: every float32 primitive call asks
        return None
    key = (dtype, on_gpu)
    try:
        return _stored_half_types[key]
    except KeyError:
        found = _stored_half_types[key] = _half_type_of_storage(np.dtype(dtype), on_gpu)
        return found


def _half_type_of_storage(dtype: np.dtype, on_gpu: bool) -> str | None:
    if dtype == np.float16:
        return "float16"
    if (on_gpu and dtype == np.uint16) or (not on_gpu and dtype.name == "bfloat16"):
        return "bfloat16"
    return None


def half_type_of(array: Any) -> str | None:
    """``"float16"`` or ``"bfloat16"`` when ``array`` holds half values in its device's storage, else None: how
    a primitive that takes half precision tells a half call from a full-precision one."""
    return stored_half_type(array.dtype, backend.is_cuda_array(array))


def storage_dtype(dtype: Any, xp: Any) -> np.dtype:
    """The dtype half values of ``dtype`` are stored in on ``xp``'s device (see the module docstring)."""
    name = half_type(dtype)
    if name == "float16":
        return np.dtype(np.float16)
    return bfloat16() if xp is np else np.dtype(np.uint16)


# ----------------------------------------------------------------------------------------------
# The NumPy twins of convert.cu
# ----------------------------------------------------------------------------------------------
def bfloat16_words(x: Any) -> Any:
    """The bfloat16 words (uint16) of float32 ``x``, rounded as convert.cu's ``bfloat16_word``; whole-array
    operations, so the same code runs on a CuPy array (the naive engine's way)."""
    xp = backend.get_array_module(x)
    bits = xp.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    with np.errstate(over="ignore"):  # NaNs may wrap around 2^32 here: they are replaced below
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return xp.where(nan, ((bits >> 16) & np.uint32(0x8000)) | np.uint32(0x7FC0), rounded).astype(np.uint16)


def float_from_bfloat16_words(words: Any) -> Any:
    """float32 values of bfloat16 ``words`` (uint16): each word is the top half of its float32, exactly."""
    xp = backend.get_array_module(words)
    return (xp.ascontiguousarray(words, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------------------------
# The conversions
# ----------------------------------------------------------------------------------------------
def _output(out: Any, shape: tuple, dtype: np.dtype, xp: Any, channels_last: bool = False) -> Any:
    """``out`` checked, or a new array: channels-last when the source is (a cast keeps the layout)."""
    if out is None:
        return layout.empty(shape, dtype, xp, channels_last)
    if backend.get_array_module(out) is not xp or tuple(out.shape) != shape or out.dtype != dtype \
            or not (out.flags.c_contiguous or layout.is_channels_last(out)):
        raise ValueError(f"out must be a C-contiguous or channels-last {dtype} array of shape {shape} on the "
                         f"input's device, "
                         f"got {getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    return out


def _launch(kernel: str, source: Any, out: Any) -> None:
    """An element-wise conversion on the GPU: source and out walked as flat buffers of one layout, out's (a
    source in another is laid out as out first; out is never replaced, since it is what the caller reads)."""
    (source,), _ = layout.common((source,), out)
    _cuda.check_int32(source)
    _cuda.launch(_cuda.function(_SOURCE, kernel, np.float32), source.size,
                 (layout.flat(source), layout.flat(out), _cuda.i32(source.size)))


def checked_to_half(x: Any, dtype: Any, out: Any) -> tuple[str, Any, Any]:
    """:func:`float_to_half`'s checks: (the half type's name, x's array module, the output array)."""
    name = half_type(dtype)
    xp = backend.get_array_module(x)
    if getattr(x, "dtype", None) != np.float32:
        raise TypeError(f"float_to_half: x must be a float32 array, got {getattr(x, 'dtype', type(x).__name__)}")
    return name, xp, _output(out, tuple(x.shape), storage_dtype(name, xp), xp, layout.is_channels_last(x))


def checked_to_float(h: Any, dtype: Any, out: Any) -> tuple[str, Any, Any]:
    """:func:`half_to_float`'s checks: (the half type's name, h's array module, the output array)."""
    name = half_type(dtype)
    xp = backend.get_array_module(h)
    expected = storage_dtype(name, xp)
    if getattr(h, "dtype", None) != expected:
        raise TypeError(f"half_to_float: h must be a {expected} array holding {name} on its device, got "
                        f"{getattr(h, 'dtype', type(h).__name__)}")
    return name, xp, _output(out, tuple(h.shape), np.dtype(np.float32), xp, layout.is_channels_last(h))


def to_half_by_expressions(name: str, x: Any, result: Any) -> Any:
    """x rounded into ``result`` (the storage of half type ``name``) with whole-array operations: the CPU's
    conversion, and the naive engine's on either device. float16 is the array library's own conversion (it
    rounds to nearest even), bfloat16 the twin :func:`bfloat16_words`."""
    if name == "float16":
        with np.errstate(over="ignore", invalid="ignore"):  # to infinity, or a NaN: what rounding gives
            result[...] = x
    else:
        result.view(np.uint16)[...] = bfloat16_words(x)
    return result


def to_float_by_expressions(name: str, h: Any, result: Any) -> Any:
    """The float32 values of ``h`` (half type ``name``'s storage) into ``result``, with whole-array operations."""
    xp = backend.get_array_module(h)
    result[...] = float_from_bfloat16_words(xp.ascontiguousarray(h).view(np.uint16)) if name == "bfloat16" else h
    return result


def float_to_half(x: Any, dtype: Any, out: Any = None) -> Any:
    """x (float32, any shape) rounded to ``dtype`` (``"bfloat16"`` or ``"float16"``), to nearest even; returns
    an array of x's shape in the storage of the module docstring (written into ``out`` when given)."""
    name, xp, result = checked_to_half(x, dtype, out)
    if xp is np:
        return to_half_by_expressions(name, x, result)
    _launch("float_to_bfloat16" if name == "bfloat16" else "float_to_float16", x, result)
    return result


def half_to_float(h: Any, dtype: Any, out: Any = None) -> Any:
    """float32 values (exact) of ``h``, an array of ``dtype``'s storage (module docstring), any shape; written
    into ``out`` when given."""
    name, xp, result = checked_to_float(h, dtype, out)
    if xp is np:
        return to_float_by_expressions(name, h, result)
    _launch("bfloat16_to_float" if name == "bfloat16" else "float16_to_float", h, result)
    return result


def on_widened(function: Any, array: Any, *args: Any) -> Any:
    """``function(array widened to float32, *args)`` rounded back to array's half type once: float math and
    one rounding, what a half kernel gives (the NumPy twins of the half kernels, and engines without them)."""
    name = half_type_of(array)
    return float_to_half(function(half_to_float(array, name), *args), name)


def on_widened_first(function: Any, array: Any, *args: Any) -> tuple[Any, ...]:
    """:func:`on_widened` for a function returning (result, record, ...): the result rounded back, the records
    (max pooling's indices, dropout's mask) as they are."""
    name = half_type_of(array)
    result, *records = function(half_to_float(array, name), *args)
    return (float_to_half(result, name), *records)


# ----------------------------------------------------------------------------------------------
# Any dtype to any dtype, and across devices, with bfloat16 held in its device's storage
# ----------------------------------------------------------------------------------------------
def is_bfloat16_words(array: Any) -> bool:
    """True for a GPU array of bfloat16 words (uint16 on the GPU is never anything else to minidnn)."""
    return array.dtype == np.uint16 and backend.is_cuda_array(array)


def cast(array: Any, dtype: Any) -> Any:
    """``array`` (any shape) as a new array of ``dtype``, a NumPy dtype or ``ml_dtypes.bfloat16``; bfloat16
    in its device's storage (module docstring), whichever side of the cast it is on.

    NumPy converts every pair itself (float16 and ml_dtypes' bfloat16 round to nearest even), and CuPy every
    pair without a half type. On the GPU the half types go through float32 and convert.cu, so that the bits
    are the CPU's, NaNs included (CuPy's own float16 conversion makes every NaN 0x7fff). A float64 or integer
    source is rounded to float32 first there: two roundings, which differ from one in rare ties.
    """
    dtype = np.dtype(dtype)
    if backend.is_cuda_array(array):
        source = stored_half_type(array.dtype, on_gpu=True)
        target = dtype.name if dtype.name in HALF_TYPES else None
        if source is not None and source == target:
            return array.copy(order="K")  # the layout kept, as every cast keeps it
        if source is not None:
            wide = half_to_float(array, source)
            return wide if target is None and dtype == np.float32 else cast(wide, dtype)
        if target is not None:
            return float_to_half(array.astype(np.float32, copy=False), target)
    with np.errstate(over="ignore"):  # a value beyond float16's range becomes infinity: the rounding, not an error
        return array.astype(dtype)


def to_device(array: Any, target: Any) -> Any:
    """:func:`minidnn.backend.to_device` that keeps bfloat16 values bfloat16: uint16 words on the GPU,
    ``ml_dtypes.bfloat16`` on the CPU (the same 16 bits each)."""
    on_gpu = backend.is_cuda_array(array)
    if stored_half_type(array.dtype, on_gpu) != "bfloat16":
        return backend.to_device(array, target)
    moved = backend.to_device(array.view(np.uint16), target)
    return moved if backend.is_cuda_array(moved) else moved.view(bfloat16())


def add(a: Any, b: Any) -> Any:
    """a + b for two arrays of one dtype; bfloat16 words on the GPU are added in float32 and rounded once
    (as ml_dtypes adds bfloat16 on the CPU): one kernel of convert.cu for two arrays of one shape (a
    gradient's two parts; eight words an access where all three are 16-byte aligned), subnormals kept as
    ml_dtypes keeps them; else widened, added with broadcasting (CuPy's kernel, which flushes subnormal sums:
    CuPy compiles with -ftz=true) and rounded. Other dtypes: :func:`layout.add`. The sum is laid out as ``a`` is
    (PyTorch's rule, and layout.add's), whatever b's layout."""
    if not is_bfloat16_words(a):
        return layout.add(a, b)
    if a.shape != b.shape:
        return float_to_half(half_to_float(a, "bfloat16") + half_to_float(b, "bfloat16"), "bfloat16")
    xp = backend.get_array_module(a, b)
    # The kernel walks all three as flat buffers: b (and a strided a) laid out as a first (layout.common's rule).
    (a, b), channels_last = layout.common((a, b))
    out = layout.empty(a.shape, np.uint16, xp, channels_last)
    _cuda.check_int32(a)
    width = _cuda.elements_per_access((a, b, out))
    _cuda.launch(_cuda.function(_SOURCE, _cuda.pack_build("add_bfloat16", width), np.float32), -(-a.size // width),
                 (layout.flat(a), layout.flat(b), layout.flat(out), _cuda.i32(a.size)))
    return out
