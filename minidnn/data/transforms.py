"""Image transforms, torchvision's names: spatial ones on HWC arrays (or Pillow images), then
``ToTensor`` to CHW float32 in [0, 1], then ``Normalize``.

Every transform is called as ``transform(image, rng)``; random ones draw only from ``rng`` (one
generator per sample, see :mod:`minidnn.data.dataset`), deterministic ones ignore it.

:class:`CropFlipNormalize` is the one batch transform: the usual CIFAR augmentation and the
normalisation for a whole uint8 batch at once (a DataLoader's ``batch_transform``), on the batch's
device, with the same draws and the same results as its per-sample counterparts.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from PIL import Image

from .. import backend
from ..primitives.augment import crop_flip_normalize


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


def channel_statistics(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean and the (population) standard deviation of each channel of uint8 images (..., C), in pixel units,
    as float64 (C,) arrays: the constants :class:`Normalize` takes, once divided by 255.

    Each channel's 256-bin histogram holds all there is to know: the mean and the squared deviations are sums of
    256 terms, exact but for their last rounding, where NumPy's mean and std widen every pixel to float64 first.
    """
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim < 2:
        raise TypeError(f"channel_statistics takes a uint8 array of images (..., C), got "
                        f"{getattr(images, 'dtype', type(images).__name__)} of shape {getattr(images, 'shape', None)}")
    flat = images.reshape(-1, images.shape[-1])
    if flat.shape[0] == 0:
        raise ValueError("channel_statistics needs at least one pixel")
    counts = np.stack([np.bincount(flat[:, c], minlength=256) for c in range(flat.shape[1])]).astype(np.float64)
    values = np.arange(256, dtype=np.float64)
    mean = counts @ values / flat.shape[0]
    variance = (counts * (values - mean[:, None]) ** 2).sum(axis=1) / flat.shape[0]
    return mean, np.sqrt(variance)


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


