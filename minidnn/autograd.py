"""Reverse-mode automatic differentiation: graph nodes, grad mode and the backward pass.

A :class:`Function` is one node of the graph: its ``forward`` and ``backward`` work on plain
arrays (calling the primitives), and ``Function.apply`` runs the forward pass on tensors and,
when a gradient is needed, records the node on the output. :class:`Value` is what the graph needs
of a tensor: its array, whether it requires a gradient, its gradient and the node that made it;
:class:`minidnn.tensor.Tensor` builds the user-facing tensor on it. ``backward()`` walks the
recorded graph in reverse topological order (an iterative sort: a 200-layer network does not hit
Python's recursion limit), sums the gradients that reach each tensor (reduced to its shape when
broadcasting widened it), and releases each node's saved arrays as soon as its backward has run.

In-place operations are safe as in PyTorch: every tensor has a version counter (shared with its
views) that each in-place write bumps, every node remembers the versions of the arrays it saved for
its backward, and a backward that finds one of them changed raises a ``RuntimeError`` naming the
node and the operation, instead of computing a wrong gradient.

This module imports nothing of minidnn but the backend and the layouts (primitives/layout.py, which keep a
gradient in its tensor's layout): operations (:mod:`minidnn.ops`,
:mod:`minidnn.functional`) build on it, and :mod:`minidnn.tensor` on both.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import backend
from .primitives import layout

__all__ = ["Value", "Function", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "inference_mode",
           "unbroadcast", "bump_version", "version_of", "RemovableHandle", "is_half", "is_floating"]


# ----------------------------------------------------------------------------------------------
# Half-precision arrays: which operations take them, and the widening of the others' inputs
# ----------------------------------------------------------------------------------------------
_UINT16 = np.dtype(np.uint16)
_FLOAT16 = np.dtype(np.float16)


def is_half(array: Any) -> bool:
    """True for float16 or bfloat16 storage: ``ml_dtypes.bfloat16`` on the CPU, uint16 words on the GPU (a
    tensor never holds uint16 for anything else)."""
    dtype = array.dtype
    return dtype == _FLOAT16 or dtype.name == "bfloat16" or (dtype == _UINT16 and backend.is_cuda_array(array))


def is_floating(array: Any) -> bool:
    return array.dtype.kind == "f" or is_half(array)


class _HalfTensors:
    """``made``: whether any half-precision tensor was made in this process (until then, no operation looks
    at its inputs' dtypes). ``widen`` and ``add`` are set by :mod:`minidnn.ops`: a tensor widened to float32
    by a graph node (whose backward rounds the gradient back), and the sum of two gradient arrays of one
    half type."""

    made = False
    widen: Callable[["Value"], "Value"] | None = None
    add: Callable[[Any, Any], Any] | None = None


half_tensors = _HalfTensors()


def _sum_gradients(a: Any, b: Any) -> Any:
    """Two gradients of one tensor summed, in its layout: ops' half-aware sum once a half tensor exists, else
    layout.add."""
    return half_tensors.add(a, b) if half_tensors.made else layout.add(a, b)


def note_half(data: Any) -> None:
    """Record that ``data``, about to be a tensor's, may be half precision (checked once per new tensor)."""
    if not half_tensors.made and data.dtype.itemsize == 2 and is_half(data):
        half_tensors.made = True


def _widen_half_inputs(args: tuple) -> tuple:
    """``args`` with each half-precision tensor replaced by its float32 widening (a graph node)."""
    return tuple([half_tensors.widen(a) if isinstance(a, Value) and is_half(a.data) else a for a in args])


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


def inference_mode(mode: bool = True) -> contextlib.AbstractContextManager:
    """``with minidnn.inference_mode():`` (or ``@minidnn.inference_mode()``): PyTorch's name for evaluation
    without a graph. minidnn's :func:`no_grad` already records nothing and keeps nothing for a backward, so
    this is the same switch; ``inference_mode(False)`` leaves grad mode as it is."""
    return set_grad_enabled(False) if mode else contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------
# Versions: in-place writes, counted
# ----------------------------------------------------------------------------------------------
class Version:
    """How many in-place writes a tensor's memory has had, and the last one's name. One counter is shared
    by a tensor and every view of it (``shared`` then says so), since a write through one is a write to all."""

    __slots__ = ("value", "last", "shared")

    def __init__(self) -> None:
        self.value, self.last, self.shared = 0, "", False


def version_of(value: "Value") -> Version:
    """``value``'s version counter, made on first need: most tensors are never saved, viewed or written."""
    counter = value._version
    if counter is None:
        counter = value._version = Version()
    return counter


def bump_version(value: "Value", operation: str) -> None:
    """Record an in-place write into ``value``'s memory (by ``operation``, e.g. ``"mul_"``). A tensor without
    a counter has had nothing saved or viewed that could see the write."""
    counter = value._version
    if counter is not None:
        counter.value += 1
        counter.last = operation


# ----------------------------------------------------------------------------------------------
# Value: what the graph needs of a tensor
# ----------------------------------------------------------------------------------------------
class Value:
    """An array in the graph: ``data``, ``requires_grad``, ``grad``, ``_node`` (the Function that
    computed it, None for a leaf), ``_version`` (its :class:`Version`, shared with its views; None
    until something needs it, see :func:`version_of`) and ``_post_accumulate_grad_hooks`` (a leaf's
    hooks, see :meth:`register_post_accumulate_grad_hook`; None, or unset on operation results).

    Subclasses say what type an operation's result has (``_wrap``): a plain tensor, never a
    subclass such as a Parameter.
    """

    __slots__ = ("data", "requires_grad", "grad", "_node", "_version", "_post_accumulate_grad_hooks", "__weakref__")

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        note_half(data)
        self.data = data
        self.requires_grad = False
        self.grad: Value | None = None
        self._node: Function | None = None
        self._version: Version | None = None  # made on first need (version_of)
        self._post_accumulate_grad_hooks: OrderedDict | None = None
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
        if requires_grad and not is_floating(self.data):
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

    def register_post_accumulate_grad_hook(self, hook: Callable[["Value"], None]) -> "RemovableHandle":
        """Call ``hook(tensor)`` during backward right after a gradient has been added into this leaf's
        ``.grad`` (PyTorch's name; data-parallel training starts a bucket's all-reduce from it). Unlike
        PyTorch, where a leaf's contributions are summed before its one accumulation, here each edge into
        the leaf accumulates at once: a leaf used by several operations gets one call per use. Returns a
        handle whose ``remove()`` takes the hook off."""
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__}")
        if not self.is_leaf:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        hooks = getattr(self, "_post_accumulate_grad_hooks", None)  # unset on a detached operation result
        if hooks is None:
            hooks = self._post_accumulate_grad_hooks = OrderedDict()
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def _accumulate_grad(self, grad: Any) -> None:
        # Out of place: one gradient array may be shared by several inputs (e.g. both sides of a + b).
        if self.grad is None:
            dtype = self.data.dtype  # compared first: even a no-op astype costs a GPU array's conversion checks
            self.grad = self._wrap(grad if grad.dtype == dtype else grad.astype(dtype), False)
        else:
            self.grad.data = _sum_gradients(self.grad.data, grad)
        hooks = getattr(self, "_post_accumulate_grad_hooks", None)  # one attribute read when no hook is set
        if hooks:
            for hook in tuple(hooks.values()):  # a hook may remove itself
                hook(self)


