"""Activations. ReLU as Caffe ran it (src/caffe/layers/relu_layer.cu): one kernel per direction,
the forward optionally in place (``out=x``), as Caffe nets ran ReLU on the layer below's output;
the residual add + ReLU as Caffe composed it, an element-wise sum (EltwiseLayer) and then that
in-place ReLU; sigmoid and tanh as plain array expressions.

Arguments are checked by the primitives' helpers (:mod:`minidnn.primitives.activation` and
``_checks``), so both engines refuse the same inputs with the same errors.
"""
from __future__ import annotations

from typing import Any

from .. import backend
from ..primitives import _cuda
from ..primitives import activation as primitive_activation
from ..primitives._checks import check_float
from ..primitives.activation import _check_backward_args
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


def relu_backward(dy: Any, y: Any) -> Any:
    """dx = dy where y > 0, else 0 (ReLUBackward, from the output). dy, y: same shape; returns dx."""
    _check_backward_args(dy, y)
    xp = backend.get_array_module(dy, y)
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
    _check_backward_args(dy, y)
    backend.get_array_module(dy, y)
    return dy * y * (1 - y)


def tanh_forward(x: Any) -> Any:
    check_float(x, "x")
    return backend.get_array_module(x).tanh(x)


def tanh_backward(dy: Any, y: Any) -> Any:
    """dx = dy·(1 − y²)."""
    _check_backward_args(dy, y)
    backend.get_array_module(dy, y)
    return dy * (1 - y * y)
