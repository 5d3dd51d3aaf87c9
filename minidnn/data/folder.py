"""ImageFolder: images sorted into one sub-directory per class, torchvision's layout::

    root/ant/0001.jpg
    root/ant/more/0002.png      (files in nested directories belong to their top-level class)
    root/bee/a.jpeg

Class names are the sub-directory names, sorted, and class ``i`` is the ``i``-th of them; or, with
``classes=`` (another split's ``classes``), exactly those names in that order, so that a validation
split missing a class (or holding an extra one) cannot shift the indices the model learned: a
directory not in ``classes`` is a ``ValueError`` naming it, a class without a directory a warning
naming it (its index stays reserved). Files are matched on their (case-insensitive) extension;
hidden files and directories (a leading dot: macOS ``._x.jpg`` resource forks,
``.ipynb_checkpoints``) are ignored, since they are never images of the class. Images are decoded
by Pillow and converted to RGB, HWC uint8, before ``transform``.

Corrupt images: by default the listing opens no file, and a file Pillow cannot decode is an
:class:`UnreadableImageError` (a ``ValueError``) naming it when its sample is read. With
``skip_corrupt=True`` the constructor decodes every image once (in a thread pool) and drops those
that fail, with a warning naming each. Skipping is decided once, at construction, so ``len`` and
the index of every sample stay fixed afterwards: the loader's shuffled order and each sample's
augmentation generator (seeded from its index) are the same in every run over the same files,
which substituting another sample at read time, or dropping it from a batch, would not give. A
file that breaks after construction still raises.
"""
from __future__ import annotations

import operator
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from .dataset import TransformedDataset

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")


def _decode(path: str) -> np.ndarray:
    with Image.open(path) as picture:
        return np.array(picture.convert("RGB"))  # np.array: a writable copy, owned by the caller


def _problem(path: str) -> str | None:
    """Why Pillow cannot decode ``path`` to RGB (the exception's type and message), or None."""
    try:
        _decode(path)
    except MemoryError:
        raise
    except Exception as error:  # Pillow's plugins raise OSError, SyntaxError, ValueError, struct.error...
        return f"{type(error).__name__}: {error}"
    return None


