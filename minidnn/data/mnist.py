"""MNIST and Fashion-MNIST from the IDX files users already have, and a general IDX reader.

Nothing is downloaded: ``root`` is a directory holding the four files of the distribution, gzipped
or not, either directly or in torchvision's layout (``root/MNIST/raw/``, ``root/FashionMNIST/raw/``):

=============================  ==================================
file                           contents
=============================  ==================================
``train-images-idx3-ubyte``    (60000, 28, 28) uint8 images
``train-labels-idx1-ubyte``    (60000,) uint8 labels 0-9
``t10k-images-idx3-ubyte``     (10000, 28, 28) uint8 images
``t10k-labels-idx1-ubyte``     (10000,) uint8 labels 0-9
=============================  ==================================

each possibly with a ``.gz`` suffix (also accepted: ``train-images.idx3-ubyte``, as some mirrors
spell it). The IDX format: the magic ``00 00 TT DD`` (``TT`` the element type, ``DD`` the number
of dimensions), ``DD`` big-endian uint32 sizes, then the elements in C order, big-endian. A file
starting with the gzip magic is decompressed whatever its name, since the IDX magic starts with a
zero byte and cannot be mistaken for it.

Images stay (N, 28, 28) uint8, HW per sample: the transforms treat an HW array as HWC with one
channel, so ``ToTensor`` gives (1, 28, 28).
"""
from __future__ import annotations

import gzip
import math
import os
import zlib
from typing import Any, Callable

import numpy as np

from .dataset import ArrayDataset

# Element types of the IDX format; multi-byte ones are big-endian in the file.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

