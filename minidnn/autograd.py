"""Reverse-mode automatic differentiation: graph nodes, grad mode and the backward pass.

A :class:`Function` is one node of the graph: its ``forward`` and ``backward`` work on plain
arrays (calling the primitives), and ``Function.apply`` runs the forward pass on tensors and,
when a gradient is needed, records the node on the output. :class:`Value` is what the graph needs
of a tensor: its array, whether it requires a gradient, its gradient and the node that made it;
:class:`minidnn.tensor.Tensor` builds the user-facing tensor on it. ``backward()`` walks the
recorded graph in reverse topological order (an iterative sort: a 200-layer network does not hit
Python's recursion limit), sums the gradients that reach each tensor (reduced to its shape when
broadcasting widened it), and releases each node's saved arrays as soon as its backward has run.

This module imports nothing of minidnn but the backend: operations (:mod:`minidnn.ops`,
:mod:`minidnn.functional`) build on it, and :mod:`minidnn.tensor` on both.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator, Sequence

from . import backend

__all__ = ["Value", "Function", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "unbroadcast"]


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
# Value: what the graph needs of a tensor
# ----------------------------------------------------------------------------------------------
class Value:
    """An array in the graph: ``data``, ``requires_grad``, ``grad`` and ``_node`` (the Function that
    computed it, None for a leaf). ``_uses`` counts the graph nodes that took it as an input, which
    tells an in-place operation whether anyone else may still need the old values.

    Subclasses say what type an operation's result has (``_wrap``): a plain tensor, never a
    subclass such as a Parameter.
    """

    __slots__ = ("data", "requires_grad", "grad", "_node", "_uses", "__weakref__")

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        self.data = data
        self.requires_grad = False
        self.grad: Value | None = None
        self._node: Function | None = None
        self._uses = 0
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _wrap(cls, data: Any, requires_grad: bool) -> "Value":
        """A new result of an operation holding ``data`` (without copying it)."""
        raise NotImplementedError

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def requires_grad_(self, requires_grad: bool = True) -> "Value":
        if requires_grad and self.data.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require gradients, got dtype {self.data.dtype}")
        if not self.is_leaf and not requires_grad:
            raise RuntimeError("requires_grad can only be switched off on leaf tensors; use detach()")
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self) -> None:
        """Keep ``.grad`` on this non-leaf tensor after ``backward()``."""
        if self._node is not None:
            self._node.retained = weakref.ref(self)

    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Compute gradients of this tensor with respect to every leaf that requires grad.

        ``gradient`` defaults to 1 for a one-element tensor (a loss); otherwise it is required
        and must have this tensor's shape.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad and has no grad_fn")
        if gradient is None:
            if self.data.size != 1:
                raise RuntimeError(f"grad can be implicitly created only for one-element outputs, "
                                   f"got shape {tuple(self.data.shape)}")
            gradient = backend.get_array_module(self.data).ones_like(self.data)
        else:
            gradient = gradient.data if isinstance(gradient, Value) else gradient
            gradient = backend.to_device(gradient, backend.device_of(self.data)).astype(self.data.dtype, copy=False)
            if tuple(gradient.shape) != tuple(self.data.shape):
                raise ValueError(f"gradient must have shape {tuple(self.data.shape)}, got {tuple(gradient.shape)}")
        run_backward(self, gradient, retain_graph)

    def _accumulate_grad(self, grad: Any) -> None:
        # Out of place: one gradient array may be shared by several inputs (e.g. both sides of a + b).
        if self.grad is None:
            self.grad = self._wrap(grad.astype(self.data.dtype, copy=False), False)
        else:
            self.grad.data = self.grad.data + grad


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

    ``fresh_output``: the output array is new (not a view of an input) and the node's backward does
    not read it, so an in-place operation on the output cannot corrupt this node's gradient.
    """

    _GRAPH_FIELDS = frozenset({"parents", "input_shapes", "needs_input_grad", "saved", "retained"})
    fresh_output = False

    def __init__(self) -> None:
        self.parents: tuple[Function | Value | None, ...] = ()
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
    def apply(cls, *args: Any, **kwargs: Any) -> Value:
        """Run the node on tensors (and other arguments), recording it when a gradient is needed."""
        tensors = [a for a in args if isinstance(a, Value)]
        _check_same_device(tensors, cls.__name__)
        function = cls()
        function.needs_input_grad = tuple(isinstance(a, Value) and a.requires_grad for a in args)
        requires_grad = _grad_mode.enabled and any(function.needs_input_grad)
        data = function.forward(*(a.data if isinstance(a, Value) else a for a in args), **kwargs)
        output = tensors[0]._wrap(data, requires_grad)
        if requires_grad:
            function.parents = tuple(_edge(a) for a in args)
            function.input_shapes = tuple(tuple(a.data.shape) if isinstance(a, Value) else None for a in args)
            output._node = function
            for tensor in tensors:
                tensor._uses += 1
        return output

    @classmethod
    def apply_in_place(cls, target: Value, *args: Any, **kwargs: Any) -> Value:
        """Run the node with its output written over ``target``'s array and return ``target``,
        rebased onto the node (PyTorch's in-place semantics: ``relu_(x)`` changes ``x``), when the
        graph allows it; otherwise as :meth:`apply`. It is allowed when no recorded node can need
        the old values: ``target`` is not a leaf that requires grad, no node has taken it as an
        input yet, and the node that computed it made a fresh array it does not read back
        (:attr:`fresh_output`). ``forward`` receives ``out=target.data`` and must write there.
        """
        producer = target._node
        if target.requires_grad and producer is None and _grad_mode.enabled:
            raise RuntimeError("a leaf tensor that requires grad is used in an in-place operation")
        if target._uses or (producer is not None and not producer.fresh_output):
            return cls.apply(target, *args, **kwargs)
        function = cls()
        function.needs_input_grad = (target.requires_grad,) + tuple(
            isinstance(a, Value) and a.requires_grad for a in args)
        first_edge = _edge(target)
        data = function.forward(target.data, *(a.data if isinstance(a, Value) else a for a in args),
                                out=target.data, **kwargs)
        if data is not target.data:
            raise RuntimeError(f"{cls.__name__}.forward did not write its result in place")
        if _grad_mode.enabled and any(function.needs_input_grad):
            for tensor in args:
                if isinstance(tensor, Value):
                    tensor._uses += 1
            function.parents = (first_edge,) + tuple(_edge(a) for a in args)
            function.input_shapes = (tuple(target.data.shape),) + tuple(
                tuple(a.data.shape) if isinstance(a, Value) else None for a in args)
            target._node, target.requires_grad = function, True
        return target


