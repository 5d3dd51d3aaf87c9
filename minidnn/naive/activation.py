"""Activations. ReLU as Caffe ran it (src/caffe/layers/relu_layer.cu): one kernel per direction,
the forward optionally in place (``out=x``), as Caffe nets ran ReLU on the layer below's output;
the residual add + ReLU as Caffe composed it, an element-wise sum (EltwiseLayer) and then that
in-place ReLU; sigmoid and tanh, and the activations Caffe never had (leaky ReLU, SiLU, GELU), as plain
array expressions.

Arguments are checked by the primitives' helpers (:mod:`minidnn.primitives.activation` and
``_checks``), so both engines refuse the same inputs with the same errors.
"""
from __future__ import annotations

import math
from typing import Any

from .. import backend
from ..primitives import _cuda
from ..primitives import activation as primitive_activation
from ..primitives._checks import check_float, check_gradient_part
from ..primitives.activation import (_check_gradient_pair, _check_out, check_gelu_approximation,
                                     check_negative_slope)
from . import kernels


def relu_forward(x: Any, out: Any = None) -> Any:
    """y = max(x, 0). x: any shape; returns y of x's shape and dtype, written into ``out`` when given
    (a C-contiguous array like x; ``out=x`` runs in place). ReLUForward on the GPU."""
    check_float(x, "x")
    primitive_activation._check_out(out, x, "x")
    if backend.is_cuda_array(x):
        cupy = backend.cupy()
        y = cupy.empty(x.shape, dtype=x.dtype) if out is None else out
        _cuda.check_int32(y)
        kernels.launch("relu_forward", x.dtype, y.size, (cupy.ascontiguousarray(x), y, _cuda.i32(y.size)))
        return y
    xp = backend.get_array_module(x)
    return xp.maximum(x, xp.zeros((), dtype=x.dtype), out=out)


def relu_backward(dy: Any, y: Any, dy_other: Any = None) -> Any:
    """dx = dy where y > 0, else 0 (ReLUBackward, from the output). dy, y: same shape; returns dx.

    dy_other: a second part of y's gradient, summed into dy first as Caffe's SplitLayer sums the gradients of a
    blob that fed two layers (one element-wise pass of its own), then ReLUBackward."""
    _check_gradient_pair(dy, y, "y")
    xp = backend.get_array_module(dy, y)
    if dy_other is not None:
        check_gradient_part(dy_other, dy, "dy_other", "dy")
        dy = dy + dy_other
    if backend.is_cuda_array(dy):
        dx = xp.empty(dy.shape, dtype=dy.dtype)
        _cuda.check_int32(dx)
        kernels.launch("relu_backward", dy.dtype, dx.size,
                       (xp.ascontiguousarray(dy), xp.ascontiguousarray(y), dx, _cuda.i32(dx.size)))
        return dx
    return xp.where(y > 0, dy, xp.zeros((), dtype=dy.dtype))


def add_relu_forward(a: Any, b: Any, out: Any = None) -> Any:
    """y = max(a + b, 0), a residual connection's sum and ReLU, unfused as Caffe's ResNets ran them: the
    sum (EltwiseLayer SUM; one pass, into ``out`` when given, ``out=a`` in place), then ReLUForward in
    place on it. a, b: same shape and dtype. The backward is :func:`relu_backward` (dy, y), the same
    gradient for a and for b."""
    primitive_activation._check_add_relu_arguments(a, b, out)
    xp = backend.get_array_module(a, b, out)
    total = xp.add(a, b, out=out)
    return relu_forward(total, out=total)


def sigmoid_forward(x: Any) -> Any:
    """y = 1 / (1 + e^−x), exp taken of −|x| only (no overflow)."""
    check_float(x, "x")
    xp = backend.get_array_module(x)
    decay = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + decay), decay / (1 + decay))


def sigmoid_backward(dy: Any, y: Any) -> Any:
    """dx = dy·y·(1 − y)."""
    _check_gradient_pair(dy, y, "y")
    backend.get_array_module(dy, y)
    return dy * y * (1 - y)


def tanh_forward(x: Any) -> Any:
    check_float(x, "x")
    return backend.get_array_module(x).tanh(x)


def tanh_backward(dy: Any, y: Any) -> Any:
    """dx = dy·(1 − y²)."""
    _check_gradient_pair(dy, y, "y")
    backend.get_array_module(dy, y)
    return dy * (1 - y * y)


def leaky_relu_forward(x: Any, negative_slope: float = 0.01, out: Any = None) -> Any:
    """y = x where x > 0, else negative_slope·x; written into ``out`` when given (``out=x`` in place)."""
    check_float(x, "x")
    negative_slope = check_negative_slope(negative_slope)
    _check_out(out, x, "x")
    xp = backend.get_array_module(x)
    return xp.multiply(x, xp.where(x > 0, x.dtype.type(1), x.dtype.type(negative_slope)), out=out)


def leaky_relu_backward(dy: Any, x: Any, negative_slope: float = 0.01) -> Any:
    """dx = dy where x > 0, else negative_slope·dy (x, or y when negative_slope >= 0)."""
    _check_gradient_pair(dy, x, "x")
    negative_slope = check_negative_slope(negative_slope)
    xp = backend.get_array_module(dy, x)
    return dy * xp.where(x > 0, dy.dtype.type(1), dy.dtype.type(negative_slope))


def silu_forward(x: Any, out: Any = None) -> Any:
    """y = x·σ(x); written into ``out`` when given."""
    check_float(x, "x")
    _check_out(out, x, "x")
    return backend.get_array_module(x).multiply(x, sigmoid_forward(x), out=out)


def silu_backward(dy: Any, x: Any) -> Any:
    """dx = dy·σ(x)·(1 + x·(1 − σ(x)))."""
    _check_gradient_pair(dy, x, "x")
    s = sigmoid_forward(x)
    return dy * s * (1 + x * (1 - s))


def _erf(x: Any) -> Any:
    """erf in x's dtype: CuPy's own on the GPU; on the CPU the standard library's, element by element."""
    if backend.is_cuda_array(x):
        from cupyx.scipy import special  # noqa: PLC0415 - GPU only

        return special.erf(x)
    return primitive_activation.erf(x).astype(x.dtype)


def gelu_forward(x: Any, approximate: str = "none") -> Any:
    """y = x·Φ(x), or its tanh approximation (PyTorch's two forms)."""
    check_float(x, "x")
    approximate = check_gelu_approximation(approximate)
    xp = backend.get_array_module(x)
    if approximate == "tanh":
        inner = primitive_activation.SQRT_2_OVER_PI * (x + primitive_activation.GELU_TANH_CUBIC * x ** 3)
        return 0.5 * x * (1 + xp.tanh(inner))
    return 0.5 * x * (1 + _erf(x * primitive_activation.RSQRT_2))


def gelu_backward(dy: Any, x: Any, approximate: str = "none") -> Any:
    """The derivative of :func:`gelu_forward`'s form, times dy."""
    _check_gradient_pair(dy, x, "x")
    approximate = check_gelu_approximation(approximate)
    xp = backend.get_array_module(dy, x)
    if approximate == "tanh":
        scale, cubic = primitive_activation.SQRT_2_OVER_PI, primitive_activation.GELU_TANH_CUBIC
        t = xp.tanh(scale * (x + cubic * x ** 3))
        return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * scale * (1 + 3 * cubic * x ** 2))
    density = xp.exp(-0.5 * x ** 2) / math.sqrt(2 * math.pi)
    return dy * (0.5 * (1 + _erf(x * primitive_activation.RSQRT_2)) + x * density)
