"""Differentiable tensor operations: arithmetic, reductions, shape changes, indexing, joins.

These are the operations of the tensor itself; the neural-network operations (convolution,
pooling, normalisation, losses) are in :mod:`minidnn.functional` and call the primitives.
Each class is one graph node; the functions below wrap Python scalars and arrays as constants.
"""
from __future__ import annotations

import builtins
from collections import namedtuple
from typing import Any, Sequence

import numpy as np

from . import backend
from .autograd import Function, Tensor, _as_dtype

MaxMin = namedtuple("MaxMin", ["values", "indices"])


def _xp(*arrays: Any):
    return backend.get_array_module(*arrays)


def _constant(value: Any, like: Tensor) -> Any:
    """A non-tensor operand as an array on ``like``'s device (Python scalars stay scalars)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (bool, int, float)):
        return value
    return backend.to_device(np.asarray(value) if not backend.is_cuda_array(value) else value, like.device)


def _binary(cls: type[Function], a: Any, b: Any) -> Tensor:
    like = a if isinstance(a, Tensor) else b
    return cls.apply(_constant(a, like), _constant(b, like))


# ----------------------------------------------------------------------------------------------
# Arithmetic
# ----------------------------------------------------------------------------------------------
class Add(Function):
    def forward(self, a, b):
        return a + b

    def backward(self, grad):
        return grad, grad


class Sub(Function):
    def forward(self, a, b):
        return a - b

    def backward(self, grad):
        return grad, -grad


class Mul(Function):
    def forward(self, a, b):
        self.save_for_backward(a if self.needs_input_grad[1] else None, b if self.needs_input_grad[0] else None)
        return a * b

    def backward(self, grad):
        a, b = self.saved
        return (grad * b if self.needs_input_grad[0] else None), (grad * a if self.needs_input_grad[1] else None)


class Div(Function):
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a / b

    def backward(self, grad):
        a, b = self.saved
        grad_a = grad / b if self.needs_input_grad[0] else None
        grad_b = -grad * a / (b * b) if self.needs_input_grad[1] else None
        return grad_a, grad_b


class Pow(Function):
    def forward(self, base, exponent):
        out = base ** exponent
        self.save_for_backward(base, exponent, out)
        return out

    def backward(self, grad):
        base, exponent, out = self.saved
        xp = _xp(grad)
        grad_base = grad * exponent * base ** (exponent - 1) if self.needs_input_grad[0] else None
        grad_exponent = grad * out * xp.log(base) if self.needs_input_grad[1] else None
        return grad_base, grad_exponent


class Neg(Function):
    def forward(self, a):
        return -a

    def backward(self, grad):
        return -grad


class MatMul(Function):
    """a @ b with NumPy's rules (1-D operands, batched broadcasting)."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a @ b

    def backward(self, grad):
        a, b = self.saved
        xp = _xp(grad)
        # Promote 1-D operands to matrices as matmul does; the engine sums away broadcast batch axes.
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        g = grad.reshape(batch + (a2.shape[-2], b2.shape[-1]))
        grad_a = grad_b = None
        if self.needs_input_grad[0]:
            grad_a = g @ xp.swapaxes(b2, -1, -2)
            grad_a = grad_a[..., 0, :] if a.ndim == 1 else grad_a
        if self.needs_input_grad[1]:
            grad_b = xp.swapaxes(a2, -1, -2) @ g
            grad_b = grad_b[..., 0] if b.ndim == 1 else grad_b
        return grad_a, grad_b


