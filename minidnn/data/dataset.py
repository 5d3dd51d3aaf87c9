"""Datasets: indexable collections of (input, target) samples, PyTorch's ``Dataset`` protocol.

Random augmentation must be reproducible, also when worker processes decode samples and when a
run resumes mid-way. So a dataset never draws from a shared generator: sample ``i`` of epoch
``e`` gets its own generator seeded from ``(seed, e, i)``, and the loader tells the dataset the
epoch with :meth:`Dataset.set_epoch` (each iteration of a loader is the next epoch). A batch
transform that augments on the GPU draws from the same generators, for a whole batch at once
(:meth:`TransformedDataset.batch_draws`), so it picks what the per-sample transforms would.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import sample_random
from ..tensor import Tensor


class Dataset:
    """Subclasses define ``__len__`` and ``__getitem__(index) -> (input, target)``."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError


class TransformedDataset(Dataset):
    """Base for datasets whose samples go through ``transform(image, rng)`` and ``target_transform``.

    ``transform`` is a callable taking the raw sample and a NumPy generator (see
    :mod:`minidnn.data.transforms`); the generator is seeded from (seed, epoch, index).
    """

    def __init__(self, transform: Callable | None = None, target_transform: Callable | None = None,
                 seed: int = 0) -> None:
        self.transform = transform
        self.target_transform = target_transform
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def sample_rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng((self.seed, self.epoch, int(index)))

    def batch_draws(self, indices: Any, calls: Sequence[tuple]) -> list[np.ndarray]:
        """What ``sample_rng(i)`` gives for i in ``indices`` when ``calls`` are made on it in order
        (``("integers", high)``, ``("random",)``): one (N,) array per call, for the whole batch at once
        (:mod:`minidnn.data.sample_random`)."""
        return sample_random.draw(self.seed, self.epoch, indices, calls)

    def apply_transforms(self, index: int, image: Any, target: Any) -> tuple[Any, Any]:
        if self.transform is not None:
            image = self.transform(image, self.sample_rng(index))
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


def _receives(array: Any, shape: tuple, dtype: Any) -> bool:
    """Whether ``array`` (offered by the loader, or None) can receive a result of ``shape`` and ``dtype`` as is."""
    return isinstance(array, np.ndarray) and array.shape == shape and array.dtype == dtype \
        and array.flags.c_contiguous and array.flags.writeable


class ArrayDataset(TransformedDataset):
    """Samples held in memory: ``images[i]`` and ``labels[i]`` (e.g. the built-in shapes data, CIFAR, MNIST)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable | None = None,
                 target_transform: Callable | None = None, seed: int = 0, classes: tuple[str, ...] = ()) -> None:
        super().__init__(transform, target_transform, seed)
        if len(images) != len(labels):
            raise ValueError(f"images and labels must have the same length, got {len(images)} and {len(labels)}")
        self.images, self.labels, self.classes = images, labels, tuple(classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)} samples")
        return self.apply_transforms(index % len(self), self.images[index], int(self.labels[index]))

    def get_batch(self, indices: Any, into: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray] | None:
        """The samples at ``indices`` already collated, ``(images[indices], labels as int64)``, when no
        transform is set (one gather, no Python per sample: the loader's fast path); else None.

        into: arrays the loader offers for the result (a pinned slot's rows): ``into[0]`` receives the images if
        it is a (len(indices), *image shape) array of the images' dtype, ``into[1]`` the labels if it is int64
        (len(indices),); each one used is returned in place of a new array."""
        if self.transform is not None or self.target_transform is not None:
            return None
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < -len(self) or indices.max() >= len(self)):
            raise IndexError(f"an index of {indices.tolist()} is out of range for a dataset of {len(self)} samples")
        images, labels = (*into, None, None)[:2]
        source = self.images
        if isinstance(source, np.ndarray) and _receives(images, (len(indices), *source.shape[1:]), source.dtype):
            # Checked above, so "wrap" takes the same rows as "raise", which would gather into a temporary first.
            np.take(source, indices, axis=0, out=images, mode="wrap")
        else:
            images = np.take(source, indices, axis=0)
        if _receives(labels, (len(indices),), np.int64):
            labels[...] = np.take(self.labels, indices)
        else:
            labels = np.take(self.labels, indices).astype(np.int64)
        return images, labels


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices`` (a validation split, a quick subset)."""

    def __init__(self, dataset: Dataset, indices: Any) -> None:
        self.dataset, self.indices = dataset, np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(self.indices[index])]

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def get_batch(self, indices: Any, into: Sequence[np.ndarray] = ()) -> Any:
        """The underlying dataset's collated samples (see :meth:`ArrayDataset.get_batch`), or None."""
        getter = getattr(self.dataset, "get_batch", None)
        return None if getter is None else getter(self.indices[np.asarray(indices, dtype=np.int64)], into=into)

    def batch_draws(self, indices: Any, calls: Sequence[tuple]) -> list[np.ndarray]:
        """The underlying dataset's per-sample draws (its samples' generators are the ones used)."""
        if not hasattr(self.dataset, "batch_draws"):
            raise TypeError(f"{type(self.dataset).__name__} has no per-sample generators (batch_draws)")
        return self.dataset.batch_draws(self.indices[np.asarray(indices, dtype=np.int64)], calls)


class TensorDataset(Dataset):
    """PyTorch's ``TensorDataset``: sample i is ``(tensors[0][i], tensors[1][i], ...)``, the tensors
    indexed together along their first dimension, which they must share."""

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        for position, tensor in enumerate(tensors):
            if not isinstance(tensor, Tensor):
                raise TypeError(f"TensorDataset: argument {position} must be a minidnn Tensor, got "
                                f"{type(tensor).__name__}")
            if tensor.ndim == 0:
                raise ValueError(f"TensorDataset: argument {position} is 0-d; every tensor needs a first dimension")
        sizes = [tensor.shape[0] for tensor in tensors]
        if len(set(sizes)) != 1:
            raise ValueError(f"TensorDataset: size mismatch between tensors: first dimensions {sizes}")
        self.tensors = tensors

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def __getitem__(self, index: Any) -> tuple[Tensor, ...]:
        return tuple(tensor[index] for tensor in self.tensors)
