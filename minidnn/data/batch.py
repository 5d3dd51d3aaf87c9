"""What a batch is on its way through the loader: samples collated into arrays, and the nested structure
(tuples, lists, dicts) of a batch taken apart into one flat list of arrays and put back together.

The loader moves a batch as that flat list: through shared memory from a worker process, into page-locked
host buffers, onto the GPU. The structure travels beside it, small and picklable, so every stage handles
one list of arrays whatever the dataset returns.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..tensor import Tensor

# How a leaf of the structure is rebuilt: an array (wrapped in a Tensor at the end, as default_collate
# does), a Tensor a collate_fn returned (wrapped again), or an array a collate_fn returned (left an array).
ARRAY, TENSOR, RAW = "array", "tensor", "raw"


def collate_arrays(samples: list[Any]) -> Any:
    """Stack a list of samples (tuples, lists or dicts of arrays, numbers, Tensors) into the same structure
    of batched NumPy arrays (lists become tuples); float64 from anything but an array becomes float32 (as
    minidnn.tensor makes Python floats), Python ints int64."""
    first = samples[0]
    if isinstance(first, (tuple, list)):
        return tuple(collate_arrays([s[i] for s in samples]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: collate_arrays([s[key] for s in samples]) for key in first}
    if isinstance(first, Tensor):
        return np.stack([s.numpy() for s in samples])
    array = np.stack([np.asarray(s) for s in samples])
    if array.dtype == np.float64 and not isinstance(first, np.ndarray):
        array = array.astype(np.float32)
    return array


def default_collate(samples: list[Any]) -> Any:
    """Stack a list of (input, target) samples into a tuple of batched Tensors."""
    return wrap(collate_arrays(samples))


def wrap(structure: Any) -> Any:
    """Every array of a collated structure as a Tensor (default_collate's result)."""
    if isinstance(structure, tuple):
        return tuple(wrap(item) for item in structure)
    if isinstance(structure, dict):
        return {key: wrap(item) for key, item in structure.items()}
    return Tensor(structure)


def flatten(batch: Any, collated: bool) -> tuple[list[Any], Any]:
    """(arrays, tree): the batch's arrays in a fixed order and a picklable description of the rest.

    ``collated``: the batch came from :func:`collate_arrays` (its arrays become Tensors at the end);
    otherwise it is what a ``collate_fn`` returned: its Tensors stay Tensors, its arrays stay arrays,
    anything else (strings, numbers) travels inside the tree unchanged."""
    arrays: list[Any] = []

    def visit(item: Any) -> Any:
        if isinstance(item, (tuple, list)):
            return (type(item).__name__, [visit(v) for v in item])
        if isinstance(item, dict):
            return ("dict", {key: visit(v) for key, v in item.items()})
        if isinstance(item, Tensor) or isinstance(item, np.ndarray):
            arrays.append(item.data if isinstance(item, Tensor) else item)
            kind = TENSOR if isinstance(item, Tensor) else (ARRAY if collated else RAW)
            return ("leaf", (len(arrays) - 1, kind))
        return ("value", item)

    return arrays, visit(batch)


def fetch(dataset: Any, indices: Any, collate_fn: Callable[[list[Any]], Any] | None,
          into: list[np.ndarray] | None = None) -> tuple[list[Any], Any]:
    """One batch, flattened (:func:`flatten`): one ``get_batch`` gather when the dataset can and no
    ``collate_fn`` is given (ArrayDataset: no Python per sample), else its samples collated.

    indices: ints (a list or an int array). into: arrays the gather may write the batch into (a pinned slot's
    rows), each used where it has the shape and dtype of that array of the batch (``get_batch``'s ``into``)."""
    batch = None
    if collate_fn is None:
        getter = getattr(dataset, "get_batch", None)
        if getter is not None:
            batch = getter(indices) if into is None else getter(indices, into=into)
    if batch is None:
        samples = [dataset[int(i)] for i in indices]
        batch = collate_arrays(samples) if collate_fn is None else collate_fn(samples)
    return flatten(batch, collated=collate_fn is None)


def unflatten(arrays: list[Any], tree: Any, make_tensor: Callable[[Any], Any] = Tensor) -> Any:
    """The batch :func:`flatten` took apart, with ``arrays`` (moved, copied) in place of its arrays."""
    kind, content = tree
    if kind == "leaf":
        index, leaf = content
        return arrays[index] if leaf == RAW else make_tensor(arrays[index])
    if kind == "value":
        return content
    if kind == "dict":
        return {key: unflatten(arrays, item, make_tensor) for key, item in content.items()}
    items = [unflatten(arrays, item, make_tensor) for item in content]
    return items if kind == "list" else tuple(items)
