"""Module, Parameter and the containers, with PyTorch's registration rules and state-dict format.

Assigning a :class:`Parameter` or a :class:`Module` to an attribute registers it; buffers
(non-trainable state such as batch norm's running mean) are registered with
:meth:`Module.register_buffer`. Names compose with dots (``layer1.0.conv1.weight``), exactly as in
PyTorch, so state dicts line up key for key with torchvision's.
"""
from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .. import backend
from ..autograd import no_grad
from ..tensor import Tensor

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

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

    def to(self, target: Any = None, dtype: Any = None) -> "Module":
        """Move parameters and buffers in place to a device and/or cast floating ones to ``dtype``."""
        if target is not None and not isinstance(target, (str, backend.Device)):
            target, dtype = None, target
        target = None if target is None else backend.device(target)
        dtype = None if dtype is None else np.dtype(dtype)

        def convert(array: Any) -> Any:
            if dtype is not None and array.dtype.kind == "f":
                array = array.astype(dtype, copy=False)
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
