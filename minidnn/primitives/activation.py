"""Element-wise activations: ReLU, sigmoid and tanh, forward and backward, a residual add fused
with its ReLU, and the activations of newer networks: leaky ReLU, SiLU (swish) and GELU.

Every function works on arrays of any shape and keeps the input dtype (float32 or float64).
The backward functions of ReLU, sigmoid and tanh take the forward *output* y rather than the input
x, as cuDNN's activation backward does: all three derivatives are cheap functions of y, so the
caller keeps one array per layer instead of two. SiLU's and GELU's derivatives are not functions of
y, so their backward takes x; leaky ReLU's takes x, or y when the slope is >= 0 (y then has x's
signs: the in-place form). ReLU, leaky ReLU and SiLU can write into a given ``out``, the input
itself included (in place), so a framework can spare the allocation where autograd allows it.

On CuPy arrays each function is one launch of a kernel of ``activation.cu`` (one thread per
element); the results are those of the NumPy code below, up to the rounding of exp, tanh and erf.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from . import _cuda, convert, layout
from ._checks import (check_dense, check_float, check_float_or_half, check_gradient_part, check_real, check_same_dtype,
                      check_same_shape)
from ._select import where_or_zero

__all__ = ["relu_forward", "relu_backward", "add_relu_forward", "sigmoid_forward", "sigmoid_backward",
           "tanh_forward", "tanh_backward", "leaky_relu_forward", "leaky_relu_backward", "silu_forward",
           "silu_backward", "gelu_forward", "gelu_backward"]

GELU_APPROXIMATIONS = ("none", "tanh")
RSQRT_2 = 1 / math.sqrt(2.0)  # Φ(x) = (1 + erf(x/√2))/2
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # the tanh approximation's scale
GELU_TANH_CUBIC = 0.044715  # ... and its cubic coefficient (Hendrycks & Gimpel 2016)


def _check_out(out: Any, like: Any, like_name: str) -> None:
    """``out`` (when given) must be a C-contiguous array of ``like``'s shape and dtype, on its device."""
    if out is None:
        return
    check_float(out, "out")
    check_same_shape(out, like, "out", like_name)
    check_same_dtype(out, like, "out", like_name)
    check_dense(out, "out")
    backend.get_array_module(out, like)  # one device, or a clear ValueError


def relu_forward(x: Any, out: Any = None) -> Any:
    """y = max(x, 0). x: any shape; returns y: x's shape and dtype.

    out: None (y is a new array) or a C-contiguous array of x's shape and dtype that y is written
    into and returned; ``out=x`` is the in-place ReLU. Any other out must not overlap x.
    float16 and bfloat16 too (exact: the result is one of x's values or 0).
    """
    key, kept = _kept_call("relu_forward", x) if out is None else (None, None)
    if kept is not None:
        return _run_kept(kept, x)
    half = convert.half_type_of(x)
    if half is not None:
        _check_half_arrays(("x", x), out=out)
        if backend.is_cuda_array(x):
            return _elementwise_gpu("relu_forward", x, out=out, half=half, key=key)
        wide = convert.half_to_float(x, half)  # in x's layout, which the result keeps
        return _rounded_into(np.maximum(wide, np.float32(0)), half, out)
    check_float(x, "x")
    _check_out(out, x, "x")
    if backend.is_cuda_array(x):
        return _elementwise_gpu("relu_forward", x, out=out, key=key)
    xp = backend.get_array_module(x)
    return xp.maximum(x, xp.zeros((), dtype=x.dtype), out=out)