class RemovableHandle:
    """What registering a hook returns, for tensors and modules alike (PyTorch's name): the hook is filed
    under the handle's ``id`` in one or more ordered tables, and ``handle.remove()`` (also on leaving
    ``with handle:``) takes it out of each. The tables are held weakly, so a handle keeps no tensor or
    module alive."""

    _ids = itertools.count()

    def __init__(self, *tables: "OrderedDict[int, Any]") -> None:
        self.id = next(self._ids)
        self._tables = [weakref.ref(table) for table in tables]

    def remove(self) -> None:
        for reference in self._tables:
            table = reference()
            if table is not None:
                table.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.remove()


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

    ``saved_versions`` holds, for each saved array that is an input's or the output's, that tensor's
    version counter and its value when it was saved: backward checks them (see :func:`run_backward`).

    ``sums_gradient_parts``: whether ``backward`` also takes its output's gradient in two parts, as
    ``backward(part, other_part)``, when two operations used the output: the node sums them in the pass its kernel
    makes over the gradient anyway (ReLU's mask), which spares the engine's sum a pass of its own over three arrays.
    The parts have the output's layout; a third part is summed into the first two by the engine, and where the
    output retains its gradient the engine sums the parts for it and calls ``backward(sum)``.

    ``half_inputs``: whether ``forward`` and ``backward`` take float16 and bfloat16 arrays. Where not, a
    half-precision input is widened to float32 by a graph node first, so the operation computes and returns
    float32 (autocast's rule for every operation off its half-precision list).
    """

    # Class-level defaults, so that making a node runs no __init__: a step makes hundreds.
    parents: tuple = ()  # per input: the node that made it, the leaf itself, or None
    input_shapes: tuple = ()
    input_layouts: tuple = ()  # per input: True where it was channels-last (its gradient is laid out so too)
    needs_input_grad: tuple = ()
    saved: tuple | None = ()
    retained: Any = None  # weak reference to the output tensor when it retains its grad
    saved_versions: tuple = ()
    half_inputs: bool = False
    sums_gradient_parts: bool = False

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = arrays

    def release(self) -> None:
        """Drop everything forward kept, so the memory returns as soon as backward has run (``saved`` None
        then tells a second backward that the graph is gone)."""
        attributes = self.__dict__
        attributes.clear()
        attributes["saved"] = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad_output: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Value:
        """Run the node on tensors (and other arguments), recording it when a gradient is needed."""
        # This runs for every operation of every step: list comprehensions, no generators, no helper calls
        # on the common path.
        if half_tensors.made and not cls.half_inputs:
            args = _widen_half_inputs(args)
        function = cls()
        tensors = [a for a in args if isinstance(a, Value)]
        if len(tensors) > 1:
            _check_same_device(tensors, cls.__name__)
        if len(tensors) == len(args):
            arrays = [a.data for a in args]
            needs = tuple([a.requires_grad for a in args])
        else:
            arrays = [a.data if isinstance(a, Value) else a for a in args]
            needs = tuple([isinstance(a, Value) and a.requires_grad for a in args])
        function.needs_input_grad = needs
        requires_grad = _grad_mode.enabled and True in needs
        data = function.forward(*arrays, **kwargs)
        output = tensors[0]._wrap(data, requires_grad)
        base = getattr(data, "base", None)
        if base is not None:
            _share_version_with_viewed(output, base, tensors)
        if requires_grad:
            function.parents = tuple([(a if a._node is None else a._node) if need else None
                                      for a, need in zip(args, needs)])
            function.input_shapes = tuple([a.data.shape if isinstance(a, Value) else None for a in args])
            function.input_layouts = tuple([isinstance(a, Value) and layout.is_channels_last(a.data) for a in args])
            output._node = function
            if function.saved:
                function.saved_versions = _versions_of_saved(function.saved, args, output)
        return output

    @classmethod
    def apply_in_place(cls, operation: str, target: Value, *args: Any, **kwargs: Any) -> Value:
        """Run the node with its output written over ``target``'s array and return ``target`` (PyTorch's
        in-place semantics: ``x.relu_()`` changes ``x``), bumping ``target``'s version (``operation``
        names the write, e.g. ``"relu_"``). When a gradient is needed the node is recorded and ``target``
        rebased onto it; a node that saved ``target``'s old values then refuses its backward.

        Refused with a ``RuntimeError``: a leaf that requires grad (under grad mode), and a tensor in the
        graph that shares its memory with a view (a write through one would leave the other's graph
        wrong). ``forward`` receives ``out=target.data`` and must write there; if its backward needs
        ``target``'s old values it must save a copy of them.
        """
        grad_mode = _grad_mode.enabled
        if grad_mode and target.requires_grad and target._node is None:
            raise RuntimeError(f"a leaf tensor that requires grad is used in an in-place operation ({operation}); "
                               "wrap it in `with minidnn.no_grad():` or use the out-of-place form")
        if half_tensors.made and not cls.half_inputs and (
                is_half(target.data) or any(isinstance(a, Value) and is_half(a.data) for a in args)):
            raise TypeError(f"{operation} on a float16 or bfloat16 tensor is not supported; use the out-of-place "
                            "form (it computes in float32)")
        function = cls()
        needs = (target.requires_grad,) + tuple(isinstance(a, Value) and a.requires_grad for a in args)
        record = grad_mode and True in needs
        if record and target._version is not None and target._version.shared:
            raise RuntimeError(f"{operation} on a tensor that shares its memory with a view is not supported while "
                               "a graph is recorded; use the out-of-place form")
        # Unrecorded, no input needs a gradient: forward then keeps no copy of what it overwrites.
        function.needs_input_grad = needs if record else (False,) * len(needs)
        first_edge = _edge(target)
        data = function.forward(target.data, *(a.data if isinstance(a, Value) else a for a in args),
                                out=target.data, **kwargs)
        if data is not target.data:
            raise RuntimeError(f"{cls.__name__}.forward did not write its result in place")
        bump_version(target, operation)
        if record:
            function.parents = (first_edge,) + tuple(_edge(a) for a in args)
            function.input_shapes = (tuple(target.data.shape),) + tuple(
                tuple(a.data.shape) if isinstance(a, Value) else None for a in args)
            function.input_layouts = (layout.is_channels_last(target.data),) + tuple(
                isinstance(a, Value) and layout.is_channels_last(a.data) for a in args)
            target._node, target.requires_grad = function, True
            if function.saved:
                function.saved_versions = _versions_of_saved(function.saved, args, target)
        return target


def _share_version_with_viewed(output: Value, base: Any, tensors: list) -> None:
    """When ``output``'s array is a view of an input's memory, the two share one version counter."""
    for tensor in tensors:
        if base is tensor.data or base is getattr(tensor.data, "base", None):
            counter = output._version = version_of(tensor)
            counter.shared = True
            return


def _versions_of_saved(saved: tuple, args: tuple, output: Value) -> tuple:
    """(counter, version now, which) for each saved array that is an input's or the output's array: ``which`` is
    the input's position, or -1 for the output (named only in an error: a step saves hundreds)."""
    records = []
    output_data = output.data
    for array in saved:
        if array is None:
            continue
        if array is output_data:
            counter = version_of(output)
            records.append((counter, counter.value, -1))
            continue
        for position, argument in enumerate(args):
            if isinstance(argument, Value) and array is argument.data:
                counter = version_of(argument)
                records.append((counter, counter.value, position))
                break
    return tuple(records)


