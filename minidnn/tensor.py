"""The Tensor: an n-dimensional array on a device, with an optional gradient, and all its methods.

Every method is defined here, in the class body: arithmetic and comparisons, reductions, shape
changes, indexing, conversions, in-place updates, and the activations tensors have as methods.
Each differentiable one applies a graph node of :mod:`minidnn.ops`; the graph itself (grad mode,
``backward``) is :mod:`minidnn.autograd`, which :class:`Tensor` builds on through
:class:`~minidnn.autograd.Value`. Module-level functions with PyTorch's names (``minidnn.tensor``,
``cat``, ``stack``, ``where``, ``argmax``, ``flatten``) live here too.
"""
from __future__ import annotations

import builtins
from collections import namedtuple
from typing import Any, Sequence

import numpy as np

from . import backend, ops
from . import memory_format as formats
from .autocast_mode import lower_precision
from .autograd import Value, bump_version, is_grad_enabled, version_of
from .primitives import convert, layout

__all__ = ["Tensor", "tensor", "cat", "stack", "where", "argmax", "argmin", "flatten", "clamp", "topk", "var",
           "std", "clone", "MaxMin", "TopK"]

MaxMin = namedtuple("MaxMin", ["values", "indices"])
TopK = namedtuple("TopK", ["values", "indices"])

# bfloat16 is ml_dtypes' NumPy dtype; on the GPU a tensor stores it as uint16 words (primitives/convert.py),
# and ``Tensor.dtype`` says bfloat16. ml_dtypes is imported when bfloat16 is first asked for (``minidnn.bfloat16``,
# a dtype named "bfloat16"), not with minidnn: its import takes most of a second, which every process would pay.
_WORDS = np.dtype(np.uint16)
_ALLOWED_DTYPES = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                         np.uint8, np.bool_)}


def __getattr__(name: str) -> Any:
    if name == "bfloat16":  # ``from minidnn.tensor import bfloat16``: ml_dtypes' dtype, imported now
        return convert.bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16, without importing ml_dtypes (no array holds it before that)."""
    return dtype.name == "bfloat16"


def as_dtype(dtype: Any) -> np.dtype:
    """A supported dtype from a NumPy dtype or its name, or a clear ``TypeError``."""
    try:
        result = convert.bfloat16() if isinstance(dtype, str) and dtype == "bfloat16" else np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a NumPy dtype or name such as 'float32', got {dtype!r}") from None
    if result not in _ALLOWED_DTYPES and not _is_bfloat16(result):
        raise TypeError(f"dtype {result} is not supported; use float16/32/64, bfloat16, int8/16/32/64, uint8 or bool")
    return result


def storage_dtype(dtype: Any, xp: Any) -> np.dtype:
    """The dtype an array of ``xp`` (NumPy or CuPy) holds a tensor of ``dtype`` in: bfloat16 is uint16 on CuPy."""
    dtype = as_dtype(dtype)
    return _WORDS if xp is not np and _is_bfloat16(dtype) else dtype


def _axes(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """``dim`` (an int or a sequence of ints, negative counting from the end) as non-negative axes."""
    if dim is None:
        return None
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise TypeError(f"dim must be an int or a tuple of ints, got {dim!r}")
        if not -ndim <= d < builtins.max(ndim, 1):
            raise IndexError(f"dim {d} is out of range for a tensor of {ndim} dimensions")
    return tuple(int(d) % builtins.max(ndim, 1) for d in dims)


def _dim(dim: Any, ndim: int) -> int:
    """One axis: an int, negative counting from the end."""
    if dim is None or isinstance(dim, (tuple, list)):
        raise TypeError(f"dim must be an int, got {dim!r}")
    return _axes(dim, ndim)[0]


def _shape_arg(shape: Sequence[Any]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    if not all(isinstance(n, (int, np.integer)) for n in shape):
        raise TypeError(f"shape must be ints, got {shape!r}")
    return tuple(int(n) for n in shape)


def _reshapable(source: tuple[int, ...], target: tuple[int, ...]) -> bool:
    size = int(np.prod(source))
    known = int(np.prod([n for n in target if n != -1])) if target else 1
    unknown = builtins.sum(1 for n in target if n == -1)
    if unknown > 1:
        return False
    return (known == size) if unknown == 0 else (known != 0 and size % known == 0)


def _correction(unbiased: bool | None, correction: float | None, tensor: "Tensor", name: str) -> float:
    """The ``correction`` of var/std from PyTorch's two spellings (``unbiased`` or ``correction``)."""
    if tensor.dtype.kind != "f":
        raise TypeError(f"{name}() needs a floating-point tensor, got {tensor.dtype}")
    if unbiased is not None and correction is not None:
        raise TypeError(f"{name}(): pass either unbiased or correction, not both")
    if unbiased is not None:
        if not isinstance(unbiased, (bool, np.bool_)):
            raise TypeError(f"{name}(): unbiased must be a bool, got {unbiased!r}")
        return 1.0 if unbiased else 0.0
    if correction is None:
        return 1.0
    if isinstance(correction, bool) or not isinstance(correction, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}(): correction must be a number, got {correction!r}")
    return float(correction)


