"""``minidnn.save(obj, f)`` and ``minidnn.load(f)``: PyTorch's call shapes for state dicts and other
nested values, in an ``.npz`` file that is never unpickled.

Every array and Tensor is a member of its own (``arrays/0``, ``arrays/1``...); the nesting (dicts,
lists, tuples, numbers, strings, bools, None) is one JSON document in the member ``metadata``, which
names each array's member, dtype and shape (bfloat16, which NumPy's format cannot name, is stored as its
uint16 words under the dtype ``"bfloat16"``). A path is written atomically (a temporary beside it,
then a rename); a file object is written where it stands, as ``torch.save`` does. Reading checks
every part, so a damaged or foreign file is a ``ValueError`` naming it, never a traceback from deep
inside NumPy, and never code run by a pickle.
"""
from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from typing import Any, BinaryIO

import numpy as np

from . import backend
from . import checkpoint
from .checkpoint import atomic_write, read_archive
from .primitives import convert
from .tensor import Tensor, as_dtype

FORMAT = "minidnn-save"
VERSION = 1

# JSON has no NaN or infinities: a non-finite float is a tagged string.
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def save(obj: Any, f: str | os.PathLike | BinaryIO) -> None:
    """Write ``obj`` to ``f``, a path or a binary file object opened for writing.

    ``obj`` is a Tensor, a NumPy array or number, a Python number, string, bool or None, or a dict
    (keys: strings, numbers, bools or None), list or tuple of those, nested to any depth, such as
    ``model.state_dict()`` or ``optimizer.state_dict()``. Tensors on a GPU are stored from host
    copies. Anything else (a module, a function, an object array) is a ``TypeError`` naming where in
    ``obj`` it is: storing it would need pickle.
    """
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(obj, arrays, "obj", set())
    text = json.dumps({"format": FORMAT, "version": VERSION, "object": tree}, allow_nan=False)
    arrays["metadata"] = np.array(text)  # beside the "arrays/N" members _array_node named

    def write(file: BinaryIO) -> None:
        np.savez(file, **arrays)

    if isinstance(f, (str, os.PathLike)):
        atomic_write(f, write)
    elif hasattr(f, "write"):
        write(f)
    else:
        raise TypeError(f"f must be a path or a binary file object opened for writing, got {type(f).__name__}")


def load(f: str | os.PathLike | BinaryIO, map_location: Any = None) -> Any:
    """What :func:`save` wrote to ``f`` (a path or a binary file object opened for reading).

    Tensors come back as Tensors (with their ``requires_grad``), on the CPU, or on
    ``map_location`` (a device such as ``"cuda"``; torch's argument of that name, limited to a
    device); arrays as NumPy arrays; dicts, lists and tuples as they were. A file that is not one
    written by :func:`save`, or is damaged, is a ``ValueError`` naming it; a missing path a
    ``FileNotFoundError``.
    """
    label = _label(f)
    target = backend.device(map_location) if map_location is not None else None
    if isinstance(f, (str, os.PathLike)) and not os.path.exists(f):
        raise FileNotFoundError(f"{label} does not exist")
    return _from_archive(label, *read_archive(f, label), target)


def _from_archive(label: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any], target: Any) -> Any:
    """The object of an archive :func:`save` wrote, checked (``label`` names the file)."""
    if metadata.get("format") != FORMAT:
        found = metadata.get("format")
        hint = " (a train.py checkpoint: read it with minidnn.read_checkpoint)" if found == "minidnn-checkpoint" else ""
        raise ValueError(f"{label} was not written by minidnn.save (its format is {found!r}){hint}")
    if metadata.get("version") != VERSION:
        raise ValueError(f"{label} is a version {metadata.get('version')!r} minidnn.save file; "
                         f"this minidnn reads version {VERSION}")
    if "object" not in metadata:
        raise ValueError(f"{label} is damaged: its metadata holds no object")
    decoder = _Decoder(label, arrays, target)
    value = decoder.decode(metadata["object"], "obj")
    unused = sorted(set(arrays) - decoder.used)
    if unused:
        raise ValueError(f"{label} is damaged: members {', '.join(unused)} belong to nothing in its metadata")
    return value


