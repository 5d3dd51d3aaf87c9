"""Checkpoints: model, optimizer, scheduler, step and RNG state in one ``.npz`` file.

Arrays are stored as named ``.npz`` members (``model/layer1.0.conv1.weight``,
``optimizer/state/3/momentum_buffer``); everything else (hyper-parameters, counters, RNG state,
user extras) is one JSON document in the member ``metadata``. Files are written to a temporary
file beside the target, flushed to the disk and renamed over it, so a crash never leaves half a
checkpoint, and read with ``allow_pickle=False``, so loading can never run code.

A process killed during a save (``kill -9``, a power cut) leaves its temporary file behind. Those
are named ``<target>.minidnn-<8 hex digits>.tmp`` so that :func:`remove_orphans` can find and
delete exactly them on the next start, and nothing else.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import zipfile
from typing import Any, Iterable

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


def temporary_pattern(name: str) -> re.Pattern:
    """The names :func:`atomic_write` gives its temporary files for the target file ``name``."""
    return re.compile(re.escape(name) + r"\.minidnn-[0-9a-f]{8}\.tmp")


def atomic_write(path: str | os.PathLike, write: Any) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, then rename it onto ``path``.

    Readers see the old file or the new one, never a part: ``os.replace`` is atomic, and the fsync
    before it makes sure the new name cannot point at data still in the page cache after a crash.
    Any exception (also ``KeyboardInterrupt`` or ``SystemExit`` from a signal) removes the temporary.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f"{os.path.basename(path)}.minidnn-{secrets.token_hex(4)}.tmp")
    try:
        # O_EXCL: never write into a file that is already there; 0o666 & umask, like open(..., "w").
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    if os.name == "posix":  # make the rename itself durable: fsync the directory entry
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def remove_orphans(directory: str | os.PathLike, names: Iterable[str]) -> list[str]:
    """Delete the temporary files that an interrupted :func:`atomic_write` of ``directory/name``
    left (for each of ``names``); returns their paths. Other files, and temporaries of other
    targets, are left alone. Call it only when no other process is writing those targets."""
    directory = os.fspath(directory)
    patterns = [temporary_pattern(name) for name in names]
    removed = []
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        if any(p.fullmatch(entry) for p in patterns) and os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    return removed


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


def load_checkpoint(path: str | os.PathLike | Checkpoint, model: Any, optimizer: Any = None, scheduler: Any = None,
                    restore_rng: bool = True, strict: bool = True) -> Checkpoint:
    """Restore a checkpoint into ``model`` (and the optimizer, scheduler and global RNG); returns it.

    ``path`` may also be a :class:`Checkpoint` already read (to look at its extras first)."""
    checkpoint = path if isinstance(path, Checkpoint) else read_checkpoint(path)
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