def _edge(value: Any) -> "Function | Value | None":
    """Where a gradient for ``value`` goes: its node, the leaf itself, or nowhere."""
    if not isinstance(value, Value) or not value.requires_grad:
        return None
    return value if value._node is None else value._node


def _check_same_device(tensors: Sequence[Value], operation: str) -> None:
    if len(tensors) > 1:
        first = backend.device_of(tensors[0].data)
        for other in tensors[1:]:
            where = backend.device_of(other.data)
            if where != first:
                raise ValueError(f"{operation}: expected all tensors on the same device, got {first} and {where}")


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


def run_backward(root: Value, gradient: Any, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) · gradient into the ``.grad`` of every leaf that requires it."""
    if root._node is None:
        root._accumulate_grad(gradient)
        return
    pending: dict[int, Any] = {id(root._node): gradient}
    del gradient
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
        del grad  # the output's gradient is dead once the inputs' exist: free it before summing them
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        parents, shapes = node.parents, node.input_shapes
        if not retain_graph:
            node.release()
        for parent, shape, parent_grad in zip(parents, shapes, input_grads):
            if parent is None or parent_grad is None:
                continue
            parent_grad = unbroadcast(parent_grad, shape)
            if isinstance(parent, Value):
                parent._accumulate_grad(parent_grad)
            else:
                previous = pending.get(id(parent))
                pending[id(parent)] = parent_grad if previous is None else previous + parent_grad
        del input_grads