class UnreadableImageError(ValueError):
    """An image file that Pillow cannot decode; ``path`` names it. A type of its own so that a
    training script can tell a bad file (save, report, maybe skip) from a bug (a traceback)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read image {path!r}: {reason}")
        self.path = path


def read_image(path: str) -> np.ndarray:
    """The image at ``path`` as RGB, HWC uint8; an unreadable file is an :class:`UnreadableImageError`."""
    try:
        return _decode(path)
    except MemoryError:
        raise
    except Exception as error:  # see _problem
        raise UnreadableImageError(path, f"{type(error).__name__}: {error}") from None


def _extensions(extensions: Any) -> tuple[str, ...]:
    if isinstance(extensions, str):
        extensions = (extensions,)
    try:
        values = tuple(extensions)
    except TypeError:
        values = None
    if not values or not all(isinstance(v, str) and v.startswith(".") and len(v) > 1 for v in values):
        raise ValueError(f"extensions must be a non-empty sequence of suffixes with their dot, like ('.jpg', '.png'), "
                         f"got {extensions!r}")
    return tuple(v.lower() for v in values)


def _class_names(classes: Any) -> tuple[str, ...]:
    names = (classes,) if isinstance(classes, str) else tuple(classes)
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"classes must be a non-empty sequence of distinct directory names, got {classes!r}")
    return names


class ImageFolder(TransformedDataset):
    """``ImageFolder(root, transform=None, target_transform=None, seed=0, skip_corrupt=False, extensions=...,
    classes=None)``.

    Attributes as torchvision's: ``classes`` (sorted sub-directory names, or the given ``classes``), ``class_to_idx``,
    ``samples`` (a list of ``(path, class_index)``, classes in order, files sorted within each) and
    ``targets``; also ``skipped``, the ``(path, reason)`` of every file ``skip_corrupt`` dropped.
    ``dataset[i]`` is ``(transform(image, rng), target_transform(class_index))`` with ``image`` an
    RGB HWC uint8 array.
    """

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, seed: int = 0, skip_corrupt: bool = False,
                 extensions: Sequence[str] = IMG_EXTENSIONS, classes: Sequence[str] | None = None) -> None:
        super().__init__(transform, target_transform, seed)
        try:
            root = os.fspath(root)
        except TypeError:
            raise TypeError(f"root must be a path (str or os.PathLike), got {type(root).__name__} {root!r}") from None
        if not os.path.exists(root):
            raise FileNotFoundError(f"ImageFolder root {root!r} does not exist")
        if not os.path.isdir(root):
            raise NotADirectoryError(f"ImageFolder root {root!r} is not a directory")
        self.root = root
        self.extensions = _extensions(extensions)
        with os.scandir(root) as entries:
            found = tuple(sorted(e.name for e in entries if e.is_dir() and not e.name.startswith(".")))
        if not found:
            raise FileNotFoundError(f"ImageFolder root {root!r} has no class sub-directories "
                                    f"(expected root/<class name>/<image files>)")
        self.classes = found if classes is None else _class_names(classes)
        unknown = [name for name in found if name not in self.classes]
        if unknown:  # a sample of it would get no index, or another class's
            raise ValueError(f"ImageFolder root {root!r} has class directories that are not among the given "
                             f"classes: {', '.join(unknown)} (the classes are: {', '.join(self.classes)})")
        missing = [name for name in self.classes if name not in found]
        if missing:
            warnings.warn(f"ImageFolder root {root!r} has no directory for the classes: {', '.join(missing)} "
                          f"(their indices stay reserved)", stacklevel=2)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        samples = [(path, index) for index, name in enumerate(self.classes) if name in found
                   for path in self._list_images(os.path.join(root, name))]
        if not samples:
            raise FileNotFoundError(f"ImageFolder found no images with extensions {', '.join(self.extensions)} "
                                    f"in the class directories of {root!r}")
        self.skipped: list[tuple[str, str]] = []
        if skip_corrupt:
            # Decode everything now, in threads (Pillow releases the GIL while decoding); map keeps
            # the order, so the warnings and the surviving indices do not depend on the scheduling.
            with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
                reasons = list(pool.map(_problem, [path for path, _ in samples]))
            for (path, _), reason in zip(samples, reasons):
                if reason is not None:
                    self.skipped.append((path, reason))
                    warnings.warn(f"ImageFolder skips {path!r}, which cannot be read: {reason}", stacklevel=2)
            samples = [sample for sample, reason in zip(samples, reasons) if reason is None]
            if not samples:
                raise ValueError(f"none of the {len(self.skipped)} images under {root!r} can be read; "
                                 f"the first, {self.skipped[0][0]!r}: {self.skipped[0][1]}")
        empty = sorted(set(found) - {self.classes[index] for _, index in samples})
        if empty:  # kept, so the class indices still follow the directory names
            warnings.warn(f"ImageFolder classes without {'readable ' if skip_corrupt else ''}images in {root!r}: "
                          f"{', '.join(empty)}", stacklevel=2)
        self.samples: list[tuple[str, int]] = samples
        self.targets: list[int] = [index for _, index in samples]

    def _list_images(self, directory: str) -> list[str]:
        """The image files under ``directory`` (recursively), in a fixed order."""
        paths = []
        for current, directories, files in os.walk(directory, followlinks=True):
            directories[:] = sorted(d for d in directories if not d.startswith("."))  # walk in sorted order
            paths.extend(os.path.join(current, name) for name in sorted(files)
                         if not name.startswith(".") and name.lower().endswith(self.extensions))
        return paths

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        index = operator.index(index)  # numpy ints are fine, floats are not
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)} samples")
        index %= len(self)
        path, target = self.samples[index]
        return self.apply_transforms(index, read_image(path), target)

    def __repr__(self) -> str:
        return f"ImageFolder(root={self.root!r}, {len(self)} images, {len(self.classes)} classes)"
