"""CIFAR-10 and CIFAR-100 from their *binary* distributions, which users already have.

Nothing is downloaded: ``root`` is the extracted directory or its parent.

=============  ==========================  ==============================================  =============
dataset        directory                   files                                           record
=============  ==========================  ==============================================  =============
CIFAR-10       ``cifar-10-batches-bin``    ``data_batch_1.bin`` .. ``data_batch_5.bin``,   1 + 3072 bytes
                                           ``test_batch.bin``, ``batches.meta.txt``
CIFAR-100      ``cifar-100-binary``        ``train.bin``, ``test.bin``,                    2 + 3072 bytes
                                           ``coarse_label_names.txt``,
                                           ``fine_label_names.txt``
=============  ==========================  ==============================================  =============

A record is the label byte(s) (CIFAR-100: coarse, then fine) and the 32x32 image as three planes,
red, then green, then blue, each row-major. The files are parsed with one ``np.frombuffer`` and a
reshape each; images come out HWC uint8 (N, 32, 32, 3), labels int64.

The Python versions (``cifar-10-batches-py``, ``cifar-100-python``) are pickles, and unpickling a
file can run any code its author chose, so they are refused, never opened: a directory holding only
them is a ``ValueError`` that says to use the binary version.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from .dataset import ArrayDataset

IMAGE_BYTES = 3 * 32 * 32
CIFAR_PAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

# Label order of the distribution (alphabetical); used when the names file was not kept.
CIFAR100_FINE_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
    "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
    "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
    "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger",
    "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)
CIFAR100_COARSE_CLASSES = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes", "large_omnivores_and_herbivores",
    "medium_mammals", "non-insect_invertebrates", "people", "reptiles", "small_mammals", "trees",
    "vehicles_1", "vehicles_2",
)


def _root(root: Any, dataset: str) -> str:
    try:
        root = os.fspath(root)
    except TypeError:
        raise TypeError(f"root must be a path (str or os.PathLike), got {type(root).__name__} {root!r}") from None
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{dataset} root {root!r} is not an existing directory")
    return root


def _check_train(train: Any) -> bool:
    if not isinstance(train, bool):  # train="test" would silently load the training set
        raise TypeError(f"train must be a bool, got {type(train).__name__} {train!r}")
    return train


def _find_directory(root: str, dataset: str, binary_dir: str, names: Sequence[str], python_dir: str,
                    pickle_names: Sequence[str], archive: str) -> str:
    """The directory (``root`` or ``root/binary_dir``) holding all of ``names``.

    When neither holds any of them but the Python version is there, refuse it without opening it.
    """
    candidates = [root, os.path.join(root, binary_dir)]
    for directory in candidates:
        present = [name for name in names if os.path.isfile(os.path.join(directory, name))]
        if len(present) == len(names):
            return directory
        if present:
            missing = [name for name in names if name not in present]
            raise FileNotFoundError(f"{dataset} directory {directory!r} lacks {', '.join(missing)}")
    for directory in (root, os.path.join(root, python_dir)):
        pickles = [name for name in pickle_names if os.path.isfile(os.path.join(directory, name))]
        if pickles:
            raise ValueError(
                f"{os.path.join(directory, pickles[0])!r} looks like the Python (pickle) version of {dataset}, "
                f"which minidnn refuses to read: unpickling a file can run arbitrary code. Use the binary "
                f"version ({archive}, which extracts to {binary_dir}/) from {CIFAR_PAGE}")
    if os.path.isfile(os.path.join(root, archive)):
        raise FileNotFoundError(f"{dataset}: {os.path.join(root, archive)!r} is not extracted; run "
                                f"'tar -xzf {archive}' in {root!r} first")
    raise FileNotFoundError(f"{dataset}: no {', '.join(names)} in {root!r} or {candidates[1]!r} "
                            f"(the binary version, {archive}, extracted)")


def _read_records(path: str, label_bytes: int, dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 32, 32, 3) uint8 and labels (N, label_bytes) int64 of one binary CIFAR file."""
    record = label_bytes + IMAGE_BYTES
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise ValueError(f"cannot read {dataset} file {path!r}: {error}") from None
    if len(data) == 0 or len(data) % record:
        raise ValueError(f"{dataset} file {path!r} is {len(data)} bytes, not a whole number of {record}-byte "
                         f"records ({label_bytes} label byte{'s' if label_bytes > 1 else ''} + {IMAGE_BYTES} "
                         f"pixel bytes): it is truncated or not a {dataset} binary file")
    records = np.frombuffer(data, np.uint8).reshape(-1, record)
    labels = records[:, :label_bytes].astype(np.int64)
    # Each record holds the R plane, then G, then B: (N, C, H, W) -> HWC.
    images = np.ascontiguousarray(records[:, label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return images, labels


def _check_labels(labels: np.ndarray, count: int, path: str, what: str) -> None:
    if labels.max() >= count:
        raise ValueError(f"{path!r} holds {what} {int(labels.max())}, but there are only {count} classes "
                         f"(labels 0-{count - 1}): is it the right file?")


def _read_names(path: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """Class names, one a line, from ``path``; ``default`` when the file was not kept."""
    if not os.path.isfile(path):
        return default
    try:
        with open(path, encoding="utf-8") as file:
            names = tuple(line.strip() for line in file if line.strip())
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read class names from {path!r}: {error}") from None
    if len(names) != len(default):
        raise ValueError(f"{path!r} names {len(names)} classes, expected {len(default)} (one name a line)")
    return names


class CIFAR10(ArrayDataset):
    """``CIFAR10(root, train=True, transform=None, target_transform=None, seed=0)``: the binary CIFAR-10.

    ``root`` is ``cifar-10-batches-bin`` or its parent. ``images`` is (N, 32, 32, 3) uint8 (50000
    for train, 10000 for test), ``labels`` (N,) int64; ``classes`` comes from ``batches.meta.txt``.
    """

    def __init__(self, root: str | os.PathLike, train: bool = True, transform: Callable | None = None,
                 target_transform: Callable | None = None, seed: int = 0) -> None:
        root = _root(root, "CIFAR-10")
        train = _check_train(train)
        names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
        directory = _find_directory(root, "CIFAR-10", "cifar-10-batches-bin", names, "cifar-10-batches-py",
                                    ("data_batch_1", "test_batch"), "cifar-10-binary.tar.gz")
        images, labels = [], []
        for name in names:
            path = os.path.join(directory, name)
            batch_images, batch_labels = _read_records(path, 1, "CIFAR-10")
            _check_labels(batch_labels, 10, path, "label")
            images.append(batch_images)
            labels.append(batch_labels[:, 0])
        classes = _read_names(os.path.join(directory, "batches.meta.txt"), CIFAR10_CLASSES)
        super().__init__(np.concatenate(images), np.concatenate(labels), transform, target_transform, seed,
                         classes=classes)
        self.root, self.train = directory, train
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}


class CIFAR100(ArrayDataset):
    """``CIFAR100(root, train=True, transform=None, target_transform=None, seed=0, label="fine")``.

    ``root`` is ``cifar-100-binary`` or its parent. ``label`` picks the 100 fine classes or the 20
    coarse super-classes for ``labels`` and ``classes``; both label arrays are kept as
    ``fine_labels`` and ``coarse_labels``.
    """

    def __init__(self, root: str | os.PathLike, train: bool = True, transform: Callable | None = None,
                 target_transform: Callable | None = None, seed: int = 0, label: str = "fine") -> None:
        if label not in ("fine", "coarse"):
            raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
        root = _root(root, "CIFAR-100")
        train = _check_train(train)
        name = "train.bin" if train else "test.bin"
        directory = _find_directory(root, "CIFAR-100", "cifar-100-binary", [name], "cifar-100-python",
                                    ("train", "test"), "cifar-100-binary.tar.gz")
        path = os.path.join(directory, name)
        images, labels = _read_records(path, 2, "CIFAR-100")
        _check_labels(labels[:, 0], 20, path, "coarse label")
        _check_labels(labels[:, 1], 100, path, "fine label")
        self.coarse_labels, self.fine_labels = labels[:, 0].copy(), labels[:, 1].copy()
        default = CIFAR100_FINE_CLASSES if label == "fine" else CIFAR100_COARSE_CLASSES
        classes = _read_names(os.path.join(directory, f"{label}_label_names.txt"), default)
        super().__init__(images, self.fine_labels if label == "fine" else self.coarse_labels, transform,
                         target_transform, seed, classes=classes)
        self.root, self.train, self.label = directory, train, label
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