def relu_backward(dy: Any, y: Any, dy_other: Any = None) -> Any:
    """dx = dy where y > 0, else 0. dy, y: same shape; returns dx: that shape.

    The gradient at x = 0 is taken as 0, as PyTorch does; y > 0 exactly when x > 0, so y is
    enough to tell which inputs passed. float16 and bfloat16 too (dx holds dy's own values or 0).

    dy_other: None, or a second part of y's gradient (dy's shape and dtype), for a y that fed two operations, as a
    residual block's output feeds the next block's convolution and its shortcut: dx = (dy + dy_other) where y > 0,
    the sum rounded to the dtype as ``relu_backward(dy + dy_other, y)`` rounds it (a half sum in float32, rounded
    once), in one pass over the four arrays where the sum and the mask apart take two over six.
    """
    # The one gradient's kernel, or the two parts' (their kept launches under names of their own).
    name, arrays = ("relu_backward", (dy, y)) if dy_other is None else ("relu_backward_sum", (dy, y, dy_other))
    key, kept = _kept_call(name, *arrays)
    if kept is not None:
        return _run_kept(kept, *arrays)
    half = convert.half_type_of(dy)
    if half is not None:
        _check_half_arrays(*zip(("dy", "y", "dy_other"), arrays))
        if backend.is_cuda_array(dy):
            return _elementwise_gpu(name, *arrays, half=half, key=key)
        # Two parts' half sum is rounded once from float32 (ml_dtypes' add)
        return _where_positive(convert.half_to_float(y, half), dy if dy_other is None else dy + dy_other, arrays)
    _check_gradient_pair(dy, y, "y")  # one device, or a clear ValueError
    if dy_other is not None:
        check_gradient_part(dy_other, dy, "dy_other", "dy")
    if backend.is_cuda_array(dy):
        return _elementwise_gpu(name, *arrays, key=key)
    return _where_positive(y, dy if dy_other is None else dy + dy_other, arrays)


def _where_positive(y: Any, gradient: Any, operands: tuple) -> Any:
    """gradient where y > 0, else 0 (NumPy), laid out as an element-wise result of ``operands`` (PyTorch's rule, as
    the GPU's kernels: the first operand's layout), whatever NumPy's iterator picked for mixed layouts."""
    return layout.like(where_or_zero(y > 0, gradient), layout.leads_channels_last(operands))


def _new_like(a: Any, b: Any) -> Any:
    """An empty array of a's shape and dtype, in the layout an element-wise result of (a, b) takes."""
    return layout.empty(a.shape, a.dtype, backend.get_array_module(a), layout.leads_channels_last((a, b)))


def add_relu_forward(a: Any, b: Any, out: Any = None) -> Any:
    """y = max(a + b, 0): a residual connection and the ReLU after it, in one pass.

    a, b: one shape and dtype (no broadcasting); returns y of that shape. out: None (a new array) or
    a C-contiguous array of a's shape and dtype, returned; ``out=a`` (or ``b``) adds in place.
    The sum is rounded to the dtype before the ReLU, as relu_forward(a + b) rounds it.

    There is no add_relu_backward: the gradient is :func:`relu_backward` (dy, y) with this y (and its dy_other where y
    fed two operations), and the same array flows to both a and b (the add's gradient is the identity for each input).
    float16 and bfloat16: the sum in float32, rounded once after the ReLU.
    """
    key, kept = _kept_call("add_relu_forward", a, b) if out is None else (None, None)
    if kept is not None:
        return _run_kept(kept, a, b)
    half = convert.half_type_of(a)
    if half is not None:
        _check_half_arrays(("a", a), ("b", b), out=out)
        if backend.is_cuda_array(a):
            return _elementwise_gpu("add_relu_forward", a, b, out=out, half=half, key=key)
        wide = convert.half_to_float(a, half) + convert.half_to_float(b, half)
        wide = layout.like(wide, layout.leads_channels_last((a, b)))  # the first operand's layout, as the GPU's
        return _rounded_into(np.maximum(wide, np.float32(0)), half, out)
    _check_add_relu_arguments(a, b, out)
    xp = backend.get_array_module(a, b)
    if backend.is_cuda_array(a):
        return _elementwise_gpu("add_relu_forward", a, b, out=out, key=key)
    y = _new_like(a, b) if out is None else out  # (xp.add(a, b) of 0-d arrays would give a scalar)
    xp.add(a, b, out=y)
    return xp.maximum(y, xp.zeros((), dtype=y.dtype), out=y)


def _check_add_relu_arguments(a: Any, b: Any, out: Any) -> None:
    check_float(a, "a")
    check_float(b, "b")
    check_same_dtype(a, b, "a", "b")
    check_same_shape(b, a, "b", "a")
    _check_out(out, a, "a")


def sigmoid_forward(x: Any) -> Any:
    """y = 1 / (1 + exp(−x)). x: any shape; returns y: x's shape and dtype.

    exp is only ever taken of −|x| ≤ 0, so it cannot overflow: for x ≥ 0 use 1 / (1 + e^−x), for
    x < 0 the equal form e^x / (1 + e^x). Large |x| then saturates to exactly 0 or 1 silently.
    """
    check_float(x, "x")
    if backend.is_cuda_array(x):
        return _elementwise_gpu("sigmoid_forward", x)
    xp = backend.get_array_module(x)
    decay = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + decay), decay / (1 + decay))


