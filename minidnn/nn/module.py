"""Module, Parameter and the containers, with PyTorch's registration rules, state-dict format and hooks.

Assigning a :class:`Parameter` or a :class:`Module` to an attribute registers it; buffers
(non-trainable state such as batch norm's running mean) are registered with
:meth:`Module.register_buffer`. Names compose with dots (``layer1.0.conv1.weight``), exactly as in
PyTorch, so state dicts line up key for key with torchvision's.

Hooks are PyTorch's too: forward pre-hooks and forward hooks around ``forward``, and full backward
hooks, called with the gradients at the module's inputs and outputs. Each ``register_*`` returns a
:class:`RemovableHandle`.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict, namedtuple
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .. import backend
from .. import memory_format as formats
from ..autograd import RemovableHandle, is_grad_enabled, no_grad
from ..tensor import Tensor, cat

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])

_HOOK_TABLES = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
                "_backward_pre_hooks", "_backward_hooks")


class Parameter(Tensor):
    """A tensor that is a module's trainable parameter (``requires_grad`` by default)."""

    __slots__ = ()

    def __init__(self, data: Any = None, requires_grad: bool = True) -> None:
        if isinstance(data, Tensor):
            data = data.data
        if data is None:
            data = np.empty((0,), dtype=np.float32)
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class of layers and models: subclasses set attributes in ``__init__`` and define ``forward``."""

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        for table in _HOOK_TABLES:
            object.__setattr__(self, table, OrderedDict())

    # --- registration -------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before assigning attributes in a Module's __init__")
        if isinstance(value, (Parameter, Module)):
            for table in (self._parameters, self._buffers, self._modules, self.__dict__):
                table.pop(name, None)
            (self._parameters if isinstance(value, Parameter) else self._modules)[name] = value
            return
        for table, expected in ((self._parameters, "a Parameter"), (self._modules, "a Module"), (self._buffers, "a Tensor")):
            if name in table:
                if value is not None and not (table is self._buffers and isinstance(value, Tensor)):
                    raise TypeError(f"cannot assign {type(value).__name__} to {name!r}: expected {expected} or None")
                table[name] = value
                return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        for table in ("_parameters", "_buffers", "_modules"):
            values = self.__dict__.get(table)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"parameter {name!r} must be a Parameter or None, got {type(param).__name__}")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Register non-trainable state; persistent buffers are part of the state dict."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"buffer {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        self._buffers[name] = tensor
        (self._non_persistent.discard if persistent else self._non_persistent.add)(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{name!r} must be a Module or None, got {type(module).__name__}")
        self._modules[name] = module

    # --- calling ------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    # Set once a hook is registered (never cleared: with empty tables the hooked path runs no hook), so a
    # module without hooks, every module of a training step in practice, pays one attribute read per call.
    _has_hooks = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._has_hooks:
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    def _call_with_hooks(self, args: tuple, kwargs: dict) -> Any:
        """forward with PyTorch's order: pre-hooks (which may replace the arguments), the backward taps on
        the inputs, forward, forward hooks (which may replace the output), the taps on the outputs."""
        for key, hook in list(self._forward_pre_hooks.items()):
            if key in self._forward_pre_hooks_with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise TypeError(f"a forward pre-hook registered with_kwargs must return None or "
                                        f"(args, kwargs), got {type(result).__name__}")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        taps = None
        if (self._backward_hooks or self._backward_pre_hooks) and is_grad_enabled():
            taps = _BackwardHooks(self, list(self._backward_hooks.values()), list(self._backward_pre_hooks.values()))
            args = taps.setup_inputs(args)
        output = self.forward(*args, **kwargs)
        for key, hook in list(self._forward_hooks.items()):
            if key in self._forward_hooks_with_kwargs:
                result = hook(self, args, kwargs, output)
            else:
                result = hook(self, args, output)
            if result is not None:
                output = result
        return output if taps is None else taps.setup_outputs(output)

    # --- hooks --------------------------------------------------------------------------------
    def _add_hook(self, table: str, hook: Callable[..., Any], prepend: bool, with_kwargs: bool = False,
                  kwargs_table: str | None = None) -> RemovableHandle:
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__}")
        hooks = getattr(self, table)
        object.__setattr__(self, "_has_hooks", True)
        tables = (hooks,) if kwargs_table is None else (hooks, getattr(self, kwargs_table))
        handle = RemovableHandle(*tables)
        hooks[handle.id] = hook
        if with_kwargs:
            getattr(self, kwargs_table)[handle.id] = True
        if prepend:
            hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_pre_hook(self, hook: Callable[..., Any], *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args)`` before each forward; a non-None result replaces args (a single value
        becomes a 1-tuple). With ``with_kwargs``: ``hook(module, args, kwargs)`` returning None or
        ``(args, kwargs)``. ``prepend`` runs it before the hooks already registered."""
        return self._add_hook("_forward_pre_hooks", hook, prepend, with_kwargs, "_forward_pre_hooks_with_kwargs")

    def register_forward_hook(self, hook: Callable[..., Any], *, prepend: bool = False,
                              with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` after each forward (``hook(module, args, kwargs, output)`` with
        ``with_kwargs``); a non-None result replaces the output."""
        return self._add_hook("_forward_hooks", hook, prepend, with_kwargs, "_forward_hooks_with_kwargs")

    def register_full_backward_pre_hook(self, hook: Callable[..., Any], *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_output)`` when the gradients of the module's outputs are known, before they
        flow into it; a non-None result (a tuple like grad_output) replaces them."""
        return self._add_hook("_backward_pre_hooks", hook, prepend)

    def register_full_backward_hook(self, hook: Callable[..., Any], *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_input, grad_output)`` once the gradients of the module's inputs are known,
        as PyTorch calls it: tuples with one entry per positional input (None where an input is not a
        tensor requiring grad) and per output. A non-None result, a tuple like grad_input, replaces the
        input gradients that flow on. When no input requires grad the hook runs as soon as grad_output is
        known, with grad_input all None, and must return None (PyTorch's rule and warning)."""
        return self._add_hook("_backward_hooks", hook, prepend)

    # --- traversal ----------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        seen: set[int] = set()
        stack = [(prefix, self)]
        while stack:  # iterative pre-order: deep models never hit the recursion limit
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{child}" if name else child, m) for child, m in module._modules.items() if m is not None]
            stack.extend(reversed(children))

    def modules(self) -> Iterator["Module"]:
        return (module for _, module in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        return ((name, m) for name, m in self._modules.items() if m is not None)

    def children(self) -> Iterator["Module"]:
        return (m for _, m in self.named_children())

    def _named_members(self, table: str, recurse: bool) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        modules = self.named_modules() if recurse else [("", self)]
        for prefix, module in modules:
            for name, value in getattr(module, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{prefix}.{name}" if prefix else name), value

    def named_parameters(self, recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        return self._named_members("_parameters", recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters(recurse))

    def named_buffers(self, recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse))

    def apply(self, function: Callable[["Module"], None]) -> "Module":
        for module in reversed(list(self.modules())):  # children first, as PyTorch
            function(module)
        return self

    # --- modes and devices --------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise TypeError(f"train() mode must be a bool, got {type(mode).__name__}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.data[...] = 0

    def to(self, target: Any = None, dtype: Any = None, *,
           memory_format: formats.memory_format = formats.preserve_format) -> "Module":
        """Move parameters and buffers in place to a device and/or cast floating ones to ``dtype``; with
        ``memory_format=minidnn.channels_last`` (or ``contiguous_format``) lay out the 4-D floating ones so
        (convolution weights), as PyTorch does: a convolution with a channels-last weight gives a
        channels-last output, and the layers after it keep that layout."""
        if target is not None and not isinstance(target, (str, backend.Device)):
            target, dtype = None, target
        target = None if target is None else backend.device(target)
        dtype = None if dtype is None else np.dtype(dtype)
        formats.check(memory_format)

        def convert(array: Any) -> Any:
            if dtype is not None and array.dtype.kind == "f":
                array = array.astype(dtype, copy=False)
            array = formats.lay_out(array, memory_format)
            return array if target is None else backend.to_device(array, target)

        for tensor in list(self.parameters()) + list(self.buffers()):
            tensor.data = convert(tensor.data)
            if tensor.grad is not None:
                tensor.grad.data = convert(tensor.grad.data)
        return self

    def cpu(self) -> "Module":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Module":
        return self.to(f"cuda:{index}")

    def float(self) -> "Module":
        return self.to(np.float32)

    def double(self) -> "Module":
        return self.to(np.float64)

    # --- state dict ---------------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, Tensor]":
        """Parameters and persistent buffers by dotted name, detached (they share memory)."""
        state: OrderedDict[str, Tensor] = OrderedDict()
        for prefix, module in self.named_modules():
            lead = f"{prefix}." if prefix else ""
            for name, p in module._parameters.items():
                if p is not None:
                    state[lead + name] = p.detach()
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    state[lead + name] = b.detach()
        return state

    def load_state_dict(self, state_dict: "dict[str, Any]", strict: bool = True) -> IncompatibleKeys:
        """Copy values (Tensors or arrays) into parameters and buffers, keeping their device and dtype.

        Raises one ``ValueError`` listing every missing, unexpected and shape-mismatched key
        (missing/unexpected only when ``strict``; a shape mismatch always).
        """
        if not hasattr(state_dict, "items"):
            raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
        own = self.state_dict()
        missing = [key for key in own if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own]
        mismatched = []
        for key, target in own.items():
            if key in state_dict:
                value = state_dict[key]
                shape = tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))
                if shape != target.shape:
                    mismatched.append(f"{key}: checkpoint {shape}, model {target.shape}")
        problems = [f"shape mismatch for {m}" for m in mismatched]
        if strict:
            problems = ([f"missing keys: {', '.join(missing)}"] if missing else []) + \
                       ([f"unexpected keys: {', '.join(unexpected)}"] if unexpected else []) + problems
        if problems:
            raise ValueError(f"error loading state dict into {type(self).__name__}:\n  " + "\n  ".join(problems))
        with no_grad():
            for key, target in own.items():
                if key in state_dict:
                    value = state_dict[key]
                    value = value.data if isinstance(value, Tensor) else value
                    target.data[...] = backend.to_device(value, target.device).astype(target.dtype, copy=False)
        return IncompatibleKeys(missing, unexpected)

    # --- printing -----------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(module).replace("\n", "\n  ") for name, module in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ")" if not lines else head + "\n  " + "\n  ".join(lines) + "\n)"


class Sequential(Module):
    """Modules applied in order; children named "0", "1", ... (or by an OrderedDict's keys)."""

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for index, module in enumerate(modules):
                self.add_module(str(index), module)

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x

    def __getitem__(self, index: int | slice) -> Any:
        items = list(self._modules.values())
        return Sequential(*items[index]) if isinstance(index, slice) else items[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of modules, registered as children "0", "1", ..."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        for module in modules or []:
            self.append(module)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


# ----------------------------------------------------------------------------------------------
# Full backward hooks: taps on a module's inputs and outputs
# ----------------------------------------------------------------------------------------------
def _tap(tensors: list[Tensor], callback: Callable[[list[Any]], Any]) -> list[Tensor]:
    """The same values as ``tensors``, passed through one ``GradientHookFunction`` node, whose backward
    calls ``callback(gradient arrays, one per tensor)`` and takes a list of replacements (or None).

    Several tensors are packed into one flat vector first (and unpacked after the node), so that the
    callback sees all their gradients at once: the graph's nodes have one output each."""
    if len(tensors) == 1:
        def single(grad: Any) -> Any:
            replaced = callback([grad])
            return None if replaced is None else replaced[0]
        return [tensors[0]._tap_gradient(single)]
    shapes, sizes = [t.shape for t in tensors], [t.numel() for t in tensors]
    bounds = np.cumsum(sizes)[:-1]

    def packed_hook(grad: Any) -> Any:
        pieces = [piece.reshape(shape) for piece, shape in zip(backend.get_array_module(grad).split(grad, bounds), shapes)]
        replaced = callback(pieces)
        if replaced is None:
            return None
        return backend.get_array_module(grad).concatenate([r.reshape(-1).astype(grad.dtype) for r in replaced])

    packed = cat([t.reshape(-1) for t in tensors])._tap_gradient(packed_hook)
    starts = [0] + list(np.cumsum(sizes))
    return [packed[starts[i]:starts[i + 1]].reshape(shapes[i]).to(t.dtype) for i, t in enumerate(tensors)]


class _BackwardHooks:
    """The full backward hooks of one forward call: the output tap records grad_output (and runs the
    pre-hooks); the input tap, which the backward reaches after every output tap, runs the hooks."""

    def __init__(self, module: Module, hooks: list[Callable[..., Any]], pre_hooks: list[Callable[..., Any]]) -> None:
        self.module, self.hooks, self.pre_hooks = module, hooks, pre_hooks
        self.grad_outputs: tuple | None = None
        self.input_positions: list[int] | None = None
        self.output_positions: list[int] = []
        self.input_count = self.output_count = 0
        self.input_like: list[Tensor] = []
        self.output_like: list[Tensor] = []

    @staticmethod
    def _positions(values: tuple) -> list[int]:
        return [i for i, v in enumerate(values) if isinstance(v, Tensor) and v.requires_grad]

    @staticmethod
    def _pack(positions: list[int], grads: list[Any], count: int) -> tuple:
        packed: list[Any] = [None] * count
        for position, grad in zip(positions, grads):
            packed[position] = Tensor(grad)
        return tuple(packed)

    @staticmethod
    def _unpack(values: tuple, positions: list[int], like: list[Tensor], what: str) -> list[Any]:
        """The arrays of the replacement gradients at ``positions`` (zeros for None), checked against the tensors."""
        arrays = []
        for position, tensor in zip(positions, like):
            value = values[position]
            if value is None:
                arrays.append(backend.get_array_module(tensor.data).zeros(tensor.shape, dtype=tensor.dtype))
                continue
            array = value.data if isinstance(value, Tensor) else value
            if tuple(array.shape) != tensor.shape:
                raise ValueError(f"a backward hook returned a gradient of shape {tuple(array.shape)} for module "
                                 f"{what} of shape {tensor.shape}")
            arrays.append(array)
        return arrays

    def _tap_at(self, values: tuple, callback: Callable[[list[Any]], Any]) -> tuple[list[int], list[Tensor], tuple]:
        """(positions of the tensors requiring grad, those tensors, values with them passed through a tap)."""
        positions = self._positions(values)
        like = [values[i] for i in positions]
        if not positions:
            return positions, like, values
        tapped = list(values)
        for position, tensor in zip(positions, _tap(like, callback)):
            tapped[position] = tensor
        return positions, like, tuple(tapped)

    def setup_inputs(self, args: tuple) -> tuple:
        self.input_count = len(args)
        positions, self.input_like, args = self._tap_at(args, self._on_input_grads)
        self.input_positions = positions or None  # None: no input requires grad
        return args

    def setup_outputs(self, output: Any) -> Any:
        is_tuple = isinstance(output, tuple)
        outputs = output if is_tuple else (output,)
        self.output_count = len(outputs)
        self.output_positions, self.output_like, outputs = self._tap_at(outputs, self._on_output_grads)
        return outputs if is_tuple else outputs[0]

    @staticmethod
    def _run(hooks: list[Callable[..., Any]], call: Callable[[Callable[..., Any], tuple], Any], grads: tuple,
             kind: str, name: str) -> tuple[tuple, bool]:
        """Call each hook in turn on ``grads``; a non-None result (as long as grads) replaces them for the
        next. Returns the final grads and whether any hook replaced them."""
        replaced = False
        for hook in hooks:
            result = call(hook, grads)
            if result is None:
                continue
            result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            if len(result) != len(grads):
                raise ValueError(f"a backward {kind} returned {len(result)} {name} entries, expected {len(grads)}")
            grads, replaced = result, True
        return grads, replaced

    def _on_output_grads(self, grads: list[Any]) -> list[Any] | None:
        grad_outputs = self._pack(self.output_positions, grads, self.output_count)
        grad_outputs, replaced = self._run(self.pre_hooks, lambda hook, g: hook(self.module, g), grad_outputs,
                                           "pre-hook", "grad_output")
        self.grad_outputs = grad_outputs
        if self.input_positions is None:
            warnings.warn("Full backward hook is firing when gradients are computed with respect to module outputs "
                          "since no inputs require gradients", UserWarning, stacklevel=2)
            grad_inputs = (None,) * self.input_count
            for hook in self.hooks:
                result = hook(self.module, grad_inputs, grad_outputs)
                if result is not None and not all(r is None for r in result):
                    raise ValueError("a backward hook of a module whose inputs do not require gradients must "
                                     "return None (or None for every gradient)")
            self.grad_outputs = None
        return self._unpack(grad_outputs, self.output_positions, self.output_like, "outputs") if replaced else None

    def _on_input_grads(self, grads: list[Any]) -> list[Any] | None:
        if self.grad_outputs is None:
            return None
        grad_inputs = self._pack(self.input_positions, grads, self.input_count)
        grad_outputs = self.grad_outputs
        grad_inputs, replaced = self._run(self.hooks, lambda hook, g: hook(self.module, g, grad_outputs), grad_inputs,
                                          "hook", "grad_input")
        self.grad_outputs = None
        return self._unpack(grad_inputs, self.input_positions, self.input_like, "inputs") if replaced else None