def _check_saved_versions(node: Function) -> None:
    for counter, expected, which in node.saved_versions:
        if counter.value != expected:
            what = "its output" if which < 0 else f"its input {which}"
            raise RuntimeError(
                f"one of the arrays needed for gradient computation has been modified by an inplace operation "
                f"({counter.last}): {what}, saved by {type(node).__name__}, is at version {counter.value}; "
                f"expected version {expected}. Make that operation out of place (x = x * 2 rather than "
                f"x.mul_(2)), or run it after backward()")


def _edge(value: Any) -> "Function | Value | None":
    """Where a gradient for ``value`` goes: its node, the leaf itself, or nowhere."""
    if not isinstance(value, Value) or not value.requires_grad:
        return None
    return value if value._node is None else value._node


def _check_same_device(tensors: Sequence[Value], operation: str) -> None:
    try:  # compares devices as plain integers: Device objects are built only for the error below
        backend.get_array_module(*[t.data for t in tensors])
        return
    except ValueError:
        pass
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


class _GradientParts(list):
    """The two parts of a node's output gradient, pending in :func:`run_backward` until the node sums them in its
    backward (``Function.sums_gradient_parts``)."""


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
        if node.saved_versions:
            _check_saved_versions(node)
        output = node.retained() if node.retained is not None else None
        if type(grad) is _GradientParts:  # (only a sums_gradient_parts node whose output keeps no .grad gets parts)
            input_grads = node.backward(*grad)
        else:
            if output is not None:
                output._accumulate_grad(grad)
            input_grads = node.backward(grad)
        del grad  # the output's gradient is dead once the inputs' exist: free it before summing them
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        parents, shapes, layouts = node.parents, node.input_shapes, node.input_layouts
        if not retain_graph:
            node.release()
        for parent, shape, channels_last, parent_grad in zip(parents, shapes, layouts, input_grads):
            if parent is None or parent_grad is None:
                continue
            if parent_grad.shape != shape:
                parent_grad = unbroadcast(parent_grad, shape)
            if channels_last != layout.is_channels_last(parent_grad):  # a gradient keeps its tensor's layout
                parent_grad = layout.like(parent_grad, channels_last)
            if isinstance(parent, Value):
                parent._accumulate_grad(parent_grad)
            else:
                previous = pending.get(id(parent))
                if previous is None:
                    pending[id(parent)] = parent_grad
                elif type(previous) is _GradientParts:  # a third part: the first two summed
                    previous[:] = _sum_gradients(*previous), parent_grad
                elif parent.sums_gradient_parts and parent.retained is None:  # a retained .grad is the sum
                    pending[id(parent)] = _GradientParts((previous, parent_grad))
                else:
                    pending[id(parent)] = _sum_gradients(previous, parent_grad)
        del input_grads