class Tensor(Value):
    """An n-dimensional array on a device, with an optional gradient.

    Create one with :func:`minidnn.tensor` (or ``zeros``, ``randn``...). ``.data`` is the
    underlying NumPy/CuPy array; ``.grad`` is a Tensor after ``backward()`` when ``requires_grad``.
    """

    __array_priority__ = 1000  # make `ndarray + Tensor` call Tensor.__radd__
    __slots__ = ()

    @classmethod
    def _wrap(cls, data: Any, requires_grad: bool) -> "Tensor":
        # Results are plain tensors, also when an input is a Parameter.
        out = Tensor.__new__(Tensor)
        out.data, out.requires_grad, out.grad, out._node, out._version = data, requires_grad, None, None, None
        return out

    # --- properties ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        dtype = self.data.dtype
        return convert.bfloat16() if dtype == _WORDS else dtype  # a GPU tensor's bfloat16 words

    @property
    def device(self) -> backend.Device:
        return backend.device_of(self.data)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def is_cuda(self) -> bool:
        return backend.is_cuda_array(self.data)

    @property
    def T(self) -> "Tensor":
        return self.permute(*reversed(range(self.ndim)))

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return int(self.data.size)

    def dim(self) -> int:
        return self.data.ndim

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        extra = f", device='{self.device}'" if self.is_cuda else ""
        extra += ", requires_grad=True" if self.requires_grad and self.is_leaf else ""
        extra += f", grad_fn=<{type(self._node).__name__}>" if self._node is not None else ""
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{extra})"

    def _tap_gradient(self, hook: Any) -> "Tensor":
        """The same values (a view: one memory, one version counter) as a new graph node whose backward calls
        ``hook(grad)`` and passes on what it returns, unless None: the seam of the modules' backward hooks."""
        return ops.GradientHookFunction.apply(self, hook)

    def detach(self) -> "Tensor":
        """The same data, cut from the graph (sharing the version counter: a write to one is a write to both)."""
        out = Tensor._wrap(self.data, False)
        out._version = version_of(self)
        return out

    # --- conversion ---------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (shared on the CPU, a host copy from a GPU; bfloat16 as ml_dtypes')."""
        return convert.to_device(self.data, "cpu")

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Any:
        if self.numel() != 1:
            raise ValueError(f"only one-element tensors can be converted to Python scalars, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError("only integer tensors can be used as an index")
        return int(self.item())

    def to(self, target: Any = None, dtype: Any = None, *,
           memory_format: formats.memory_format = formats.preserve_format) -> "Tensor":
        """``to("cuda")``, ``to("cpu")``, ``to(float64)``, ``to("cuda", dtype=float32)`` or
        ``to(memory_format=minidnn.channels_last)`` (a 4-D tensor's values in NHWC memory order, its shape still
        (N, C, H, W)); differentiable. Returns the tensor itself when nothing changes."""
        if target is not None and not isinstance(target, (str, backend.Device)):
            target, dtype = None, target
        formats.check(memory_format)
        result = self
        if dtype is not None and as_dtype(dtype) != self.dtype:
            result = ops.CastFunction.apply(result, dtype=as_dtype(dtype))
        if target is not None and backend.device(target) != self.device:
            result = ops.ToDeviceFunction.apply(result, target=backend.device(target))
        if memory_format is not formats.preserve_format:
            result = result._laid_out(memory_format)
        return result

    def _laid_out(self, memory_format: formats.memory_format) -> "Tensor":
        formats.check_rank(self.shape, memory_format)
        if self.is_contiguous(memory_format=memory_format):
            return self
        return ops.LayoutFunction.apply(self, channels_last=memory_format is formats.channels_last)

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(f"cuda:{index}")

    def float(self) -> "Tensor":
        return self.to(np.float32)

    def half(self) -> "Tensor":
        return self.to(np.float16)

    def bfloat16(self) -> "Tensor":
        return self.to(convert.bfloat16())

    def is_floating_point(self) -> bool:
        return self.dtype.kind == "f" or _is_bfloat16(self.dtype)

    def double(self) -> "Tensor":
        return self.to(np.float64)

    def long(self) -> "Tensor":
        return self.to(np.int64)

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)

    def astype(self, dtype: Any) -> "Tensor":
        return self.to(as_dtype(dtype))

    def contiguous(self, memory_format: formats.memory_format = formats.contiguous_format) -> "Tensor":
        """The tensor in ``memory_format`` (C-contiguous by default, or ``minidnn.channels_last``): itself when
        it already is, else a copy in the graph."""
        formats.check(memory_format, allowed=(formats.contiguous_format, formats.channels_last))
        return self._laid_out(memory_format)

    def is_contiguous(self, memory_format: formats.memory_format = formats.contiguous_format) -> bool:
        """Whether the values lie in ``memory_format``'s order: C order, or for ``minidnn.channels_last`` a 4-D
        tensor's NHWC order (both, where the two coincide: C = 1 or H = W = 1)."""
        formats.check(memory_format, allowed=(formats.contiguous_format, formats.channels_last))
        if memory_format is formats.channels_last:
            return self.ndim == 4 and bool(layout.buffer(self.data).flags.c_contiguous)
        return bool(self.data.flags.c_contiguous)

    # --- in-place updates ----------------------------------------------------------------------
    # Each bumps the version counter, so a node that saved the old values refuses its backward. The
    # arithmetic ones are recorded in the graph (the tensor is rebased onto their node); writes that
    # would cut a graph tensor from its own history (fill_, zero_, copy_, item assignment) are refused.
    def _write(self, operation: str, source_requires_grad: bool = False) -> None:
        """Check that an in-place write that records no node may go ahead, and count it."""
        if is_grad_enabled():
            if self.requires_grad and self.is_leaf:
                raise RuntimeError(f"a leaf tensor that requires grad is used in an in-place operation "
                                   f"({operation}); wrap it in `with minidnn.no_grad():`")
            if self._node is not None or source_requires_grad:
                raise RuntimeError(f"{operation} on a tensor that is part of a graph is not supported; "
                                   "use the out-of-place form")
        bump_version(self, operation)

    def zero_(self) -> "Tensor":
        self._write("zero_")
        self.data[...] = 0
        return self

    def fill_(self, value: float) -> "Tensor":
        self._write("fill_")
        self.data[...] = self._stored(value)
        return self

    def copy_(self, source: "Tensor | Any") -> "Tensor":
        self._write("copy_", isinstance(source, Tensor) and source.requires_grad)
        source = source.data if isinstance(source, Tensor) else source
        self.data[...] = self._stored(source)
        return self

    def _stored(self, values: Any) -> Any:
        """``values`` (a scalar or an array) on this tensor's device in its storage: bfloat16 on the GPU is
        written as words, rounded from float32; anything else is left to the array library."""
        if self.data.dtype != _WORDS:
            return values if isinstance(values, (bool, int, float)) else backend.to_device(values, self.device)
        if isinstance(values, (bool, int, float)):
            values = np.asarray(values, dtype=np.float32)
        return convert.cast(convert.to_device(values, self.device), convert.bfloat16())

    def add_(self, other: "Tensor | float", alpha: float = 1.0) -> "Tensor":
        if alpha != 1.0:
            other = other * alpha
        return ops.AddFunction.apply_in_place("add_", self, self._operand(other))

    def sub_(self, other: "Tensor | float", alpha: float = 1.0) -> "Tensor":
        if alpha != 1.0:
            other = other * alpha
        return ops.SubFunction.apply_in_place("sub_", self, self._operand(other))

    def mul_(self, other: "Tensor | float") -> "Tensor":
        return ops.MulFunction.apply_in_place("mul_", self, self._operand(other))

    def div_(self, other: "Tensor | float") -> "Tensor":
        return ops.DivFunction.apply_in_place("div_", self, self._operand(other))

    def relu_(self) -> "Tensor":
        """max(self, 0) written over this tensor's array (recorded in the graph when it needs a gradient)."""
        return ops.ReLUFunction.apply_in_place("relu_", self)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._write("item assignment", isinstance(value, Tensor) and value.requires_grad)
        index = index.data if isinstance(index, Tensor) else index
        self.data[index] = self._stored(value.data if isinstance(value, Tensor) else value)

    # --- arithmetic and comparisons -----------------------------------------------------------
    def _operand(self, value: Any) -> Any:
        """A non-tensor operand as an array on this tensor's device (Python scalars stay scalars)."""
        if isinstance(value, (Tensor, bool, int, float)):
            return value
        return backend.to_device(value if backend.is_cuda_array(value) else np.asarray(value), self.device)

    def _binary(self, node: type, other: Any, reflected: bool = False) -> "Tensor":
        other = self._operand(other)
        return node.apply(other, self) if reflected else node.apply(self, other)

    def __add__(self, other): return self._binary(ops.AddFunction, other)  # noqa: E704
    def __radd__(self, other): return self._binary(ops.AddFunction, other, reflected=True)  # noqa: E704
    def __sub__(self, other): return self._binary(ops.SubFunction, other)  # noqa: E704
    def __rsub__(self, other): return self._binary(ops.SubFunction, other, reflected=True)  # noqa: E704
    def __mul__(self, other): return self._binary(ops.MulFunction, other)  # noqa: E704
    def __rmul__(self, other): return self._binary(ops.MulFunction, other, reflected=True)  # noqa: E704
    def __truediv__(self, other): return self._binary(ops.DivFunction, other)  # noqa: E704
    def __rtruediv__(self, other): return self._binary(ops.DivFunction, other, reflected=True)  # noqa: E704
    def __pow__(self, exponent): return self._binary(ops.PowFunction, exponent)  # noqa: E704
    def __rpow__(self, base): return self._binary(ops.PowFunction, base, reflected=True)  # noqa: E704
    def __matmul__(self, other): return self._matmul(other)  # noqa: E704
    def __rmatmul__(self, other): return self._matmul(other, reflected=True)  # noqa: E704
    def __neg__(self): return ops.NegFunction.apply(self)  # noqa: E704
    def __pos__(self): return self  # noqa: E704
    def __abs__(self): return ops.AbsFunction.apply(self)  # noqa: E704
    def matmul(self, other): return self @ other  # noqa: E704

    def _matmul(self, other: Any, reflected: bool = False) -> "Tensor":
        """a @ b; on autocast's half-precision list."""
        other = self._operand(other)
        if not isinstance(other, Tensor):
            other = Tensor(other)
        a, b = (other, self) if reflected else (self, other)
        return ops.MatMulFunction.apply(*lower_precision(a, b))

    def _compare(self, other: Any, name: str) -> "Tensor":
        """Element-wise comparison: a bool tensor, outside the graph, laid out as PyTorch's
        (:func:`~minidnn.primitives.layout.elementwise`)."""
        other = other._values() if isinstance(other, Tensor) else self._operand(other)
        values = self._values()
        return Tensor(layout.elementwise(getattr(backend.get_array_module(values, other), name), values, other))

    def _values(self) -> Any:
        """The array to compute on outside the graph: GPU bfloat16 words as float32 (exact), else the data."""
        return convert.cast(self.data, np.float32) if self.data.dtype == _WORDS else self.data

    def __eq__(self, other): return self._compare(other, "equal")  # noqa: E704
    def __ne__(self, other): return self._compare(other, "not_equal")  # noqa: E704
    def __lt__(self, other): return self._compare(other, "less")  # noqa: E704
    def __le__(self, other): return self._compare(other, "less_equal")  # noqa: E704
    def __gt__(self, other): return self._compare(other, "greater")  # noqa: E704
    def __ge__(self, other): return self._compare(other, "greater_equal")  # noqa: E704
    __hash__ = object.__hash__

    # --- element-wise functions ---------------------------------------------------------------
    def exp(self) -> "Tensor":
        return ops.ExpFunction.apply(self)

    def log(self) -> "Tensor":
        return ops.LogFunction.apply(self)

    def sqrt(self) -> "Tensor":
        return ops.SqrtFunction.apply(self)

    def abs(self) -> "Tensor":
        return ops.AbsFunction.apply(self)

    def clamp(self, min: "float | Tensor | None" = None, max: "float | Tensor | None" = None) -> "Tensor":  # noqa: A002 - PyTorch names
        """min(max(self, min), max); either bound a number or a tensor (broadcast), differentiable in
        each, with PyTorch's gradients (see :class:`~minidnn.ops.ClampFunction`)."""
        if min is None and max is None:
            raise ValueError("clamp: at least one of 'min' or 'max' must not be None")
        low = None if min is None else self._operand(min)
        high = None if max is None else self._operand(max)
        return ops.ClampFunction.apply(self, low, high)

    clip = clamp

    def clamp_min(self, min: "float | Tensor") -> "Tensor":  # noqa: A002
        return self.clamp(min=min)

    def clamp_max(self, max: "float | Tensor") -> "Tensor":  # noqa: A002
        return self.clamp(max=max)

    def where(self, condition: "Tensor", other: Any) -> "Tensor":
        """self where ``condition`` holds, else ``other`` (``minidnn.where(condition, self, other)``)."""
        return where(condition, self, other)

    def clone(self) -> "Tensor":
        """A copy of the data, in the graph (the gradient flows back to self), as PyTorch's clone."""
        return ops.CloneFunction.apply(self)

    def relu(self) -> "Tensor":
        return ops.ReLUFunction.apply(self)

    def sigmoid(self) -> "Tensor":
        return ops.SigmoidFunction.apply(self)

    def tanh(self) -> "Tensor":
        return ops.TanhFunction.apply(self)

    def softmax(self, dim: int) -> "Tensor":
        return ops.SoftmaxFunction.apply(self, _dim(dim, self.ndim))

    def log_softmax(self, dim: int) -> "Tensor":
        return ops.LogSoftmaxFunction.apply(self, _dim(dim, self.ndim))

    # --- reductions ---------------------------------------------------------------------------
    def sum(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return ops.SumFunction.apply(self, axes=_axes(dim, self.ndim), keepdim=keepdim)

    def mean(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        if self.dtype.kind != "f":
            raise TypeError(f"mean() needs a floating-point tensor, got {self.dtype}")
        return ops.MeanFunction.apply(self, axes=_axes(dim, self.ndim), keepdim=keepdim)

    def var(self, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
            correction: float | None = None) -> "Tensor":
        """The variance over ``dim`` (all elements when None): Σ(x − mean)² / (count − correction).

        PyTorch's overloads: ``correction`` (default 1, Bessel's correction; 0 gives the population
        variance), or the older ``unbiased`` (True: correction 1, False: 0), also as the only
        positional argument (``x.var(False)``). count − correction <= 0 gives inf or NaN, with a
        warning, as in PyTorch.
        """
        if isinstance(dim, bool):  # var(unbiased)
            dim, unbiased = None, dim
        return ops.VarFunction.apply(self, axes=_axes(dim, self.ndim), keepdim=keepdim,
                                     correction=_correction(unbiased, correction, self, "var"))

    def std(self, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
            correction: float | None = None) -> "Tensor":
        """√var, with :meth:`var`'s arguments."""
        return self.var(dim, unbiased, keepdim, correction=correction).sqrt()

    def _extreme(self, dim: int | None, keepdim: bool, use_min: bool) -> Any:
        if dim is None:
            return ops.MaxReduceFunction.apply(self, use_min=use_min)
        axis = _axes(dim, self.ndim)[0]
        values = ops.MaxReduceFunction.apply(self, axis=axis, keepdim=keepdim, use_min=use_min)
        xp = backend.get_array_module(self.data)
        indices = (xp.argmin if use_min else xp.argmax)(self._values(), axis=axis)
        return MaxMin(values, Tensor(xp.expand_dims(indices, axis) if keepdim else indices))

    def max(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """The largest element, or with ``dim`` the pair ``(values, indices)`` along it, as PyTorch."""
        return self._extreme(dim, keepdim, use_min=False)

    def min(self, dim: int | None = None, keepdim: bool = False) -> Any:
        return self._extreme(dim, keepdim, use_min=True)

    def _arg_extreme(self, dim: int | None, keepdim: bool, use_min: bool) -> "Tensor":
        xp = backend.get_array_module(self.data)
        find = xp.argmin if use_min else xp.argmax
        if dim is None:  # the flat index; keepdim keeps every axis, of size 1 (PyTorch)
            index = xp.asarray(find(self._values()), dtype=np.int64)
            return Tensor(index.reshape((1,) * self.ndim) if keepdim else index)
        axis = _dim(dim, self.ndim)
        result = find(self._values(), axis=axis).astype(np.int64, copy=False)
        return Tensor(xp.expand_dims(result, axis) if keepdim else result)

    def argmax(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        """The index of the first largest element (of the flattened tensor when ``dim`` is None); int64,
        outside the graph. NaN counts as the largest, as in PyTorch."""
        return self._arg_extreme(dim, keepdim, use_min=False)

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        return self._arg_extreme(dim, keepdim, use_min=True)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> "TopK":  # noqa: A002
        """``(values, indices)`` of the k largest (``largest=False``: smallest) elements along ``dim``,
        largest first (smallest first); values are differentiable. ``sorted=False`` is accepted and
        gives them sorted too (PyTorch leaves that order unspecified)."""
        if self.ndim == 0:  # a scalar is one element along its only "dimension"
            _dim(dim, 1)
            values, indices = self.reshape(1).topk(k, 0, largest, sorted)
            return TopK(values.reshape(()), Tensor(indices.data.reshape(())))
        axis = _dim(dim, self.ndim)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"topk: k must be an int, got {k!r}")
        if not 0 <= k <= self.shape[axis]:
            raise ValueError(f"topk: k must be in [0, {self.shape[axis]}] (the size of dim {dim}), got {k}")
        indices: list = []
        values = ops.TopKFunction.apply(self, int(k), axis, bool(largest), indices)
        return TopK(values, Tensor(indices[0].astype(np.int64, copy=False)))

    # --- shapes -------------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape)
        if not _reshapable(self.shape, shape):
            raise ValueError(f"cannot reshape tensor of shape {self.shape} ({self.numel()} elements) into {shape}")
        return ops.ReshapeFunction.apply(self, shape=shape)

    view = reshape

    def permute(self, *dims: Any) -> "Tensor":
        dims = _shape_arg(dims)
        if sorted(d % builtins.max(self.ndim, 1) for d in dims) != list(range(self.ndim)):
            raise ValueError(f"dims {dims} is not a permutation of the {self.ndim} dimensions")
        return ops.PermuteFunction.apply(self, dims=tuple(d % self.ndim for d in dims))

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        dims = list(range(self.ndim))
        dim0, dim1 = _axes((dim0, dim1), self.ndim)
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return ops.PermuteFunction.apply(self, dims=tuple(dims))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape(1)
        start, end = _axes((start_dim, end_dim), self.ndim)
        shape = self.shape[:start] + (int(np.prod(self.shape[start:end + 1])),) + self.shape[end + 1:]
        return ops.ReshapeFunction.apply(self, shape=shape)

    def unsqueeze(self, dim: int) -> "Tensor":
        dim = _axes(dim, self.ndim + 1)[0]
        return ops.ReshapeFunction.apply(self, shape=self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            return ops.ReshapeFunction.apply(self, shape=tuple(n for n in self.shape if n != 1))
        dim = _axes(dim, self.ndim)[0]
        if self.shape[dim] != 1:
            return self
        return ops.ReshapeFunction.apply(self, shape=self.shape[:dim] + self.shape[dim + 1:])

    def expand(self, *shape: Any) -> "Tensor":
        """A view of the tensor broadcast to ``shape``: size-1 axes stretch, new axes lead, -1 keeps an
        axis's size (PyTorch's rules, its errors as ``ValueError``). The gradient sums the copies."""
        shape = _shape_arg(shape)
        new_axes = len(shape) - self.ndim
        if new_axes < 0:
            raise ValueError(f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to the "
                             f"number of dimensions in the tensor ({self.ndim})")
        full = []
        for i, n in enumerate(shape):
            if i < new_axes:
                if n < 0:
                    raise ValueError(f"expand: size {n} isn't allowed in a leading, non-existing dimension {i}")
                full.append(n)
                continue
            size = self.shape[i - new_axes]
            n = size if n == -1 else n
            if n != size and size != 1:
                raise ValueError(f"expand: the expanded size ({n}) must match the existing size ({size}) at "
                                 f"non-singleton dimension {i}; target sizes {shape}, tensor sizes {self.shape}")
            if n < 0:
                raise ValueError(f"expand: sizes must be >= 0 or -1, got {shape}")
            full.append(n)
        return ops.ExpandFunction.apply(self, shape=tuple(full))

    def expand_as(self, other: "Tensor") -> "Tensor":
        return self.expand(other.shape)

    def repeat(self, *sizes: Any) -> "Tensor":
        """The tensor tiled ``sizes[i]`` times along each axis (more sizes than axes add leading axes):
        PyTorch's ``repeat``, a copy; the gradient sums the copies."""
        sizes = _shape_arg(sizes)
        if len(sizes) < self.ndim:
            raise ValueError(f"repeat: the number of repeat sizes ({len(sizes)}) can not be smaller than the "
                             f"number of dimensions of the tensor ({self.ndim})")
        if any(n < 0 for n in sizes):
            raise ValueError(f"repeat: sizes must be >= 0, got {sizes}")
        return ops.RepeatFunction.apply(self, repeats=sizes)

    # --- indexing -----------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> "Tensor":
        def unwrap(i: Any) -> Any:
            return i.data if isinstance(i, Tensor) else i

        index = tuple(unwrap(i) for i in index) if isinstance(index, tuple) else unwrap(index)
        return ops.GetItemFunction.apply(self, index=index)


# ----------------------------------------------------------------------------------------------
# Functions with PyTorch's names
# ----------------------------------------------------------------------------------------------
def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (a nested list, a scalar, a NumPy/CuPy array or a Tensor).

    As in PyTorch, ``dtype=None`` keeps an array's dtype (float64 and int64 included) and turns
    Python floats into float32 and Python ints into int64. ``device=None`` keeps a CuPy array on
    its GPU and puts everything else on the CPU.
    """
    if isinstance(data, Tensor):
        dtype = data.dtype if dtype is None else dtype  # GPU bfloat16 words stay bfloat16
        data = data.data
    if backend.is_cuda_array(data) or isinstance(data, np.ndarray):
        array = data.copy()
    else:
        array = np.array(data)
        if array.dtype == np.float64:
            array = array.astype(np.float32)  # Python floats: the default dtype is float32
        elif array.dtype.kind == "U" or array.dtype == object:
            raise TypeError(f"data must be numbers or arrays of numbers, got {type(data).__name__}")
    if dtype is not None:
        dtype = as_dtype(dtype)
        if array.dtype != storage_dtype(dtype, backend.get_array_module(array)):
            array = convert.cast(array, dtype)
    else:
        as_dtype(array.dtype)
    if device is not None:
        array = convert.to_device(array, device)
    return Tensor(array, requires_grad=requires_grad)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("cat() expects a non-empty sequence of tensors")
    axis = _axes(dim, tensors[0].ndim)[0]
    for t in tensors[1:]:
        if t.ndim != tensors[0].ndim or any(n != m for i, (n, m) in enumerate(zip(t.shape, tensors[0].shape))
                                            if i != axis):
            raise ValueError(f"cat(): shapes {tensors[0].shape} and {t.shape} differ outside dim {dim}")
    return ops.ConcatenateFunction.apply(*tensors, axis=axis)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("stack() expects a non-empty sequence of tensors")
    if any(t.shape != tensors[0].shape for t in tensors):
        raise ValueError(f"stack(): all tensors must have the same shape, got {[t.shape for t in tensors]}")
    dim = _axes(dim, tensors[0].ndim + 1)[0]
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def where(condition: Any, a: Any = None, b: Any = None) -> Any:
    """a where ``condition`` (a bool tensor) holds, else b, broadcast; differentiable in a and b. Either of
    a and b may be a number. ``where(condition)`` alone is ``condition.nonzero(as_tuple=True)``: a tuple
    of int64 index tensors, one per dimension, as in PyTorch."""
    if (a is None) != (b is None):
        raise TypeError("where() takes a condition alone, or a condition and both a and b")
    like = next((v for v in (a, b, condition) if isinstance(v, Tensor)), None)
    if like is None:
        raise TypeError("where() needs at least one tensor among condition, a and b")
    mask = condition.data if isinstance(condition, Tensor) else like._operand(condition)
    if getattr(mask, "dtype", None) != np.bool_:
        raise TypeError(f"where() expects condition to be a bool tensor, got dtype {getattr(mask, 'dtype', type(mask))}")
    xp = backend.get_array_module(mask)
    if a is None:
        return tuple(Tensor(index.astype(np.int64, copy=False)) for index in xp.nonzero(mask))
    a, b = like._operand(a), like._operand(b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return Tensor(xp.where(mask, a, b))
    return ops.WhereFunction.apply(mask, a, b)


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - PyTorch's names
    return input.clamp(min, max)


def clone(input: Tensor) -> Tensor:
    return input.clone()


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> TopK:  # noqa: A002
    return input.topk(k, dim, largest, sorted)


def var(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: float | None = None) -> Tensor:
    return input.var(dim, unbiased, keepdim, correction=correction)


def std(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: float | None = None) -> Tensor:
    return input.std(dim, unbiased, keepdim, correction=correction)


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return input.argmax(dim, keepdim)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return input.argmin(dim, keepdim)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return input.flatten(start_dim, end_dim)
