"""Image transforms, torchvision's names: spatial ones on HWC arrays (or Pillow images), then
``ToTensor`` to CHW float32 in [0, 1], then ``Normalize``.

Every transform is called as ``transform(image, rng)``; random ones draw only from ``rng`` (one
generator per sample, see :mod:`minidnn.data.dataset`), deterministic ones ignore it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from PIL import Image


def _size_pair(size: Any, name: str) -> tuple[int, int]:
    values = (size, size) if isinstance(size, int) else tuple(size)
    if len(values) != 2 or not all(isinstance(v, int) and v > 0 for v in values):
        raise ValueError(f"{name} must be a positive int or a pair (height, width), got {size!r}")
    return values


def _hwc(image: Any) -> np.ndarray:
    """A Pillow image or an HW/HWC array as an HWC array."""
    array = np.asarray(image)
    return array[:, :, None] if array.ndim == 2 else array


class Compose:
    def __init__(self, transforms: Sequence[Any]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: Any, rng: np.random.Generator | None = None) -> Any:
        for transform in self.transforms:
            image = transform(image, rng)
        return image

    def __repr__(self) -> str:
        return "Compose(" + ", ".join(repr(t) for t in self.transforms) + ")"


class ToTensor:
    """HWC uint8 (or a Pillow image) -> CHW float32 in [0, 1] (the loader batches it into a Tensor)."""

    def __call__(self, image: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        array = _hwc(image)
        scale = 1.0 / 255 if array.dtype == np.uint8 else 1.0
        return np.ascontiguousarray(array.transpose(2, 0, 1), dtype=np.float32) * np.float32(scale)

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """(x − mean) / std per channel of a CHW float array."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)
        if self.mean.shape != self.std.shape or np.any(self.std <= 0):
            raise ValueError(f"mean and std must have one entry per channel and std > 0, got {mean!r}, {std!r}")

    def __call__(self, image: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        if image.ndim != 3 or image.shape[0] not in (1, self.mean.shape[0]):
            raise ValueError(f"Normalize expects a CHW array with {self.mean.shape[0]} channels (after ToTensor), "
                             f"got shape {image.shape}")
        return (image - self.mean) / self.std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.ravel().tolist()}, std={self.std.ravel().tolist()})"


class RandomCrop:
    """Pad by ``padding`` (with ``fill``), then cut a ``size`` window at a random position."""

    def __init__(self, size: Any, padding: int = 0, fill: int = 0) -> None:
        self.size = _size_pair(size, "size")
        if not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding must be an int >= 0, got {padding!r}")
        self.padding, self.fill = padding, fill

    def __call__(self, image: Any, rng: np.random.Generator) -> np.ndarray:
        array = _hwc(image)
        if self.padding:
            p = self.padding
            array = np.pad(array, ((p, p), (p, p), (0, 0)), constant_values=self.fill)
        height, width = self.size
        if array.shape[0] < height or array.shape[1] < width:
            raise ValueError(f"RandomCrop of size {self.size} is larger than the (padded) image {array.shape[:2]}")
        top = int(rng.integers(0, array.shape[0] - height + 1))
        left = int(rng.integers(0, array.shape[1] - width + 1))
        return array[top:top + height, left:left + width]

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding})"


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p = p

    def __call__(self, image: Any, rng: np.random.Generator) -> np.ndarray:
        array = _hwc(image)
        return array[:, ::-1] if rng.random() < self.p else array

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Resize:
    """An int resizes the shorter side to it (keeping the aspect ratio); a pair gives (height, width). Bilinear."""

    def __init__(self, size: Any) -> None:
        self.size = size if isinstance(size, int) and size > 0 else _size_pair(size, "size")

    def __call__(self, image: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        array = _hwc(image)
        height, width = array.shape[:2]
        if isinstance(self.size, int):
            if height <= width:
                target = (self.size, max(1, round(width * self.size / height)))
            else:
                target = (max(1, round(height * self.size / width)), self.size)
        else:
            target = self.size
        if target == (height, width):
            return array
        picture = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
        return _hwc(picture.resize((target[1], target[0]), Image.BILINEAR))

    def __repr__(self) -> str:
        return f"Resize({self.size})"


class CenterCrop:
    def __init__(self, size: Any) -> None:
        self.size = _size_pair(size, "size")

    def __call__(self, image: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        array = _hwc(image)
        height, width = self.size
        if array.shape[0] < height or array.shape[1] < width:
            raise ValueError(f"CenterCrop of size {self.size} is larger than the image {array.shape[:2]}")
        top, left = (array.shape[0] - height) // 2, (array.shape[1] - width) // 2
        return array[top:top + height, left:left + width]

    def __repr__(self) -> str:
        return f"CenterCrop({self.size})"