class CropFlipNormalize:
    """``CropFlipNormalize(mean, std, crop=None, padding=0, fill=0, flip=None)``: random crop with padding,
    horizontal flip, ToTensor and Normalize for a whole uint8 (N, H, W, C) batch, into float32 (N, C, h, w).

    Image for image and bit for bit it gives what the per-sample pipeline ``Compose([RandomCrop(crop,
    padding, fill), RandomHorizontalFlip(flip), ToTensor(), Normalize(mean, std)])`` gives (without the
    crop when ``crop`` is None, without the flip when ``flip`` is None): its random choices come from each
    sample's own generator, in the same order, through the dataset's :meth:`batch_draws`, and the
    arithmetic is rounded as ToTensor and Normalize round it. The work is one call of
    :func:`minidnn.primitives.augment.crop_flip_normalize`: one kernel when the batch is on the GPU
    (``DataLoader(..., device="cuda", batch_transform=...)`` copies uint8 pixels, a quarter of the
    float32 batch's bytes, and augments on the device), its NumPy twin otherwise.

    A DataLoader calls :meth:`parameters` on the host for each batch (the draws), then the transform
    itself on the batch's first element (the images) with them.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], crop: Any = None, padding: int = 0,
                 fill: int = 0, flip: float | None = None) -> None:
        self.normalize = Normalize(mean, std)  # its checks, and its float32 constants
        self.crop = None if crop is None else _size_pair(crop, "crop")
        if not isinstance(padding, int) or isinstance(padding, bool) or padding < 0:
            raise ValueError(f"padding must be an int >= 0, got {padding!r}")
        if padding and self.crop is None:
            raise ValueError("padding needs crop: the padded image is cut back to the crop size")
        if not isinstance(fill, int) or isinstance(fill, bool) or not 0 <= fill <= 255:
            raise ValueError(f"fill must be an int in [0, 255] (a uint8 pixel value), got {fill!r}")
        if flip is not None and not (isinstance(flip, (int, float)) and 0.0 <= flip <= 1.0):
            raise ValueError(f"flip must be None or a probability in [0, 1], got {flip!r}")
        self.padding, self.fill, self.flip = padding, fill, flip
        self.mean = self.normalize.mean.reshape(-1)
        self.std = self.normalize.std.reshape(-1)
        self._device_constants: dict[int, tuple[Any, Any]] = {}  # mean and std on each GPU, made once

    def per_sample(self) -> "Compose":
        """The per-sample pipeline this batch transform gives image for image (see the class docstring):
        what a single image of this data goes through, e.g. for a checkpoint to describe the model's input."""
        steps: list[Any] = []
        if self.crop is not None:
            steps.append(RandomCrop(self.crop, padding=self.padding, fill=self.fill))
        if self.flip is not None:
            steps.append(RandomHorizontalFlip(self.flip))
        return Compose([*steps, ToTensor(), Normalize(self.mean, self.std)])

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) of the images made from (height, width) ones."""
        size = self.crop or (height, width)
        if size[0] > height + 2 * self.padding or size[1] > width + 2 * self.padding:
            raise ValueError(f"RandomCrop of size {size} is larger than the (padded) image "
                             f"{(height + 2 * self.padding, width + 2 * self.padding)}")
        return size

    def parameters(self, dataset: Any, indices: Any, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(top, left, flip) for the batch of ``dataset``'s samples at ``indices``, images of ``shape``
        (N, H, W, C): int32, int32, uint8 arrays of N, drawn as RandomCrop then RandomHorizontalFlip draw."""
        count, height, width = len(indices), shape[1], shape[2]
        size = self.output_size(height, width)
        calls: list[tuple] = []
        if self.crop is not None:
            calls += [("integers", height + 2 * self.padding - size[0] + 1),
                      ("integers", width + 2 * self.padding - size[1] + 1)]
        if self.flip is not None:
            calls.append(("random",))
        zeros = np.zeros(count, np.int32)
        if not calls:
            return zeros, zeros.copy(), np.zeros(count, np.uint8)
        if not hasattr(dataset, "batch_draws"):
            raise TypeError(f"CropFlipNormalize draws from each sample's own generator, which "
                            f"{type(dataset).__name__} does not have (a TransformedDataset, such as ArrayDataset, does)")
        draws = dataset.batch_draws(indices, calls)
        top, left = (draws[0].astype(np.int32), draws[1].astype(np.int32)) if self.crop is not None else \
            (zeros, zeros.copy())
        flips = (draws[-1] < self.flip).astype(np.uint8) if self.flip is not None else np.zeros(count, np.uint8)
        return top, left, flips

    def __call__(self, images: Any, top: Any, left: Any, flip: Any, out: Any = None) -> Any:
        """The float32 (N, C, h, w) batch from uint8 ``images`` (N, H, W, C) and :meth:`parameters`' arrays,
        all on one device; ``out``: an array to write it into (returned)."""
        mean, std = self.mean, self.std
        if backend.is_cuda_array(images):
            device = int(images.device.id)
            if device not in self._device_constants:
                cupy = backend.cupy()
                with cupy.cuda.Device(device):
                    self._device_constants[device] = (cupy.asarray(mean), cupy.asarray(std))
            mean, std = self._device_constants[device]
        size = self.output_size(images.shape[1], images.shape[2])
        return crop_flip_normalize(images, top, left, flip, size, mean, std, padding=self.padding, fill=self.fill,
                                   out=out)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_device_constants": {}}  # GPU arrays stay in their process

    def __repr__(self) -> str:
        parts = [f"mean={self.mean.tolist()}", f"std={self.std.tolist()}"]
        if self.crop is not None:
            parts.append(f"crop={self.crop}, padding={self.padding}")
        if self.flip is not None:
            parts.append(f"flip={self.flip}")
        return f"CropFlipNormalize({', '.join(parts)})"
