"""Image-batch augmentation in one pass: random crop with padding, horizontal flip, and the conversion of
uint8 (N, H, W, C) pixels into a normalised float (N, C, h, w) batch, as torchvision's RandomCrop(padding)
+ RandomHorizontalFlip + ToTensor + Normalize do image by image.

The input is uint8 NHWC because that is what the data already is: in-memory datasets (CIFAR, shapes10,
MNIST) store it, Pillow decodes to it, and copying it to the GPU moves a quarter of the bytes of the
float32 batch it becomes. Layout change, scaling and normalisation then cost one read and one write
on the device instead of four float passes on the host.

The random choices are inputs, one per image: ``top[n]`` and ``left[n]``, the corner of the h x w window
in the padded image, and ``flip[n]``. The caller draws them (minidnn.data draws them on the host from each
sample's own generator), so the GPU kernel (augment.cu) and the NumPy twin below compute the same
images from the same draws: bitwise in float32, where the kernel rounds every step as NumPy does.

For n, c, i, j (0 <= i < h, 0 <= j < w)::

    padded[n, r, s, c] = images[n, r - p, s - p, c] inside the image, else fill      (p = padding)
    x                  = padded[n, top[n] + i, left[n] + (w - 1 - j if flip[n] else j), c]
    out[n, c, i, j]    = (x * scale - mean[c]) / std[c]        (each operation rounded to out's dtype)

with ``scale`` = 1/255 by default (ToTensor's). Offsets must lie in [0, H + 2p - h] and [0, W + 2p - w]:
on the CPU one outside is a ``ValueError``; on the GPU (checking would need a host synchronisation) the
image's output is NaN, so a step trained on it has a NaN loss instead of reading outside the image.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from .. import backend
from . import _cuda
from ._checks import check_contiguous, check_float, check_int, check_out, check_real, pair

__all__ = ["crop_flip_normalize"]

# The C struct AugmentShape of augment.cu: eight ints, in this order.
_AUGMENT_SHAPE = np.dtype([(name, np.int32) for name in ("N", "H", "W", "C", "h", "w", "padding", "fill")])


def crop_flip_normalize(images: Any, top: Any, left: Any, flip: Any, size: Any, mean: Any, std: Any,
                        padding: int = 0, fill: int = 0, scale: float = 1.0 / 255, out: Any = None,
                        dtype: Any = np.float32) -> Any:
    """The augmented, normalised batch (N, C, h, w); see the module docstring for the formula.

    images: uint8 (N, H, W, C), C-contiguous. top, left: int32 (N,), the window's corner in the image
    padded by ``padding`` on each side; flip: bool or uint8 (N,), nonzero mirrors the window left to
    right. size: h or (h, w), at most the padded image. mean, std: (C,) arrays of the output dtype on
    the images' device. fill: the padding's pixel value (0..255). scale: the factor applied to pixel
    values before normalising. out: None (a new array of ``dtype``, float32 or float64) or a C-contiguous
    (N, C, h, w) float array written and returned (a captured step's static input, say).
    """
    key = _ready_key(images, top, left, flip, size, mean, std, padding, fill, scale, out, dtype)
    ready = _ready.get(key)
    if ready is not None:
        return ready(images, top, left, flip, mean, std)[0]
    height, width = _check_arguments(images, top, left, flip, size, mean, std, padding, fill, scale)
    count, _, _, channels = images.shape
    dtype = np.dtype(out.dtype if out is not None else dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"the output dtype must be float32 or float64, got {dtype}")
    if mean.dtype != dtype or std.dtype != dtype:
        raise TypeError(f"mean and std must be {dtype} arrays (the output's dtype), got {mean.dtype} and {std.dtype}")
    like = SimpleNamespace(shape=(count, channels, height, width), dtype=dtype)  # the output, for check_out
    if out is not None:
        check_out(out, like, "the augmented batch (N, C, h, w)")
    backend.get_array_module(images, top, left, flip, mean, std, out)  # one device, or a clear ValueError
    if backend.is_cuda_array(images):
        with _cuda.recording() as steps:
            result = _crop_flip_normalize_gpu(images, top, left, flip, (height, width), mean, std, padding, fill,
                                              scale, dtype, out)
        _ready.keep(key, steps, (images, top, left, flip, mean, std), (result,), (result,))
        return result
    _check_offsets(images.shape, (height, width), padding, top, left)
    if np.any(std <= 0):
        raise ValueError(f"std must be > 0 in every channel, got {std.tolist()}")
    p = padding
    padded = np.pad(images, ((0, 0), (p, p), (p, p), (0, 0)), constant_values=fill) if p else images
    pixels = np.empty(like.shape, np.uint8)
    for n in range(count):  # a view per image, then one small copy: faster than one fancy-indexed gather
        window = padded[n, top[n]:top[n] + height, left[n]:left[n] + width]
        pixels[n] = (window[:, ::-1] if flip[n] else window).transpose(2, 0, 1)
    result = np.empty(like.shape, dtype) if out is None else out
    result[...] = pixels  # uint8 -> float: exact
    np.multiply(result, dtype.type(scale), out=result)
    np.subtract(result, mean.reshape(1, channels, 1, 1), out=result)
    np.divide(result, std.reshape(1, channels, 1, 1), out=result)
    return result


# A repeated call on the GPU (its arrays' steady keys and its other arguments) -> its launch (_cuda.ReadyCall): a
# loader augments every batch of a pass alike. Only calls that make their output, with plain int and float
# arguments, are kept.
_ready = _cuda.ReadyCalls()


def _ready_key(images: Any, top: Any, left: Any, flip: Any, size: Any, mean: Any, std: Any, padding: Any, fill: Any,
               scale: Any, out: Any, dtype: Any) -> tuple | None:
    """The call's key in ``_ready``, or None for one that takes the checked path every time."""
    sizes = size if type(size) is tuple else (size,)
    if out is not None or not all(type(v) is int for v in (*sizes, padding, fill)) or type(scale) is not float \
            or not backend.is_cuda_array(images):
        return None
    steady = _cuda.steady_key("crop_flip_normalize", images, top, left, flip, mean, std)
    if steady is None or dtype not in (np.float32, np.float64):
        return None
    return steady, sizes, padding, fill, scale, np.dtype(dtype)


def _check_arguments(images: Any, top: Any, left: Any, flip: Any, size: Any, mean: Any, std: Any, padding: Any,
                     fill: Any, scale: Any) -> tuple[int, int]:
    """The checks both devices make (the same messages); returns the window size (h, w)."""
    if getattr(images, "dtype", None) != np.uint8 or images.ndim != 4:
        got = f"{images.dtype} {tuple(images.shape)}" if hasattr(images, "dtype") else type(images).__name__
        raise TypeError(f"images must be a uint8 (N, H, W, C) array, got {got}")
    check_contiguous(images, "images")
    count, image_height, image_width, channels = images.shape
    for name, array, kinds in (("top", top, "int32"), ("left", left, "int32"), ("flip", flip, "bool or uint8")):
        dtype = getattr(array, "dtype", None)
        allowed = (np.dtype(np.int32),) if kinds == "int32" else (np.dtype(np.bool_), np.dtype(np.uint8))
        if dtype is None or dtype not in allowed or tuple(array.shape) != (count,):
            got = f"{dtype} {tuple(array.shape)}" if dtype is not None else type(array).__name__
            raise TypeError(f"{name} must be a {kinds} array of shape ({count},) (one per image), got {got}")
        check_contiguous(array, name)
    padding = check_int(padding, "padding", minimum=0)
    check_int(fill, "fill", minimum=0, maximum=255)
    check_real(scale, "scale")
    height, width = pair(size, "size", minimum=1)
    if height > image_height + 2 * padding or width > image_width + 2 * padding:
        raise ValueError(f"size {(height, width)} is larger than the padded image "
                         f"{(image_height + 2 * padding, image_width + 2 * padding)}")
    for name, array in (("mean", mean), ("std", std)):
        check_float(array, name)
        if tuple(array.shape) != (channels,):
            raise ValueError(f"{name} must have shape ({channels},), one value per channel, got {tuple(array.shape)}")
        check_contiguous(array, name)
    return height, width


def _check_offsets(shape: tuple[int, ...], size: tuple[int, int], padding: int, top: np.ndarray,
                   left: np.ndarray) -> None:
    """On the CPU: every window inside the padded image, or a ValueError naming the first that is not."""
    for name, values, limit in (("top", top, shape[1] + 2 * padding - size[0]),
                                ("left", left, shape[2] + 2 * padding - size[1])):
        bad = np.flatnonzero((values < 0) | (values > limit))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] = {int(values[bad[0]])} puts the window outside the padded image "
                             f"(expected 0 <= {name} <= {limit})")


def _crop_flip_normalize_gpu(images: Any, top: Any, left: Any, flip: Any, size: tuple[int, int], mean: Any,
                             std: Any, padding: int, fill: int, scale: float, dtype: np.dtype, out: Any) -> Any:
    """One launch of augment.cu's kernel, one thread per output element."""
    cupy = backend.cupy()
    count, image_height, image_width, channels = images.shape
    if out is None:
        out = cupy.empty((count, channels, *size), dtype=dtype)
    _cuda.check_int32(images, out)
    shape = np.array([tuple(_cuda.i32(v) for v in (count, image_height, image_width, channels, *size, padding,
                                                   fill))], dtype=_AUGMENT_SHAPE)[0]
    flags = flip.view(cupy.uint8) if flip.dtype == np.bool_ else flip
    kernel = _cuda.function("augment.cu", "crop_flip_normalize", dtype)
    _cuda.launch(kernel, out.size, (images, top, left, flags, mean, std, out, shape, _cuda.f64(scale)))
    return out
