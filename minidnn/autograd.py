"""Tensors and reverse-mode automatic differentiation.

A :class:`Tensor` wraps a NumPy or CuPy array. Every differentiable operation is a
:class:`Function` whose ``forward`` and ``backward`` work on plain arrays (calling the primitives);
``Function.apply`` runs the forward pass and, when a gradient is needed, records the node on the
output tensor. ``tensor.backward()`` then walks the recorded graph in reverse topological order
(an iterative sort: a 200-layer network does not hit Python's recursion limit), sums the gradients
that reach each tensor (reduced to its shape when broadcasting widened it), and releases each
node's saved arrays as soon as its backward has run.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator, Sequence

import numpy as np

from . import backend

__all__ = ["Tensor", "Function", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "tensor"]


# ----------------------------------------------------------------------------------------------
# Grad mode
# ----------------------------------------------------------------------------------------------
class _GradMode(threading.local):
    enabled = True


_grad_mode = _GradMode()


def is_grad_enabled() -> bool:
    return _grad_mode.enabled


@contextlib.contextmanager
def set_grad_enabled(mode: bool) -> Iterator[None]:
    before = _grad_mode.enabled
    _grad_mode.enabled = bool(mode)
    try:
        yield
    finally:
        _grad_mode.enabled = before


def no_grad() -> contextlib.AbstractContextManager:
    """Operations inside ``with no_grad():`` record no graph (evaluation, optimizer updates)."""
    return set_grad_enabled(False)


def enable_grad() -> contextlib.AbstractContextManager:
    return set_grad_enabled(True)


# ----------------------------------------------------------------------------------------------
# Function: one node of the graph
# ----------------------------------------------------------------------------------------------
class Function:
    """Base class of differentiable operations.

    Subclasses implement ``forward(*args, **kwargs) -> array`` on arrays (tensors arrive
    unwrapped; other arguments as given) and ``backward(grad_output) -> gradient or tuple of
    gradients``, one per positional argument (``None`` where there is none). ``forward`` keeps
    what ``backward`` needs on ``self`` (usually with :meth:`save_for_backward`); ``self.needs_input_grad``
    says which positional arguments want a gradient.

    The graph links nodes, not tensors: ``parents[i]`` is the node that computed input i, the
    input itself when it is a leaf that requires grad, or None. So an activation array lives only
    as long as a node saved it, never because the graph happens to pass through its tensor.
    """

    _GRAPH_FIELDS = frozenset({"parents", "input_shapes", "needs_input_grad", "saved", "retained"})

    def __init__(self) -> None:
        self.parents: tuple[Function | Tensor | None, ...] = ()
        self.input_shapes: tuple[tuple[int, ...] | None, ...] = ()
        self.needs_input_grad: tuple[bool, ...] = ()
        self.saved: tuple[Any, ...] | None = ()
        self.retained: Any = None  # weak reference to the output tensor when it retains its grad

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = arrays

    def release(self) -> None:
        """Drop everything forward kept, so the memory returns as soon as backward has run."""
        for name in [key for key in vars(self) if key not in self._GRAPH_FIELDS]:
            delattr(self, name)
        self.saved = None
        self.parents = ()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad_output: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> "Tensor":
        tensors = [a for a in args if isinstance(a, Tensor)]
        _check_same_device(tensors, cls.__name__)
        function = cls()
        function.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        requires_grad = _grad_mode.enabled and any(function.needs_input_grad)
        data = function.forward(*(a.data if isinstance(a, Tensor) else a for a in args), **kwargs)
        output = Tensor._make(data, requires_grad)
        if requires_grad:
            function.parents = tuple(_edge(a) for a in args)
            function.input_shapes = tuple(a.shape if isinstance(a, Tensor) else None for a in args)
            output._node = function
        return output


def _edge(value: Any) -> "Function | Tensor | None":
    """Where a gradient for ``value`` goes: its node, the leaf itself, or nowhere."""
    if not isinstance(value, Tensor) or not value.requires_grad:
        return None
    return value if value._node is None else value._node


def _check_same_device(tensors: Sequence["Tensor"], operation: str) -> None:
    if len(tensors) > 1:
        first = tensors[0].device
        for other in tensors[1:]:
            if other.device != first:
                raise ValueError(f"{operation}: expected all tensors on the same device, got {first} and {other.device}")


def unbroadcast(grad: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``grad`` over the axes that broadcasting added or stretched, back to ``shape``."""
    if grad.shape == shape:
        return grad
    leading = grad.ndim - len(shape)
    axes = tuple(range(leading)) + tuple(leading + i for i, n in enumerate(shape) if n == 1 and grad.shape[leading + i] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape) if axes else grad.reshape(shape)


