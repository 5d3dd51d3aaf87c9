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

import contextlib
import json
import numbers
import os
import re
import secrets
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


class _Damaged(Exception):
    """A part of a checkpoint that is not what :func:`save_checkpoint` writes (the message says which)."""


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise _Damaged(what)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Checkpoint:
    """What :func:`read_checkpoint` found: NumPy arrays and plain values, nothing applied yet."""

    def __init__(self, path: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
        self.path = path
        self.metadata = metadata
        _expect(_is_int(metadata.get("step")) and metadata["step"] >= 0, "its step is not a whole number >= 0")
        _expect(isinstance(metadata.get("extra", {}), dict), "its extra is not a JSON object")
        _expect(isinstance(metadata.get("rng"), dict), "it holds no random-number state")
        self.step: int = metadata["step"]
        self.extra: dict[str, Any] = metadata.get("extra", {})
        self.model_state: dict[str, np.ndarray] = {}
        optimizer_arrays: dict[int, dict[str, np.ndarray]] = {}
        for key, value in arrays.items():
            if key.startswith("model/") and len(key) > len("model/"):
                _expect(value.dtype.kind in "biuf", f"the member {key} holds {value.dtype}, not numbers")
                self.model_state[key[len("model/"):]] = value
                continue
            parts = key.split("/")
            _expect(len(parts) == 4 and parts[:2] == ["optimizer", "state"] and parts[2].isdigit() and parts[3],
                    f"the member {key} is none of a checkpoint's (model/..., optimizer/state/N/...)")
            optimizer_arrays.setdefault(int(parts[2]), {})[parts[3]] = value
        _expect(bool(self.model_state), "it holds no model weights (no model/... members)")
        self.optimizer_state = None
        if "optimizer" in metadata:
            saved = metadata["optimizer"]
            _expect(isinstance(saved, dict) and isinstance(saved.get("class"), str)
                    and isinstance(saved.get("param_groups"), list) and isinstance(saved.get("scalars"), dict),
                    "its optimizer entry lacks a class, param_groups or scalars")
            for group in saved["param_groups"]:
                _expect(isinstance(group, dict) and isinstance(group.get("params"), list)
                        and all(_is_int(i) for i in group["params"]), "an optimizer parameter group is malformed")
            state: dict[int, dict[str, Any]] = {index: dict(values) for index, values in optimizer_arrays.items()}
            for index, values in saved["scalars"].items():
                _expect(index.isdigit() and isinstance(values, dict), f"the optimizer scalars of {index!r} are malformed")
                state.setdefault(int(index), {}).update(values)
            self.optimizer_state = {"state": state, "param_groups": saved["param_groups"]}
        else:
            _expect(not optimizer_arrays, "it holds optimizer arrays but no optimizer entry")
        self.scheduler_state = None
        if "scheduler" in metadata:
            saved = metadata["scheduler"]
            _expect(isinstance(saved, dict) and isinstance(saved.get("state"), dict), "its scheduler entry is malformed")
            self.scheduler_state = saved["state"]


def read_archive(source: Any, label: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The members of the ``.npz`` archive ``source`` (a path or a binary file object) and its JSON
    ``metadata`` member, parsed; ``label`` names the file in errors. Any damage (not a zip, a
    truncated or garbled member, a pickled object array, no metadata, bad JSON) is a ``ValueError``
    naming the file: readers of a file must not fail with whatever NumPy or zipfile raise inside."""
    magic = _first_bytes(source, 6)
    if not magic.startswith(b"PK\x03\x04"):  # np.load would take it for a pickle, or for one .npy array
        what = "it is empty" if not magic else "a single .npy array" if magic.startswith(b"\x93NUMPY") else \
            "a pickle, which is never loaded" if magic[:1] == b"\x80" else "it does not start as a zip file does"
        raise ValueError(f"{label} is not an .npz archive ({what})")
    try:
        # A path is opened here, not by np.load: NumPy leaves the file open when the zip directory is damaged.
        opened = open(source, "rb") if isinstance(source, (str, os.PathLike)) else contextlib.nullcontext(source)
        with opened as file, np.load(file, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except MemoryError:
        raise
    except Exception as error:  # zipfile, zlib, the .npy header parser and pickle refusal raise many types
        reason = "a member is a pickled object, which is never loaded" if "allow_pickle" in str(error) else \
            f"{type(error).__name__}: {error}"
        raise ValueError(f"{label} is not a readable .npz archive ({reason})") from None
    text = arrays.pop("metadata", None)
    if text is None:
        raise ValueError(f"{label} has no metadata member: it was not written by minidnn")
    if text.dtype.kind != "U" or text.ndim != 0:
        raise ValueError(f"{label} is damaged: its metadata member is {text.dtype} of shape {text.shape}, not text")
    try:
        metadata = json.loads(str(text))
    except json.JSONDecodeError as error:
        raise ValueError(f"{label} is damaged: its metadata is not JSON ({error})") from None
    if not isinstance(metadata, dict):
        raise ValueError(f"{label} is damaged: its metadata is a JSON {type(metadata).__name__}, not an object")
    return arrays, metadata


def _first_bytes(source: Any, count: int) -> bytes:
    """The first ``count`` bytes of a path or of a seekable file object (whose position is kept)."""
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, "rb") as file:
                return file.read(count)
        except OSError as error:
            raise ValueError(f"{os.fspath(source)!r} cannot be read ({error.strerror or error})") from None
    position = source.tell()
    try:
        return source.read(count)
    finally:
        source.seek(position)


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint; a missing file is a ``FileNotFoundError``, a truncated, damaged or foreign
    one a ``ValueError`` naming it. Everything is checked here, so :func:`load_checkpoint` fails only
    when the checkpoint does not fit the objects it is loaded into."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file {path!r} does not exist")
    arrays, metadata = read_archive(path, repr(path))
    return checkpoint_from(path, arrays, metadata)


def checkpoint_from(path: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> Checkpoint:
    """The :class:`Checkpoint` of an archive already read by :func:`read_archive`, checked."""
    if metadata.get("format") != FORMAT:
        hint = " (a file of minidnn.save: read it with minidnn.load)" if metadata.get("format") == "minidnn-save" else ""
        raise ValueError(f"{path!r} is not a minidnn checkpoint (no '{FORMAT}' marker){hint}")
    if metadata.get("version") != VERSION:
        raise ValueError(f"{path!r} is a version {metadata.get('version')} checkpoint; this minidnn reads version {VERSION}")
    try:
        return Checkpoint(path, arrays, metadata)
    except _Damaged as error:
        raise ValueError(f"{path!r} is a damaged minidnn checkpoint: {error}") from None


def load_checkpoint(path: str | os.PathLike | Checkpoint, model: Any, optimizer: Any = None, scheduler: Any = None,
                    restore_rng: bool = True, strict: bool = True) -> Checkpoint:
    """Restore a checkpoint into ``model`` (and the optimizer, scheduler and global RNG); returns it.

    ``path`` may also be a :class:`Checkpoint` already read (to look at its extras first). Whatever
    does not fit (other parameter names or shapes, another optimizer, a scheduler state of another
    form, a random state that does not parse) is a ``ValueError`` naming the file, raised before the
    optimizer, scheduler or random state are changed."""
    checkpoint = path if isinstance(path, Checkpoint) else read_checkpoint(path)
    try:
        if optimizer is not None:
            _check_optimizer(checkpoint, optimizer)
        if scheduler is not None:
            if checkpoint.scheduler_state is None:
                raise ValueError("it holds no scheduler state")
            _check_same_form(checkpoint.scheduler_state, scheduler.state_dict(), "the scheduler state")
        if restore_rng:
            try:
                _random.Generator().set_state(checkpoint.metadata["rng"])
            except (TypeError, ValueError, KeyError) as error:
                raise ValueError(f"its random-number state does not parse ({error})") from None
        model.load_state_dict(checkpoint.model_state, strict=strict)
        if optimizer is not None:
            optimizer.load_state_dict(checkpoint.optimizer_state)
        if scheduler is not None:
            scheduler.load_state_dict(checkpoint.scheduler_state)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"cannot load checkpoint {checkpoint.path!r}: {error}") from None
    if restore_rng:
        _random.set_rng_state(checkpoint.metadata["rng"])
    return checkpoint


def _check_optimizer(checkpoint: Checkpoint, optimizer: Any) -> None:
    """A ``ValueError`` unless the checkpoint's optimizer state has the form of ``optimizer``'s own."""
    if checkpoint.optimizer_state is None:
        raise ValueError("it holds no optimizer state")
    saved_class = checkpoint.metadata["optimizer"]["class"]
    if saved_class != type(optimizer).__name__:
        raise ValueError(f"it holds {saved_class} state, not {type(optimizer).__name__}")
    own = optimizer.state_dict()["param_groups"]
    saved = checkpoint.optimizer_state["param_groups"]
    if len(saved) != len(own):
        raise ValueError(f"it holds {len(saved)} parameter groups, the optimizer has {len(own)}")
    parameters: dict[int, Any] = {}
    for index, (theirs, ours, group) in enumerate(zip(saved, own, optimizer.param_groups)):
        _check_same_form({k: v for k, v in theirs.items() if k != "params"},
                         {k: v for k, v in ours.items() if k != "params"}, f"optimizer parameter group {index}",
                         extra_keys=True)
        if len(theirs["params"]) != len(ours["params"]):
            raise ValueError(f"optimizer parameter group {index} has {len(theirs['params'])} parameters, the "
                             f"optimizer's has {len(ours['params'])}")
        parameters.update(zip(theirs["params"], group["params"]))
    for index, values in checkpoint.optimizer_state["state"].items():
        if index not in parameters:
            raise ValueError(f"its optimizer state refers to parameter {index}, which no group holds")
        for name, value in values.items():
            shape = tuple(parameters[index].shape)
            if isinstance(value, np.ndarray) and value.ndim and value.shape != shape:
                raise ValueError(f"optimizer state {index}/{name} of shape {value.shape} does not match its "
                                 f"parameter {shape}")


def _check_same_form(saved: Any, own: Any, where: str, extra_keys: bool = False) -> None:
    """A ``ValueError`` unless ``saved`` has the keys, lengths and kinds of value (number, string,
    list, dict, None) of ``own``: a state that a class's ``load_state_dict`` would take without a
    word and fail on many steps later. Keys are compared as JSON keeps them (strings); with
    ``extra_keys`` the saved dict may hold keys ``own`` lacks (a group's ``initial_lr``, which a
    scheduler adds)."""
    def kind(value: Any) -> str:
        if isinstance(value, bool):
            return "bool"
        if isinstance(value, numbers.Real):
            return "number"
        return "list" if isinstance(value, (list, tuple)) else type(value).__name__

    if kind(saved) != kind(own):
        raise ValueError(f"{where} is a {kind(saved)} where a {kind(own)} belongs")
    if isinstance(own, dict):
        theirs = {str(key): value for key, value in saved.items()}
        ours = {str(key): value for key, value in own.items()}
        if not set(ours) <= set(theirs) or (not extra_keys and set(theirs) != set(ours)):
            raise ValueError(f"{where} has the entries {sorted(theirs)}, not {sorted(ours)}")
        for key, value in ours.items():
            _check_same_form(theirs[key], value, f"{where}[{key!r}]")
    elif isinstance(own, (list, tuple)):
        if len(saved) != len(own):
            raise ValueError(f"{where} has {len(saved)} entries, not {len(own)}")
        for index, (theirs, ours) in enumerate(zip(saved, own)):
            _check_same_form(theirs, ours, f"{where}[{index}]")
