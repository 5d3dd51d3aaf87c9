"""Which library the operations run on: minidnn's primitives (the default) or the naive engine.

An :class:`Engine` is a library that implements every function named in :data:`CONTRACT`, with
the signatures and results of :mod:`minidnn.primitives`: ``minidnn`` (the primitives) and
``naive`` (:mod:`minidnn.naive`, the Caffe-style baseline the benchmark compares against).
:mod:`minidnn.functional` and :mod:`minidnn.optim` reach the operations only through :data:`library`,
which looks the function up on the current engine *when it is called*: nothing binds to an engine at
import time, so ``set_engine`` changes every later operation, and nothing else does.
"""
from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any, Callable, Iterator

# Every operation functional and optim call. An engine must implement all of them.
CONTRACT = (
    "conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "bias_add", "bias_backward",
    "linear_forward", "linear_backward_data", "linear_backward_weight",
    "max_pool2d_forward", "max_pool2d_backward", "avg_pool2d_forward", "avg_pool2d_backward",
    "adaptive_avg_pool2d_forward", "adaptive_avg_pool2d_backward",
    "relu_forward", "relu_backward", "sigmoid_forward", "sigmoid_backward", "tanh_forward", "tanh_backward",
    "softmax_forward", "softmax_backward", "log_softmax_forward", "log_softmax_backward",
    "cross_entropy_forward", "cross_entropy_backward", "nll_loss_forward", "nll_loss_backward",
    "dropout_forward", "dropout_backward",
    "batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward_training",
    "batch_norm_backward_inference", "lrn_forward", "lrn_backward",
    "sgd_update", "adam_update", "sgd_update_multi", "adam_update_multi", "unscale_gradients_multi", "update_loss_scale",
    "add_relu_forward",
    "leaky_relu_forward", "leaky_relu_backward", "silu_forward", "silu_backward", "gelu_forward", "gelu_backward",
    "layer_norm_forward", "layer_norm_backward",
)


class Engine:
    """A named library of operations: ``engine.relu_forward(x)`` is that library's ``relu_forward``.

    The module is imported on first use and checked against :data:`CONTRACT`, so an engine that
    lacks an operation fails when it is chosen, with the missing names, not halfway through a step.
    """

    def __init__(self, name: str, module: str) -> None:
        self.name, self.module_name = name, module
        self._module: ModuleType | None = None

    @property
    def module(self) -> ModuleType:
        """The engine's module, imported and checked against the contract on first use."""
        if self._module is None:
            module = importlib.import_module(self.module_name)
            missing = [name for name in CONTRACT if not callable(getattr(module, name, None))]
            if missing:
                raise TypeError(f"engine {self.name!r} ({self.module_name}) lacks {', '.join(missing)}")
            self._module = module
        return self._module

    @property
    def functions(self) -> dict[str, Callable[..., Any]]:
        """Contract name -> the engine's function, as the module holds it now."""
        return {name: getattr(self.module, name) for name in CONTRACT}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in CONTRACT:
            raise AttributeError(f"{name!r} is not an operation of the engine contract")
        return getattr(self.module, name)

    def __repr__(self) -> str:
        return f"<engine {self.name!r} ({self.module_name})>"


ENGINES = {"minidnn": Engine("minidnn", "minidnn.primitives"), "naive": Engine("naive", "minidnn.naive")}
_current = ENGINES["minidnn"]
_current_module: ModuleType | None = None  # the current engine's module, imported on the first operation


def get_engine() -> str:
    """The current engine's name."""
    return _current.name


def current() -> Engine:
    """The current engine."""
    return _current


def set_engine(name: str) -> None:
    """Select ``"minidnn"`` (the primitives library) or ``"naive"`` (Caffe-style baseline) for every later op."""
    global _current, _current_module
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {name!r}")
    ENGINES[name].functions  # noqa: B018 - import and check the contract now, not mid-step
    _current, _current_module = ENGINES[name], ENGINES[name].module


@contextlib.contextmanager
def use_engine(name: str) -> Iterator[None]:
    """``with minidnn.use_engine("naive"): ...`` runs the block on that engine."""
    before = _current.name
    set_engine(name)
    try:
        yield
    finally:
        set_engine(before)


_CONTRACT = frozenset(CONTRACT)


class _CurrentEngine:
    """``library.conv2d_forward`` is the current engine's ``conv2d_forward``, looked up at each call (one
    attribute of the engine's module: every operation of a step passes here)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in _CONTRACT:
            raise AttributeError(f"{name!r} is not an operation of the engine contract")
        global _current_module
        if _current_module is None:  # the default engine, imported (and checked) on the first operation
            _current_module = _current.module
        return getattr(_current_module, name)


library = _CurrentEngine()