def sigmoid_backward(dy: Any, y: Any) -> Any:
    """dx = dy · y · (1 − y). dy, y: same shape; returns dx: that shape."""
    _check_gradient_pair(dy, y, "y")
    backend.get_array_module(dy, y)  # one device, or a clear ValueError
    if backend.is_cuda_array(dy):
        return _elementwise_gpu("sigmoid_backward", dy, y)
    return dy * y * (1 - y)


def tanh_forward(x: Any) -> Any:
    """y = tanh(x). x: any shape; returns y: x's shape and dtype."""
    check_float(x, "x")
    if backend.is_cuda_array(x):
        return _elementwise_gpu("tanh_forward", x)
    return backend.get_array_module(x).tanh(x)


def tanh_backward(dy: Any, y: Any) -> Any:
    """dx = dy · (1 − y²). dy, y: same shape; returns dx: that shape."""
    _check_gradient_pair(dy, y, "y")
    backend.get_array_module(dy, y)  # one device, or a clear ValueError
    if backend.is_cuda_array(dy):
        return _elementwise_gpu("tanh_backward", dy, y)
    return dy * (1 - y * y)


# ----------------------------------------------------------------------------------------------
# Leaky ReLU, SiLU, GELU
# ----------------------------------------------------------------------------------------------
def check_negative_slope(negative_slope: Any) -> float:
    """Leaky ReLU's slope for x <= 0: any finite real number (PyTorch allows negative ones)."""
    return check_real(negative_slope, "negative_slope")


def check_gelu_approximation(approximate: Any) -> str:
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


def _check_gradient_pair(dy: Any, x: Any, name: str) -> None:
    """dy and x (or y) must be float arrays of one shape and one dtype, on one device."""
    check_float(dy, "dy")
    check_float(x, name)
    check_same_dtype(dy, x, "dy", name)
    if dy.shape != x.shape:
        raise ValueError(f"dy and {name} must have the same shape, got {tuple(dy.shape)} and {tuple(x.shape)}")
    backend.get_array_module(dy, x)


def leaky_relu_forward(x: Any, negative_slope: float = 0.01, out: Any = None) -> Any:
    """y = x where x > 0, else negative_slope·x. x: any shape; returns y: x's shape and dtype.

    out: None (a new array) or a C-contiguous array of x's shape and dtype, returned; ``out=x`` runs
    in place.
    """
    check_float(x, "x")
    negative_slope = check_negative_slope(negative_slope)
    _check_out(out, x, "x")
    if backend.is_cuda_array(x):
        return _elementwise_gpu("leaky_relu_forward", x, out=out, scalars=(negative_slope,))
    xp = backend.get_array_module(x)
    y = xp.where(x > 0, x, x * x.dtype.type(negative_slope))
    if out is None:
        return y
    out[...] = y
    return out


def leaky_relu_backward(dy: Any, x: Any, negative_slope: float = 0.01) -> Any:
    """dx = dy where x > 0, else negative_slope·dy (at x = 0 the slope, as PyTorch). dy, x: one shape.

    For negative_slope >= 0 the forward's output y may be passed as x: it has x's signs.
    """
    _check_gradient_pair(dy, x, "x")
    negative_slope = check_negative_slope(negative_slope)
    if backend.is_cuda_array(dy):
        return _elementwise_gpu("leaky_relu_backward", dy, x, scalars=(negative_slope,))
    xp = backend.get_array_module(dy, x)
    return xp.where(x > 0, dy, dy * dy.dtype.type(negative_slope))


def _sigmoid(x: Any) -> Any:
    """σ(x) with exp taken of −|x| only (see :func:`sigmoid_forward`)."""
    xp = backend.get_array_module(x)
    decay = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + decay), decay / (1 + decay))


def silu_forward(x: Any, out: Any = None) -> Any:
    """y = x·σ(x) (SiLU, swish). x: any shape; returns y: x's shape and dtype; ``out`` as for
    :func:`leaky_relu_forward` (``out=x`` in place: the caller keeps x if its backward needs it)."""
    check_float(x, "x")
    _check_out(out, x, "x")
    if backend.is_cuda_array(x):
        return _elementwise_gpu("silu_forward", x, out=out)
    y = x * _sigmoid(x)
    if out is None:
        return y
    out[...] = y
    return out