def load_weights(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model weights in ``path`` and what the file says about them: a checkpoint's model state and
    extras (see :mod:`minidnn.checkpoint`), or a state dict :func:`save` wrote (names to Tensors or
    arrays) and no extras. The file is read once; anything else is a ``ValueError`` naming it."""
    label = _label(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{label} does not exist")
    arrays, metadata = read_archive(path, label)
    if metadata.get("format") == checkpoint.FORMAT:
        found = checkpoint.checkpoint_from(os.fspath(path), arrays, metadata)
        return found.model_state, found.extra
    state = _from_archive(label, arrays, metadata, None)
    if not isinstance(state, dict) or not state or not all(
            isinstance(key, str) and isinstance(value, (Tensor, np.ndarray)) for key, value in state.items()):
        raise ValueError(f"{label} holds a {type(state).__name__}, not a state dict (a dict of names to Tensors, as "
                         f"minidnn.save(model.state_dict(), path) writes)")
    return state, {}


def _label(f: Any) -> str:
    """How an error names ``f``: the path, or a file object's name."""
    if isinstance(f, (str, os.PathLike)):
        return repr(os.fspath(f))
    name = getattr(f, "name", None)
    return repr(name) if isinstance(name, (str, bytes)) else f"the file object {type(f).__name__}"


# ----------------------------------------------------------------------------------------------
# Writing: the tree as JSON, arrays set aside
# ----------------------------------------------------------------------------------------------
def _array_node(kind: str, array: Any, arrays: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    host = convert.to_device(array, "cpu") if kind == "tensor" else backend.to_device(array, "cpu")
    dtype = host.dtype.str
    if host.dtype.name == "bfloat16":  # ml_dtypes' (imported once a bfloat16 array exists)
        host, dtype = host.view(np.uint16), "bfloat16"  # its words; the node names the type
    elif host.dtype.hasobject or host.dtype.kind == "V":
        raise TypeError(f"minidnn.save cannot store {where}: an array of dtype {host.dtype} needs pickle")
    name = f"arrays/{len(arrays)}"
    arrays[name] = host
    return {kind: name, "dtype": dtype, "shape": list(host.shape)}


def _encode(value: Any, arrays: dict[str, np.ndarray], where: str, open_containers: set[int]) -> Any:
    if isinstance(value, Tensor):
        node = _array_node("tensor", value.data, arrays, where)
        node["requires_grad"] = bool(value.requires_grad)
        return node
    if isinstance(value, np.ndarray) or backend.is_cuda_array(value):
        return _array_node("array", value, arrays, where)
    if isinstance(value, np.generic):
        return _array_node("scalar", np.asarray(value), arrays, where)
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (dict, list, tuple)):
        if id(value) in open_containers:
            raise ValueError(f"minidnn.save cannot store {where}: it contains itself")
        open_containers.add(id(value))
        try:
            if isinstance(value, dict):
                items = []
                for key, item in value.items():
                    if not (key is None or isinstance(key, (str, int, float, bool))):
                        raise TypeError(f"minidnn.save cannot store {where}: a dict key of type {type(key).__name__} "
                                        f"(keys must be strings, numbers, bools or None)")
                    items.append([_encode(key, arrays, where, open_containers),
                                  _encode(item, arrays, f"{where}[{key!r}]", open_containers)])
                node: dict[str, Any] = {"dict": items}
                if isinstance(value, OrderedDict):
                    node["ordered"] = True
                return node
            kind = "list" if isinstance(value, list) else "tuple"
            return {kind: [_encode(item, arrays, f"{where}[{index}]", open_containers)
                           for index, item in enumerate(value)]}
        finally:
            open_containers.discard(id(value))
    raise TypeError(f"minidnn.save cannot store {where}, a {type(value).__name__}: it stores Tensors, arrays, "
                    f"numbers, strings, bools, None and dicts, lists and tuples of them (nothing that needs pickle)")


# ----------------------------------------------------------------------------------------------
# Reading: every node checked against what save writes
# ----------------------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, label: str, arrays: dict[str, np.ndarray], device: Any) -> None:
        self.label, self.arrays, self.device = label, arrays, device
        self.used: set[str] = set()

    def damaged(self, where: str, what: str) -> ValueError:
        return ValueError(f"{self.label} is damaged: {where} {what}")

    def decode(self, node: Any, where: str) -> Any:
        if node is None or isinstance(node, (bool, str, int, float)):
            return node
        if isinstance(node, list) or not isinstance(node, dict) or not node:
            raise self.damaged(where, f"is {type(node).__name__} {str(node)[:40]}, not a value minidnn.save writes")
        kind = next(iter(node))
        if kind in ("tensor", "array", "scalar"):
            return self.array(kind, node, where)
        if kind == "float" and set(node) == {"float"} and node["float"] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[node["float"]]
        if kind in ("list", "tuple") and set(node) == {kind} and isinstance(node[kind], list):
            items = [self.decode(item, f"{where}[{index}]") for index, item in enumerate(node[kind])]
            return items if kind == "list" else tuple(items)
        if kind == "dict" and set(node) <= {"dict", "ordered"} and isinstance(node["dict"], list):
            result: dict[Any, Any] = OrderedDict() if node.get("ordered") else {}
            for pair in node["dict"]:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise self.damaged(where, "has a dict entry that is not a (key, value) pair")
                key = self.decode(pair[0], where)
                if not (key is None or isinstance(key, (str, int, float, bool))):
                    raise self.damaged(where, f"has a dict key of type {type(key).__name__}")
                result[key] = self.decode(pair[1], f"{where}[{key!r}]")
            return result
        raise self.damaged(where, f"is the unknown entry {str(node)[:60]}")

    def array(self, kind: str, node: dict[str, Any], where: str) -> Any:
        keys = {kind, "dtype", "shape"} | ({"requires_grad"} if kind == "tensor" else set())
        name = node.get(kind)
        if set(node) != keys or not isinstance(name, str):
            raise self.damaged(where, f"has a malformed {kind} entry {str(node)[:80]}")
        if name not in self.arrays:
            raise self.damaged(where, f"refers to the member {name}, which the file lacks")
        if name in self.used:
            raise self.damaged(where, f"refers to the member {name} a second time")
        self.used.add(name)
        array = self.arrays[name]
        words = node["dtype"] == "bfloat16"
        if (array.dtype.str != ("<u2" if words else node["dtype"])) or list(array.shape) != node["shape"]:
            raise self.damaged(where, f"should be {node['dtype']} of shape {tuple(node['shape'])}, but its member "
                                      f"{name} holds {array.dtype.str} of shape {array.shape}")
        if words:
            array = array.view(convert.bfloat16())
        if kind == "scalar":
            return array[()]
        if kind == "array":
            return array
        requires_grad = node["requires_grad"]
        try:
            as_dtype(array.dtype)
        except TypeError as error:
            raise self.damaged(where, f"cannot be a Tensor ({error})") from None
        if not isinstance(requires_grad, bool) or (requires_grad and array.dtype.kind != "f" and not words):
            raise self.damaged(where, f"has requires_grad={requires_grad!r} on a {array.dtype} tensor")
        data = array if self.device is None else convert.to_device(array, self.device)
        return Tensor(data, requires_grad=requires_grad)


__all__ = ["save", "load"]
