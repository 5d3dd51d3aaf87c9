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
by Pillow and converted to RGB, HWC uint8, before ``transform`` (:func:`to_rgb` gives the rule for
every mode and bit depth).

The walk reads only what belongs to the class: every real directory is visited once (a symbolic
link back to a directory already seen, a loop, is not followed again), a link to a directory
outside the class folder is not followed (its images would take this class's label) and is named
in a warning, and an entry with an image's name that is not a regular file (a named pipe, a
socket, a device, a link to nothing) is skipped with a warning: reading a pipe blocks until
someone writes to it, which may be never. Links to image files are followed wherever they point
(a split made of links into one pool of images is a common layout).

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
import stat
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from .dataset import TransformedDataset

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")


# Modes whose samples are integers of more than 8 bits. Pillow reads 16-bit grey PNGs and TIFFs as
# I;16 (or I;16B, ...) and 16-bit PGM/PPM grey images as I; its convert("RGB") clips those to 255,
# which turns a 16-bit image white wherever it is brighter than 255/65535 of the full scale.
WIDE_INTEGER_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N")


def to_rgb(picture: Image.Image) -> np.ndarray:
    """``picture`` as RGB, HWC uint8, a writable array of its own. The rule, per Pillow mode:

    * 8-bit modes (``1``, ``L``, ``P``, ``RGB``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``, and with alpha
      ``LA``, ``PA``, ``RGBA``): Pillow's own ``convert("RGB")``, which converts the colour space
      (CMYK, YCbCr, LAB, HSV), expands grey and palettes, and drops alpha without compositing
      (torchvision's loader does the same).
    * Integer samples of more than 8 bits (``I;16`` and its byte orders, and ``I``, which Pillow
      uses for 16-bit PGM and 32-bit TIFF images): taken as 16-bit values (``I`` clipped to 0..65535,
      as Pillow's own ``convert("I;16")``), reduced to their high byte, the way Pillow itself reads
      16-bit RGB and RGBA PNGs, and repeated into three channels. A 16-bit grey image and the same
      image stored as 16-bit RGB therefore decode to the same pixels.
    * ``F`` (32-bit float samples): Pillow's ``convert("RGB")``, which reads them on the 0..255 scale
      of ``L`` (the scale ``convert("F")`` of an 8-bit image gives) and clips; a float image stored
      in [0, 1] reads as nearly black: convert such files to 8 or 16 bits first.

    The transforms (``ToTensor`` scales uint8 by 1/255, ``Resize`` goes through Pillow) take uint8
    only, so no mode keeps more than 8 bits here.
    """
    if picture.mode in WIDE_INTEGER_MODES:
        samples = np.asarray(picture).astype(np.int64)  # I;16B arrives big-endian; int64 holds every I value
        high_byte = (np.clip(samples, 0, 65535) >> 8).astype(np.uint8)
        return np.repeat(high_byte[:, :, None], 3, axis=2)
    return np.array(picture.convert("RGB"))  # np.array: a writable copy, owned by the caller


def _decode(path: str) -> np.ndarray:
    with Image.open(path) as picture:
        return to_rgb(picture)


def _problem(path: str) -> str | None:
    """Why Pillow cannot decode ``path`` to RGB (the exception's type and message), or None."""
    try:
        _decode(path)
    except MemoryError:
        raise
    except Exception as error:  # Pillow's plugins raise OSError, SyntaxError, ValueError, struct.error...
        return f"{type(error).__name__}: {error}"
    return None


def _identity(path: str) -> tuple[int, int]:
    """(device, inode) of what ``path`` leads to: one real directory, however many links reach it."""
    status = os.stat(path)
    return status.st_dev, status.st_ino


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _kind(path: str) -> str:
    """What a non-regular file is, in words."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a link to nothing"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "neither a file nor a directory"


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
        """The image files under the class folder ``directory`` (recursively), in a fixed order: a
        directory's files sorted, then its sub-directories in sorted order, depth first (the order
        of ``os.walk``). Each real directory is read once, and only those inside ``directory``."""
        inside = os.path.realpath(directory)
        seen = {_identity(directory)}
        paths: list[str] = []
        pending = [directory]
        while pending:
            current = pending.pop()
            try:
                with os.scandir(current) as listing:
                    entries = sorted(listing, key=lambda entry: entry.name)
            except OSError as error:  # os.walk would skip it without a word
                warnings.warn(f"ImageFolder skips the directory {current!r}, which cannot be read: "
                              f"{error.strerror or error}", stacklevel=3)
                continue
            directories = []
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():  # follows links
                    if entry.is_symlink() and not _within(os.path.realpath(entry.path), inside):
                        warnings.warn(f"ImageFolder does not follow {entry.path!r}, a link to "
                                      f"{os.path.realpath(entry.path)!r} outside the class folder {directory!r}",
                                      stacklevel=3)
                        continue
                    identity = _identity(entry.path)
                    if identity not in seen:  # a loop, or a second link to a directory: read once
                        seen.add(identity)
                        directories.append(entry.path)
                elif entry.name.lower().endswith(self.extensions):
                    if entry.is_file():  # a regular file, or a link to one
                        paths.append(entry.path)
                    else:
                        warnings.warn(f"ImageFolder skips {entry.path!r}, which is {_kind(entry.path)}, not a "
                                      f"regular file: reading it could block forever", stacklevel=3)
            pending.extend(reversed(directories))  # popped in sorted order
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