def silu_backward(dy: Any, x: Any) -> Any:
    """dx = dy·σ(x)·(1 + x·(1 − σ(x))). dy, x: one shape; returns dx: that shape."""
    _check_gradient_pair(dy, x, "x")
    if backend.is_cuda_array(dy):
        return _elementwise_gpu("silu_backward", dy, x)
    s = _sigmoid(x)
    return dy * s * (1 + x * (1 - s))


def erf(x: np.ndarray) -> np.ndarray:
    """The error function of a NumPy array, in float64. NumPy has none; the standard library's
    ``math.erf``, applied element by element, is accurate to an ulp, and this is the CPU path only
    (the GPU kernels call CUDA's erf)."""
    return np.frompyfunc(math.erf, 1, 1)(np.asarray(x, dtype=np.float64)).astype(np.float64)


def gelu_forward(x: Any, approximate: str = "none") -> Any:
    """y = x·Φ(x), Φ the standard normal CDF: 0.5·x·(1 + erf(x/√2)); with ``approximate="tanh"``
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), PyTorch's two forms. x: any shape; returns y: x's
    shape and dtype."""
    check_float(x, "x")
    approximate = check_gelu_approximation(approximate)
    if backend.is_cuda_array(x):
        return _elementwise_gpu("gelu_forward" if approximate == "none" else "gelu_tanh_forward", x)
    if approximate == "tanh":
        return x * _gelu_tanh_terms(x)[0]
    return (x * (1 + erf(x * x.dtype.type(RSQRT_2))) / 2).astype(x.dtype)


def _gelu_tanh_terms(x: Any) -> tuple[Any, Any, Any]:
    """(σ(2u), σ(−2u), du/dx) of GELU's tanh form, u = √(2/π)·(x + 0.044715·x³), as activation.cu computes
    them: (1 + tanh(u))/2 = σ(2u), through e = exp(−2|u|) <= 1, so that no term is 1 minus nearly 1 (which
    cancels to a few correct bits where x is very negative)."""
    scale, cubic = x.dtype.type(SQRT_2_OVER_PI), x.dtype.type(GELU_TANH_CUBIC)
    u = scale * (x + cubic * x * x * x)
    e = np.exp(x.dtype.type(-2) * np.abs(u))
    near, far = 1 / (1 + e), e / (1 + e)
    positive = u >= 0
    return np.where(positive, near, far), np.where(positive, far, near), scale * (1 + 3 * cubic * x * x)


def gelu_backward(dy: Any, x: Any, approximate: str = "none") -> Any:
    """dx = dy·(Φ(x) + x·φ(x)), φ the standard normal density; for ``approximate="tanh"`` the
    derivative of the tanh form, with t = tanh(u), u = √(2/π)·(x + 0.044715·x³):
    dy·((1 + t)/2 + x/2·(1 − t²)·u'), computed as dy·(σ(2u) + 2x·σ(2u)·σ(−2u)·u'). dy, x: one shape;
    returns dx."""
    _check_gradient_pair(dy, x, "x")
    approximate = check_gelu_approximation(approximate)
    if backend.is_cuda_array(dy):
        return _elementwise_gpu("gelu_backward" if approximate == "none" else "gelu_tanh_backward", dy, x)
    if approximate == "tanh":
        sigma, complement, slope = _gelu_tanh_terms(x)
        return dy * (sigma + 2 * x * sigma * complement * slope)
    cdf = (1 + erf(x * x.dtype.type(RSQRT_2))) / 2
    density = np.exp(-(x.astype(np.float64) ** 2) / 2) / math.sqrt(2 * math.pi)
    return (dy * (cdf + x * density)).astype(dy.dtype)


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of activation.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
def _check_half_arrays(*named: tuple[str, Any], out: Any = None) -> None:
    """Half-precision arrays of one type, shape and device, and ``out`` (when given) like the first. (The
    public ReLU functions take half precision; the naive engine's, which share the float checks, do not.)"""
    (first_name, first), *others = named
    for name, array in named:
        check_float_or_half(array, name)
    for name, array in others + ([("out", out)] if out is not None else []):
        check_same_dtype(array, first, name, first_name)
        check_same_shape(array, first, name, first_name)
    if out is not None:
        check_dense(out, "out")
    backend.get_array_module(*(array for _, array in named), out)