class Exp(Function):
    def forward(self, a):
        out = _xp(a).exp(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        return grad * self.saved[0]


class Log(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return _xp(a).log(a)

    def backward(self, grad):
        return grad / self.saved[0]


class Sqrt(Function):
    def forward(self, a):
        out = _xp(a).sqrt(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        return grad / (2 * self.saved[0])


class Abs(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return _xp(a).abs(a)

    def backward(self, grad):
        return grad * _xp(grad).sign(self.saved[0])


class Clamp(Function):
    def forward(self, a, low=None, high=None):
        xp = _xp(a)
        out = xp.clip(a, low, high)
        self.save_for_backward((out == a) if low is not None or high is not None else None)
        return out

    def backward(self, grad):
        (inside,) = self.saved
        return grad if inside is None else grad * inside


class Where(Function):
    def forward(self, condition, a, b):
        self.save_for_backward(condition)
        return _xp(a).where(condition, a, b)

    def backward(self, grad):
        (condition,) = self.saved
        zero = grad.dtype.type(0)
        xp = _xp(grad)
        return None, xp.where(condition, grad, zero), xp.where(condition, zero, grad)


class Cast(Function):
    def forward(self, a, dtype):
        self.source_dtype = a.dtype
        return a.astype(dtype)

    def backward(self, grad):
        return grad.astype(self.source_dtype)


class ToDevice(Function):
    def forward(self, a, target):
        self.source = backend.device_of(a)
        return backend.to_device(a, target)

    def backward(self, grad):
        return backend.to_device(grad, self.source)


def add(a: Any, b: Any) -> Tensor:
    return _binary(Add, a, b)


def sub(a: Any, b: Any) -> Tensor:
    return _binary(Sub, a, b)


def mul(a: Any, b: Any) -> Tensor:
    return _binary(Mul, a, b)


def div(a: Any, b: Any) -> Tensor:
    return _binary(Div, a, b)


def pow(base: Any, exponent: Any) -> Tensor:  # noqa: A001 - the operator's name
    return _binary(Pow, base, exponent)


def matmul(a: Any, b: Any) -> Tensor:
    return _binary(MatMul, a, b)


def neg(a: Tensor) -> Tensor:
    return Neg.apply(a)


def exp(a: Tensor) -> Tensor:
    return Exp.apply(a)


def log(a: Tensor) -> Tensor:
    return Log.apply(a)


def sqrt(a: Tensor) -> Tensor:
    return Sqrt.apply(a)


def abs(a: Tensor) -> Tensor:  # noqa: A001
    return Abs.apply(a)


def clamp(a: Tensor, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002 - PyTorch names
    return Clamp.apply(a, low=min, high=max)


def where(condition: Tensor, a: Any, b: Any) -> Tensor:
    like = condition
    condition = condition.data if isinstance(condition, Tensor) else condition
    return Where.apply(condition, _constant(a, like), _constant(b, like))


def compare(a: Any, b: Any, name: str) -> Tensor:
    """Elementwise comparison: a bool tensor, outside the graph."""
    like = a if isinstance(a, Tensor) else b
    a, b = (v.data if isinstance(v, Tensor) else _constant(v, like) for v in (a, b))
    return Tensor(getattr(_xp(a, b), name)(a, b))


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------
def _axes(dim: Any, ndim: int) -> tuple[int, ...] | None:
    if dim is None:
        return None
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    for d in dims:
        if not -ndim <= d < builtins.max(ndim, 1):
            raise IndexError(f"dim {d} is out of range for a tensor of {ndim} dimensions")
    return tuple(d % builtins.max(ndim, 1) for d in dims)


class Sum(Function):
    def forward(self, a, axes=None, keepdim=False):
        self.shape, self.axes, self.keepdim = a.shape, axes, keepdim
        return a.sum(axis=axes, keepdims=keepdim)

    def backward(self, grad):
        xp = _xp(grad)
        if not self.keepdim and self.axes is not None:
            grad = xp.expand_dims(grad, self.axes)
        return xp.broadcast_to(grad, self.shape)


class Mean(Function):
    def forward(self, a, axes=None, keepdim=False):
        self.shape, self.axes, self.keepdim = a.shape, axes, keepdim
        out = a.mean(axis=axes, keepdims=keepdim)
        self.count = a.size // builtins.max(out.size, 1) if a.size else 1  # elements averaged per output
        return out

    def backward(self, grad):
        xp = _xp(grad)
        if not self.keepdim and self.axes is not None:
            grad = xp.expand_dims(grad, self.axes)
        return xp.broadcast_to(grad / self.count, self.shape)


class MaxReduce(Function):
    """max (or min) over one axis or all; the gradient goes to the first extreme element."""

    def forward(self, a, axis=None, keepdim=False, use_min=False):
        xp = _xp(a)
        flat = a.reshape(-1) if axis is None else a
        index = (xp.argmin if use_min else xp.argmax)(flat, axis=0 if axis is None else axis)
        self.shape, self.axis, self.keepdim, self.index = a.shape, axis, keepdim, index
        if axis is None:
            return flat[index]
        values = xp.take_along_axis(a, xp.expand_dims(index, axis), axis=axis)
        return values if keepdim else values.squeeze(axis)

    def backward(self, grad):
        xp = _xp(grad)
        out = xp.zeros(self.shape, dtype=grad.dtype)
        if self.axis is None:
            out.reshape(-1)[self.index] = grad
            return out
        grad = grad if self.keepdim else xp.expand_dims(grad, self.axis)
        xp.put_along_axis(out, xp.expand_dims(self.index, self.axis), grad, axis=self.axis)
        return out


def sum(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    return Sum.apply(a, axes=_axes(dim, a.ndim), keepdim=keepdim)


def mean(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    if a.dtype.kind != "f":
        raise TypeError(f"mean() needs a floating-point tensor, got {a.dtype}")
    return Mean.apply(a, axes=_axes(dim, a.ndim), keepdim=keepdim)


def _extreme(a: Tensor, dim: int | None, keepdim: bool, use_min: bool) -> Any:
    if dim is None:
        return MaxReduce.apply(a, use_min=use_min)
    axis = _axes(dim, a.ndim)[0]
    values = MaxReduce.apply(a, axis=axis, keepdim=keepdim, use_min=use_min)
    xp = _xp(a.data)
    indices = (xp.argmin if use_min else xp.argmax)(a.data, axis=axis)
    return MaxMin(values, Tensor(xp.expand_dims(indices, axis) if keepdim else indices))


def max(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A001
    """The largest element, or with ``dim`` the pair ``(values, indices)`` along it, as PyTorch."""
    return _extreme(a, dim, keepdim, use_min=False)


def min(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A001
    return _extreme(a, dim, keepdim, use_min=True)


def argmax(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    xp = _xp(a.data)
    if dim is None:
        return Tensor(xp.asarray(xp.argmax(a.data)))
    axis = _axes(dim, a.ndim)[0]
    result = xp.argmax(a.data, axis=axis)
    return Tensor(xp.expand_dims(result, axis) if keepdim else result)


# ----------------------------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------------------------
class Reshape(Function):
    def forward(self, a, shape):
        self.shape = a.shape
        return a.reshape(shape)

    def backward(self, grad):
        return grad.reshape(self.shape)


class Permute(Function):
    def forward(self, a, dims):
        self.inverse = tuple(np.argsort(dims))
        return a.transpose(dims)

    def backward(self, grad):
        return grad.transpose(self.inverse)


class Expand(Function):
    def forward(self, a, shape):
        self.shape = a.shape
        return _xp(a).broadcast_to(a, shape)

    def backward(self, grad):
        from .autograd import unbroadcast  # noqa: PLC0415

        return unbroadcast(grad, self.shape)


def _shape_arg(shape: Sequence[Any]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    if not all(isinstance(n, (int, np.integer)) for n in shape):
        raise TypeError(f"shape must be ints, got {shape!r}")
    return tuple(int(n) for n in shape)


def reshape(a: Tensor, *shape: Any) -> Tensor:
    shape = _shape_arg(shape)
    if not _reshapable(a.shape, shape):
        raise ValueError(f"cannot reshape tensor of shape {a.shape} ({a.numel()} elements) into {shape}")
    return Reshape.apply(a, shape=shape)


def _reshapable(source: tuple[int, ...], target: tuple[int, ...]) -> bool:
    size = int(np.prod(source))
    known = int(np.prod([n for n in target if n != -1])) if target else 1
    unknown = builtins.sum(1 for n in target if n == -1)
    if unknown > 1:
        return False
    return (known == size) if unknown == 0 else (known != 0 and size % known == 0)


def permute(a: Tensor, *dims: Any) -> Tensor:
    dims = _shape_arg(dims)
    if sorted(d % builtins.max(a.ndim, 1) for d in dims) != list(range(a.ndim)):
        raise ValueError(f"dims {dims} is not a permutation of the {a.ndim} dimensions")
    return Permute.apply(a, dims=tuple(d % a.ndim for d in dims))


def transpose(a: Tensor, dim0: int, dim1: int) -> Tensor:
    dims = list(range(a.ndim))
    dim0, dim1 = _axes((dim0, dim1), a.ndim)
    dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return Permute.apply(a, dims=tuple(dims))


def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if a.ndim == 0:
        return reshape(a, 1)
    start, end = _axes((start_dim, end_dim), a.ndim)
    shape = a.shape[:start] + (int(np.prod(a.shape[start:end + 1])),) + a.shape[end + 1:]
    return Reshape.apply(a, shape=shape)


def unsqueeze(a: Tensor, dim: int) -> Tensor:
    dim = _axes(dim, a.ndim + 1)[0]
    return Reshape.apply(a, shape=a.shape[:dim] + (1,) + a.shape[dim:])


def squeeze(a: Tensor, dim: int | None = None) -> Tensor:
    if dim is None:
        return Reshape.apply(a, shape=tuple(n for n in a.shape if n != 1))
    dim = _axes(dim, a.ndim)[0]
    if a.shape[dim] != 1:
        return a
    return Reshape.apply(a, shape=a.shape[:dim] + a.shape[dim + 1:])


def expand(a: Tensor, *shape: Any) -> Tensor:
    shape = _shape_arg(shape)
    full = tuple(a.shape[i - (len(shape) - a.ndim)] if n == -1 else n for i, n in enumerate(shape))
    return Expand.apply(a, shape=full)


# ----------------------------------------------------------------------------------------------
# Indexing and joins
# ----------------------------------------------------------------------------------------------
class GetItem(Function):
    def forward(self, a, index):
        self.shape, self.dtype, self.index = a.shape, a.dtype, index
        return a[index]

    def backward(self, grad):
        xp = _xp(grad)
        out = xp.zeros(self.shape, dtype=self.dtype)
        backend.add_at(out, self.index, grad)
        return out


def getitem(a: Tensor, index: Any) -> Tensor:
    def unwrap(i: Any) -> Any:
        return i.data if isinstance(i, Tensor) else i

    index = tuple(unwrap(i) for i in index) if isinstance(index, tuple) else unwrap(index)
    return GetItem.apply(a, index=index)


class Concatenate(Function):
    def forward(self, *arrays, axis=0):
        self.axis = axis
        self.sizes = [a.shape[axis] for a in arrays]
        return _xp(*arrays).concatenate(arrays, axis=axis)

    def backward(self, grad):
        bounds = np.cumsum(self.sizes)[:-1]
        return tuple(_xp(grad).split(grad, bounds, axis=self.axis))


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("cat() expects a non-empty sequence of tensors")
    axis = _axes(dim, tensors[0].ndim)[0]
    for t in tensors[1:]:
        if t.ndim != tensors[0].ndim or any(n != m for i, (n, m) in enumerate(zip(t.shape, tensors[0].shape)) if i != axis):
            raise ValueError(f"cat(): shapes {tensors[0].shape} and {t.shape} differ outside dim {dim}")
    return Concatenate.apply(*tensors, axis=axis)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("stack() expects a non-empty sequence of tensors")
    if any(t.shape != tensors[0].shape for t in tensors):
        raise ValueError(f"stack(): all tensors must have the same shape, got {[t.shape for t in tensors]}")
    dim = _axes(dim, tensors[0].ndim + 1)[0]
    return cat([unsqueeze(t, dim) for t in tensors], dim)


# ----------------------------------------------------------------------------------------------
# Tensor methods
# ----------------------------------------------------------------------------------------------
def _attach() -> None:
    methods = {
        "sum": sum, "mean": mean, "max": max, "min": min, "argmax": argmax, "exp": exp, "log": log,
        "sqrt": sqrt, "abs": abs, "clamp": clamp, "reshape": reshape, "view": reshape, "permute": permute,
        "transpose": transpose, "flatten": flatten, "unsqueeze": unsqueeze, "squeeze": squeeze,
        "expand": expand, "matmul": matmul,
    }
    for name, function in methods.items():
        setattr(Tensor, name, function)
    Tensor.T = property(lambda self: permute(self, *reversed(range(self.ndim))))
    Tensor.contiguous = lambda self: self
    Tensor.astype = lambda self, dtype: self.to(_as_dtype(dtype))


_attach()
