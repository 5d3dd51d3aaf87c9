"""Checkpoints: model, optimizer, scheduler, step and RNG state in one ``.npz`` file.

Arrays are stored as named ``.npz`` members (``model/layer1.0.conv1.weight``,
``optimizer/state/3/momentum_buffer``); everything else (hyper-parameters, counters, RNG state,
user extras) is one JSON document in the member ``metadata``. Files are written to a temporary
file and renamed, so a crash never leaves half a checkpoint, and read with
``allow_pickle=False``, so loading can never run code.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

from . import backend
from . import random as _random
from .tensor import Tensor

FORMAT = "minidnn-checkpoint"
VERSION = 1


def _host(value: Any) -> np.ndarray:
    return backend.to_device(value.data if isinstance(value, Tensor) else value, "cpu")


def _is_array(value: Any) -> bool:
    return isinstance(value, (Tensor, np.ndarray)) or backend.is_cuda_array(value)


def atomic_write(path: str | os.PathLike, write: Any, suffix: str = ".tmp") -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it onto ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=suffix)
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def save_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None, scheduler: Any = None,
                    step: int = 0, extra: dict[str, Any] | None = None) -> None:
    """Write ``model`` (its state dict), optionally ``optimizer`` and ``scheduler``, the step counter,
    the global RNG state and a JSON-able ``extra`` dict (epoch, best accuracy, arguments...)."""
    arrays: dict[str, np.ndarray] = {f"model/{k}": _host(v) for k, v in model.state_dict().items()}
    metadata: dict[str, Any] = {"format": FORMAT, "version": VERSION, "step": int(step), "extra": extra or {},
                                "rng": _random.get_rng_state(), "model_class": type(model).__name__}
    if optimizer is not None:
        state = optimizer.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for index, values in state["state"].items():
            for name, value in values.items():
                if _is_array(value):
                    arrays[f"optimizer/state/{index}/{name}"] = _host(value)
                else:
                    scalars.setdefault(str(index), {})[name] = value
        metadata["optimizer"] = {"class": type(optimizer).__name__, "param_groups": state["param_groups"],
                                 "scalars": scalars}
    if scheduler is not None:
        metadata["scheduler"] = {"class": type(scheduler).__name__, "state": scheduler.state_dict()}
    try:
        text = json.dumps(metadata)
    except TypeError as error:
        raise TypeError(f"checkpoint extras must be JSON-serialisable: {error}") from None
    arrays["metadata"] = np.array(text)
    atomic_write(path, lambda file: np.savez(file, **arrays))


class Checkpoint:
    """What :func:`read_checkpoint` found: NumPy arrays and plain values, nothing applied yet."""

    def __init__(self, path: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
        self.path = path
        self.metadata = metadata
        self.step: int = metadata["step"]
        self.extra: dict[str, Any] = metadata.get("extra", {})
        self.model_state = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
        self.optimizer_state = None
        if "optimizer" in metadata:
            state: dict[int, dict[str, Any]] = {}
            for key, value in arrays.items():
                if key.startswith("optimizer/state/"):
                    index, name = key[len("optimizer/state/"):].split("/", 1)
                    state.setdefault(int(index), {})[name] = value
            for index, values in metadata["optimizer"]["scalars"].items():
                state.setdefault(int(index), {}).update(values)
            self.optimizer_state = {"state": state, "param_groups": metadata["optimizer"]["param_groups"]}
        self.scheduler_state = metadata["scheduler"]["state"] if "scheduler" in metadata else None


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint; a missing, truncated or foreign file is a ``ValueError`` naming it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        metadata = json.loads(str(arrays.pop("metadata")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, json.JSONDecodeError) as error:
        raise ValueError(f"{path!r} is not a readable minidnn checkpoint ({type(error).__name__}: {error})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not a minidnn checkpoint (no '{FORMAT}' marker)")
    if metadata.get("version") != VERSION:
        raise ValueError(f"{path!r} is a version {metadata.get('version')} checkpoint; this minidnn reads version {VERSION}")
    return Checkpoint(path, arrays, metadata)


def load_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None, scheduler: Any = None,
                    restore_rng: bool = True, strict: bool = True) -> Checkpoint:
    """Restore a checkpoint into ``model`` (and the optimizer, scheduler and global RNG); returns it."""
    checkpoint = read_checkpoint(path)
    try:
        model.load_state_dict(checkpoint.model_state, strict=strict)
        if optimizer is not None:
            if checkpoint.optimizer_state is None:
                raise ValueError("it holds no optimizer state")
            saved_class = checkpoint.metadata["optimizer"]["class"]
            if saved_class != type(optimizer).__name__:
                raise ValueError(f"it holds {saved_class} state, not {type(optimizer).__name__}")
            optimizer.load_state_dict(checkpoint.optimizer_state)
        if scheduler is not None:
            if checkpoint.scheduler_state is None:
                raise ValueError("it holds no scheduler state")
            scheduler.load_state_dict(checkpoint.scheduler_state)
    except ValueError as error:
        raise ValueError(f"cannot load checkpoint {checkpoint.path!r}: {error}") from None
    if restore_rng:
        _random.set_rng_state(checkpoint.metadata["rng"])
    return checkpoint