def _rounded_into(wide: Any, half: str, out: Any) -> Any:
    """float32 ``wide`` rounded to the half type, into ``out`` (a new array when None)."""
    return convert.float_to_half(wide.astype(np.float32, copy=False), half, out=out)


# The kernels of activation.cu with builds moving 16-byte packs (elements.cuh's by_packs).
_PACKED = frozenset({"relu_forward", "add_relu_forward", "relu_backward", "relu_backward_sum"})


def _elementwise_gpu(name: str, *arrays: Any, out: Any = None, scalars: tuple = (), half: str | None = None,
                     key: tuple | None = None) -> Any:
    """Run kernel ``name`` of activation.cu on ``arrays`` (x, dy and y, a and b, or dy, y and dy_other) and return its
    output: ``out`` (contiguous, already checked) or a new array. ``scalars`` (float64 hyper-parameters
    such as a slope) follow the element count. ``half``: the half build for that type's words. ``key``: the
    call's steady-state key (see ``_kept``), under which a call without out on C-contiguous arrays is kept."""
    # A RawKernel sees only the base pointer: the inputs in one layout, walked as flat buffers (layout.common: out's,
    # else the first operand's, PyTorch's rule; a 0-d array stays 0-d). An out that is an input is already in that
    # layout, so it stays that very array.
    new = out is None
    inputs, channels_last = layout.common(arrays, out)
    if out is None:
        out = layout.empty(arrays[0].shape, arrays[0].dtype, backend.cupy(), channels_last)
    _cuda.check_int32(out)
    width = _cuda.elements_per_access((*inputs, out)) if name in _PACKED else 1
    kernel = _cuda.element_function("activation.cu", _cuda.pack_build(name, width), half, out.dtype)
    count = -(-out.size // width)
    _cuda.launch(kernel, count, (*(layout.flat(a) for a in inputs), layout.flat(out), _cuda.i32(out.size),
                                 *(_cuda.f64(v) for v in scalars)))
    # Kept when every input went to the kernel as it came, so already in the one layout layout.common chose (the key
    # holds the strides, so a call under it has the same layouts; a channels-last array's address is its buffer's).
    if key is not None and new and count > 0 and not scalars and all(a is b for a, b in zip(inputs, arrays)):
        if len(_kept) >= _MOST_KEPT:
            _kept.clear()
        arguments = (*[_cuda.PER_CALL] * (len(inputs) + 1), _cuda.i32(out.size))  # the inputs and out, then the count
        packed = _cuda.PackedLaunch(kernel, (_cuda.grid_stride_blocks(count),), (_cuda.THREADS,), arguments)
        _kept[key] = (packed, out.shape, out.dtype, _empty_channels_last if channels_last else backend.cupy().empty)
    return out


def _empty_channels_last(shape: tuple, dtype: Any) -> Any:
    """A new channels-last GPU array: a kept channels-last call's output."""
    return layout.empty(shape, dtype, backend.cupy(), True)


# The steady state of the ReLU kernels on the GPU: a call without out seen before (its _cuda.steady_key: the kernel's
# name, and of each array its type, shape, strides, dtype, GPU and address modulo 16) -> its launch (the kernel's
# _cuda.PackedLaunch, the output's shape and dtype, the allocator), so that a repeated call neither
# checks its arrays nor picks its build again: a training step repeats every call. Only calls whose arrays needed no
# copy into one layout are kept; anything else is checked every time. Emptied when it reaches _MOST_KEPT keys.
_kept: dict[tuple, tuple] = {}
_MOST_KEPT = 4096


def _kept_call(name: str, *arrays: Any) -> tuple[tuple | None, tuple | None]:
    """(the call's steady-state key, its kept launch or None); (None, None) when an array is not a CuPy array."""
    key = _cuda.steady_key(name, *arrays)
    return (None, None) if key is None else (key, _kept.get(key))


def _run_kept(kept: tuple, *arrays: Any) -> Any:
    """A kept call's one launch, into a new array."""
    packed, shape, dtype, empty = kept
    out = empty(shape, dtype=dtype)
    packed(*arrays, out)
    return out
