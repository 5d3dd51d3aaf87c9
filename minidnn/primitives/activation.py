"""Element-wise activations: ReLU, sigmoid and tanh, forward and backward, and a residual add fused
with its ReLU.

Every function works on arrays of any shape and keeps the input dtype (float32 or float64).
The backward functions take the forward *output* y rather than the input x, as cuDNN's
activation backward does: all three derivatives are cheap functions of y, so the caller keeps
one array per layer instead of two. ReLU can write into a given ``out``, the input itself
included (in place), so a framework can spare the allocation where autograd allows it.

On CuPy arrays each function is one launch of a kernel of ``activation.cu`` (one thread per
element); the results are those of the NumPy code below, up to the rounding of exp and tanh.
"""
from __future__ import annotations

from typing import Any

from .. import backend
from ._checks import check_contiguous, check_float, check_same_dtype, check_same_shape

__all__ = ["relu_forward", "relu_backward", "add_relu_forward", "sigmoid_forward", "sigmoid_backward",
           "tanh_forward", "tanh_backward"]


def _check_backward_args(dy: Any, y: Any) -> None:
    """dy and y must be float arrays of one shape and one dtype."""
    check_float(dy, "dy")
    check_float(y, "y")
    check_same_dtype(dy, y, "dy", "y")
    if dy.shape != y.shape:
        raise ValueError(f"dy and y must have the same shape, got {tuple(dy.shape)} and {tuple(y.shape)}")


def _check_out(out: Any, like: Any, like_name: str) -> None:
    """``out`` (when given) must be a C-contiguous array of ``like``'s shape and dtype, on its device."""
    if out is None:
        return
    check_float(out, "out")
    check_same_shape(out, like, "out", like_name)
    check_same_dtype(out, like, "out", like_name)
    check_contiguous(out, "out")
    backend.get_array_module(out, like)  # one device, or a clear ValueError


def relu_forward(x: Any, out: Any = None) -> Any:
    """y = max(x, 0). x: any shape; returns y: x's shape and dtype.

    out: None (y is a new array) or a C-contiguous array of x's shape and dtype that y is written
    into and returned; ``out=x`` is the in-place ReLU. Any other out must not overlap x.
    """
    check_float(x, "x")
    _check_out(out, x, "x")
    if backend.is_cuda_array(x):
        return _elementwise_gpu("relu_forward", x, out=out)
    xp = backend.get_array_module(x)
    return xp.maximum(x, xp.zeros((), dtype=x.dtype), out=out)


def relu_backward(dy: Any, y: Any) -> Any:
    """dx = dy where y > 0, else 0. dy, y: same shape; returns dx: that shape.

    The gradient at x = 0 is taken as 0, as PyTorch does; y > 0 exactly when x > 0, so y is
    enough to tell which inputs passed.
    """
    _check_backward_args(dy, y)
    xp = backend.get_array_module(dy, y)
    if backend.is_cuda_array(dy):
        return _elementwise_gpu("relu_backward", dy, y)
    return xp.where(y > 0, dy, xp.zeros((), dtype=dy.dtype))


def add_relu_forward(a: Any, b: Any, out: Any = None) -> Any:
    """y = max(a + b, 0): a residual connection and the ReLU after it, in one pass.

    a, b: one shape and dtype (no broadcasting); returns y of that shape. out: None (a new array) or
    a C-contiguous array of a's shape and dtype, returned; ``out=a`` (or ``b``) adds in place.
    The sum is rounded to the dtype before the ReLU, as relu_forward(a + b) rounds it.

    There is no add_relu_backward: the gradient is :func:`relu_backward` (dy, y) with this y, and the
    same array flows to both a and b (the add's gradient is the identity for each input).
    """
    _check_add_relu_arguments(a, b, out)
    xp = backend.get_array_module(a, b)
    if backend.is_cuda_array(a):
        return _elementwise_gpu("add_relu_forward", a, b, out=out)
    y = xp.empty_like(a) if out is None else out  # (xp.add(a, b) of 0-d arrays would give a scalar)
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
    _check_backward_args(dy, y)
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
    _check_backward_args(dy, y)
    backend.get_array_module(dy, y)  # one device, or a clear ValueError
    if backend.is_cuda_array(dy):
        return _elementwise_gpu("tanh_backward", dy, y)
    return dy * (1 - y * y)


# ----------------------------------------------------------------------------------------------
# GPU: the kernels of activation.cu (CuPy arrays only; arguments already checked)
# ----------------------------------------------------------------------------------------------
def _elementwise_gpu(name: str, *arrays: Any, out: Any = None) -> Any:
    """Run kernel ``name`` of activation.cu on ``arrays`` (x, dy and y, or a and b) and return its
    output: ``out`` (contiguous, already checked) or a new array."""
    from . import _cuda  # noqa: PLC0415 - GPU only

    cupy = backend.cupy()
    # A RawKernel sees only the base pointer. (Not ascontiguousarray on every input: it would turn a
    # 0-d array into a 1-d one.) An out that is an input is contiguous, so it stays that very array.
    inputs = tuple(a if a.flags.c_contiguous else cupy.ascontiguousarray(a) for a in arrays)
    if out is None:
        out = cupy.empty(arrays[0].shape, dtype=arrays[0].dtype)
    _cuda.check_int32(out)
    _cuda.launch(_cuda.function("activation.cu", name, out.dtype), out.size, (*inputs, out, _cuda.i32(out.size)))
    return out