# ----------------------------------------------------------------------------------------------
# Backward pass
# ----------------------------------------------------------------------------------------------
def _topological_order(root: Function) -> list[Function]:
    """Nodes reachable from ``root``, each before every node that computed one of its inputs."""
    order: list[Function] = []
    visited: set[int] = set()
    stack: list[tuple[Function, bool]] = [(root, False)]
    while stack:
        node, inputs_done = stack.pop()
        if inputs_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        stack.extend((parent, False) for parent in node.parents
                     if isinstance(parent, Function) and id(parent) not in visited)
    order.reverse()
    return order


def run_backward(root: "Tensor", gradient: Any, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) · gradient into the ``.grad`` of every leaf that requires it."""
    if root._node is None:
        root._accumulate_grad(gradient)
        return
    pending: dict[int, Any] = {id(root._node): gradient}
    for node in _topological_order(root._node):
        grad = pending.pop(id(node), None)
        if grad is None:
            continue
        if node.saved is None:
            raise RuntimeError("trying to backward through the graph a second time; "
                               "pass retain_graph=True to the first backward() if you need to")
        output = node.retained() if node.retained is not None else None
        if output is not None:
            output._accumulate_grad(grad)
        input_grads = node.backward(grad)
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        parents, shapes = node.parents, node.input_shapes
        if not retain_graph:
            node.release()
        for parent, shape, parent_grad in zip(parents, shapes, input_grads):
            if parent is None or parent_grad is None:
                continue
            parent_grad = unbroadcast(parent_grad, shape)
            if isinstance(parent, Tensor):
                parent._accumulate_grad(parent_grad)
            else:
                previous = pending.get(id(parent))
                pending[id(parent)] = parent_grad if previous is None else previous + parent_grad


# ----------------------------------------------------------------------------------------------
# Tensor
# ----------------------------------------------------------------------------------------------
_ALLOWED_DTYPES = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                         np.uint8, np.bool_)}


def _as_dtype(dtype: Any) -> np.dtype:
    try:
        result = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a NumPy dtype or name such as 'float32', got {dtype!r}") from None
    if result not in _ALLOWED_DTYPES:
        raise TypeError(f"dtype {result} is not supported; use float16/32/64, int8/16/32/64, uint8 or bool")
    return result


class Tensor:
    """An n-dimensional array on a device, with an optional gradient.

    Create one with :func:`minidnn.tensor` (or ``zeros``, ``randn``...). ``.data`` is the
    underlying NumPy/CuPy array; ``.grad`` is a Tensor after ``backward()`` when ``requires_grad``.
    """

    __array_priority__ = 1000  # make `ndarray + Tensor` call Tensor.__radd__
    __slots__ = ("data", "requires_grad", "grad", "_node", "__weakref__")

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        self.data = data
        self.requires_grad = False
        self.grad: Tensor | None = None
        self._node: Function | None = None
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _make(cls, data: Any, requires_grad: bool) -> "Tensor":
        out = Tensor.__new__(Tensor)
        out.data, out.requires_grad, out.grad, out._node = data, requires_grad, None, None
        return out

    # --- properties ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def device(self) -> backend.Device:
        return backend.device_of(self.data)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def is_cuda(self) -> bool:
        return backend.is_cuda_array(self.data)

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
        body = np.array2string(backend.to_device(self.data, "cpu"), separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{extra})"

    # --- gradients ----------------------------------------------------------------------------
    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and self.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require gradients, got dtype {self.dtype}")
        if not self.is_leaf and not requires_grad:
            raise RuntimeError("requires_grad can only be switched off on leaf tensors; use detach()")
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self) -> None:
        """Keep ``.grad`` on this non-leaf tensor after ``backward()``."""
        if self._node is not None:
            self._node.retained = weakref.ref(self)

    def backward(self, gradient: "Tensor | Any" = None, retain_graph: bool = False) -> None:
        """Compute gradients of this tensor with respect to every leaf that requires grad.

        ``gradient`` defaults to 1 for a one-element tensor (a loss); otherwise it is required
        and must have this tensor's shape.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad and has no grad_fn")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"grad can be implicitly created only for one-element outputs, got shape {self.shape}")
            gradient = backend.get_array_module(self.data).ones_like(self.data)
        else:
            gradient = gradient.data if isinstance(gradient, Tensor) else gradient
            gradient = backend.to_device(gradient, self.device).astype(self.dtype, copy=False)
            if tuple(gradient.shape) != self.shape:
                raise ValueError(f"gradient must have shape {self.shape}, got {tuple(gradient.shape)}")
        run_backward(self, gradient, retain_graph)

    def _accumulate_grad(self, grad: Any) -> None:
        # Out of place: one gradient array may be shared by several inputs (e.g. both sides of a + b).
        if self.grad is None:
            self.grad = Tensor._make(grad.astype(self.dtype, copy=False), False)
        else:
            self.grad.data = self.grad.data + grad

    def detach(self) -> "Tensor":
        """The same data, cut from the graph."""
        return Tensor._make(self.data, False)

    # --- conversion ---------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (shared on the CPU, a host copy from a GPU)."""
        return backend.to_device(self.data, "cpu")

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

    def to(self, target: Any = None, dtype: Any = None) -> "Tensor":
        """``to("cuda")``, ``to("cpu")``, ``to(float64)`` or ``to("cuda", dtype=float32)``; differentiable."""
        if target is not None and not isinstance(target, (str, backend.Device)):
            target, dtype = None, target
        result = self
        if dtype is not None and _as_dtype(dtype) != self.dtype:
            result = _ops.Cast.apply(result, dtype=_as_dtype(dtype))
        if target is not None and backend.device(target) != self.device:
            result = _ops.ToDevice.apply(result, target=backend.device(target))
        return result

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(f"cuda:{index}")

    def float(self) -> "Tensor":
        return self.to(np.float32)

    def double(self) -> "Tensor":
        return self.to(np.float64)

    def long(self) -> "Tensor":
        return self.to(np.int64)

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)

    # --- in-place updates (outside the graph) -------------------------------------------------
    def _check_inplace(self) -> None:
        if self.requires_grad and self.is_leaf and is_grad_enabled():
            raise RuntimeError("a leaf tensor that requires grad is used in an in-place operation; "
                               "wrap it in `with minidnn.no_grad():`")

    def zero_(self) -> "Tensor":
        self._check_inplace()
        self.data[...] = 0
        return self

    def fill_(self, value: float) -> "Tensor":
        self._check_inplace()
        self.data[...] = value
        return self

    def copy_(self, source: "Tensor | Any") -> "Tensor":
        self._check_inplace()
        source = source.data if isinstance(source, Tensor) else source
        self.data[...] = backend.to_device(source, self.device)
        return self

    def add_(self, other: "Tensor | float", alpha: float = 1.0) -> "Tensor":
        self._check_inplace()
        self.data += alpha * (other.data if isinstance(other, Tensor) else other)
        return self

    def mul_(self, other: "Tensor | float") -> "Tensor":
        self._check_inplace()
        self.data *= other.data if isinstance(other, Tensor) else other
        return self

    # --- operators: see ops.py ----------------------------------------------------------------
    def __add__(self, other): return _ops.add(self, other)
    def __radd__(self, other): return _ops.add(other, self)
    def __sub__(self, other): return _ops.sub(self, other)
    def __rsub__(self, other): return _ops.sub(other, self)
    def __mul__(self, other): return _ops.mul(self, other)
    def __rmul__(self, other): return _ops.mul(other, self)
    def __truediv__(self, other): return _ops.div(self, other)
    def __rtruediv__(self, other): return _ops.div(other, self)
    def __pow__(self, exponent): return _ops.pow(self, exponent)
    def __rpow__(self, base): return _ops.pow(base, self)
    def __matmul__(self, other): return _ops.matmul(self, other)
    def __rmatmul__(self, other): return _ops.matmul(other, self)
    def __neg__(self): return _ops.neg(self)
    def __pos__(self): return self
    def __abs__(self): return _ops.abs(self)
    def __getitem__(self, index): return _ops.getitem(self, index)
    def __eq__(self, other): return _ops.compare(self, other, "equal")  # noqa: E704
    def __ne__(self, other): return _ops.compare(self, other, "not_equal")
    def __lt__(self, other): return _ops.compare(self, other, "less")
    def __le__(self, other): return _ops.compare(self, other, "less_equal")
    def __gt__(self, other): return _ops.compare(self, other, "greater")
    def __ge__(self, other): return _ops.compare(self, other, "greater_equal")
    __hash__ = object.__hash__

    def __setitem__(self, index: Any, value: Any) -> None:
        self._check_inplace()
        if self._node is not None and is_grad_enabled():
            raise RuntimeError("in-place assignment into a tensor that is part of a graph is not supported")
        index = index.data if isinstance(index, Tensor) else index
        self.data[index] = backend.to_device(value.data, self.device) if isinstance(value, Tensor) else value

    # methods defined in ops.py are attached there (sum, mean, reshape, exp, ...)


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (a nested list, a scalar, a NumPy/CuPy array or a Tensor).

    As in PyTorch, ``dtype=None`` keeps an array's dtype (float64 and int64 included) and turns
    Python floats into float32 and Python ints into int64. ``device=None`` keeps a CuPy array on
    its GPU and puts everything else on the CPU.
    """
    if isinstance(data, Tensor):
        data = data.data
    if backend.is_cuda_array(data):
        array = data.copy()
    elif isinstance(data, np.ndarray):
        array = data.copy()
    else:
        array = np.array(data)
        if array.dtype == np.float64:
            array = array.astype(np.float32)  # Python floats: the default dtype is float32
        elif array.dtype.kind == "U" or array.dtype == object:
            raise TypeError(f"data must be numbers or arrays of numbers, got {type(data).__name__}")
    if dtype is not None:
        array = array.astype(_as_dtype(dtype), copy=False)
    else:
        _as_dtype(array.dtype)
    if device is not None:
        array = backend.to_device(array, device)
    return Tensor(array, requires_grad=requires_grad)


from . import ops as _ops  # noqa: E402 - ops builds on Function and Tensor defined above