MNIST_CLASSES = ("0 - zero", "1 - one", "2 - two", "3 - three", "4 - four",
                 "5 - five", "6 - six", "7 - seven", "8 - eight", "9 - nine")
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def _fspath(value: Any, name: str) -> str:
    try:
        return os.fspath(value)
    except TypeError:
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__} {value!r}") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array stored in the IDX file ``path`` (gzipped or not), in native byte order.

    The payload length is checked against the sizes in the header: a bad magic, an unknown type
    code, a truncated file or trailing bytes are a ``ValueError`` naming the file.
    """
    path = _fspath(path, "path")
    if not os.path.exists(path):
        raise FileNotFoundError(f"IDX file {path!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"IDX file {path!r} is not a regular file")
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise ValueError(f"cannot read IDX file {path!r}: {error}") from None
    source = repr(path)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:  # BadGzipFile is an OSError; a cut stream is EOFError
            raise ValueError(f"{path!r} is a damaged or truncated gzip file "
                             f"({type(error).__name__}: {error})") from None
        source = f"{path!r} (after gunzip)"
    return parse_idx(data, source)


def parse_idx(data: bytes, source: str = "IDX data") -> np.ndarray:
    """Parse the bytes of an (uncompressed) IDX file; ``source`` names it in error messages."""
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] not in IDX_DTYPES:
        codes = " ".join(f"{code:02x}" for code in IDX_DTYPES)
        raise ValueError(f"{source} is not an IDX file: its magic is {data[:4].hex(' ') or 'empty'}, expected "
                         f"00 00, a type code among {codes}, then the number of dimensions")
    dtype, ndim = IDX_DTYPES[data[2]], data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{source} is truncated: its header declares {ndim} dimensions ({header} header bytes) "
                         f"but the file has only {len(data)} bytes")
    shape = tuple(int(size) for size in np.frombuffer(data, ">u4", count=ndim, offset=4))
    count = math.prod(shape)  # Python ints: no overflow for absurd headers
    expected, actual = count * dtype.itemsize, len(data) - header
    if actual != expected:
        problem = "truncated" if actual < expected else "longer than its header says"
        raise ValueError(f"{source} is {problem}: the header declares shape {shape} of {dtype.name} "
                         f"({expected} data bytes) but {actual} data bytes follow the header")
    array = np.frombuffer(data, dtype, count=count, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))  # a writable copy in native byte order


def _find_split(root: str, prefix: str, folder: str, dataset: str) -> tuple[str, str]:
    """Paths of the images and labels files of split ``prefix`` ('train' or 't10k') under ``root``."""
    directories = [root, os.path.join(root, "raw"), os.path.join(root, folder), os.path.join(root, folder, "raw")]
    kinds = {"images": "idx3", "labels": "idx1"}
    for directory in directories:
        found: dict[str, str] = {}
        for kind, idx in kinds.items():
            # The uncompressed file first: torchvision's raw/ holds both, and it reads faster.
            for name in (f"{prefix}-{kind}-{idx}-ubyte", f"{prefix}-{kind}.{idx}-ubyte"):
                for suffix in ("", ".gz"):
                    candidate = os.path.join(directory, name + suffix)
                    if kind not in found and os.path.isfile(candidate):
                        found[kind] = candidate
        if len(found) == 2:
            return found["images"], found["labels"]
        if found:
            (kind, present), = found.items()
            missing = "labels" if kind == "images" else "images"
            raise FileNotFoundError(f"{dataset}: found {present!r} but no {missing} file "
                                    f"'{prefix}-{missing}-{kinds[missing]}-ubyte[.gz]' beside it in {directory!r}")
    searched = ", ".join(repr(d) for d in directories)
    raise FileNotFoundError(f"{dataset}: no '{prefix}-images-idx3-ubyte[.gz]' and '{prefix}-labels-idx1-ubyte[.gz]' "
                            f"files in any of {searched}")


class MNIST(ArrayDataset):
    """``MNIST(root, train=True, transform=None, target_transform=None, seed=0)`` from IDX files under ``root``.

    ``images`` is (N, 28, 28) uint8, ``labels`` (N,) int64; ``dataset[i]`` is
    ``(transform(image, rng), target_transform(label))`` with the image an HW uint8 array.
    """

    CLASSES: tuple[str, ...] = MNIST_CLASSES
    FOLDER = "MNIST"  # torchvision's sub-directory: root/MNIST/raw/

    def __init__(self, root: str | os.PathLike, train: bool = True, transform: Callable | None = None,
                 target_transform: Callable | None = None, seed: int = 0) -> None:
        dataset = type(self).__name__
        root = _fspath(root, "root")
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{dataset} root {root!r} is not an existing directory")
        if not isinstance(train, bool):
            raise TypeError(f"train must be a bool, got {type(train).__name__} {train!r}")
        images_path, labels_path = _find_split(root, "train" if train else "t10k", self.FOLDER, dataset)
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.dtype != np.uint8 or images.ndim != 3:
            raise ValueError(f"{images_path!r} must hold (N, height, width) uint8 images, "
                             f"got shape {images.shape} of {images.dtype}")
        if labels.dtype != np.uint8 or labels.ndim != 1:
            raise ValueError(f"{labels_path!r} must hold (N,) uint8 labels, got shape {labels.shape} of {labels.dtype}")
        if len(images) != len(labels):
            raise ValueError(f"{dataset}: {images_path!r} holds {len(images)} images but {labels_path!r} "
                             f"holds {len(labels)} labels")
        if len(labels) and labels.max() >= len(self.CLASSES):
            raise ValueError(f"{labels_path!r} holds label {int(labels.max())}; {dataset} labels are "
                             f"0-{len(self.CLASSES) - 1}")
        super().__init__(images, labels.astype(np.int64), transform, target_transform, seed, classes=self.CLASSES)
        self.root, self.train = root, train
        self.images_path, self.labels_path = images_path, labels_path
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}


class FashionMNIST(MNIST):
    """Fashion-MNIST: the same files and layout as :class:`MNIST` (torchvision's ``root/FashionMNIST/raw/``)."""

    CLASSES = FASHION_MNIST_CLASSES
    FOLDER = "FashionMNIST"
