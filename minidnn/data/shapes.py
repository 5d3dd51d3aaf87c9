"""shapes10: a built-in image-classification dataset that needs no download.

Ten classes of filled shapes, rendered with Pillow from a seed into 32x32 RGB images. It is small
enough to generate in seconds on a laptop CPU and hard enough that a linear classifier on the raw
pixels does clearly worse than a small CNN, so it is the dataset the examples and the training
script use.

Classes (each is drawn over the same range of sizes, colours and every other random factor):

=====  ==========  =========================================================================
label  name        shape (before the random size, aspect, rotation and position)
=====  ==========  =========================================================================
0      circle      a filled disc
1      square      a filled square (a rectangle after the aspect jitter)
2      triangle    a filled equilateral triangle
3      star        a five-pointed star, inner radius 38-50 % of the outer
4      cross       a plus sign, arms 20-30 % as wide as the cross is long
5      ring        an annulus, hole radius 45-65 % of the outer
6      crescent    a disc with an offset disc (radius 75-90 %) cut out of one side
7      arrow       a shaft with a triangular head, proportions jittered
8      heart       a heart
9      hourglass   two triangles meeting tip to tip at a narrow waist, proportions jittered
=====  ==========  =========================================================================

Random factors (each drawn independently of the class, so none of them gives the class away):

=====================  ========================================================================
factor                 range
=====================  ========================================================================
size                   circumscribed diameter 45-90 % of the image side (shrunk to fit where the
                       aspect jitter and rotation would push the shape out of the image)
aspect jitter          width / height 0.8-1.25 (log-uniform), applied before the rotation
rotation               uniform over the full turn
position               uniform over the positions that keep the whole shape inside the image
shape colour           uniform RGB, each channel 155-255 (the shape is always the lighter)
background colour      uniform RGB, each channel 0-100
lighting               a linear brightness gradient, random direction, 0-30 from centre to edge
outline                in half the images, a one-pixel rim in a third, uniform random colour
distractor             in half the images, a faint straight line (opacity 15-40 %) across the
                       image in a fourth, uniform random colour
pixel noise            per pixel and channel, triangular (the sum of two uniforms), standard
                       deviation 0-10 (drawn per image)
=====================  ========================================================================

Difficulty, as calibrated with 20 000 training and 4 000 test images: softmax regression on the
normalised pixels reaches 30-36 % test accuracy (at its best L2 strength), while a ~24k-parameter
CNN (three 3x3 conv + ReLU layers of 16, 32 and 64 channels, max-pooling after the first two,
global average pooling, a linear layer) trained with SGD + momentum at batch 64 passes 93 % within
three to four epochs.

Shapes are drawn as masks at twice the resolution and averaged down 2x2, so their edges are
antialiased; colours, lighting, outline, distractor and noise are then applied to whole batches
with NumPy.

Determinism: :func:`render_shapes` derives everything from ``np.random.default_rng(seed)``, so the
same ``(count, seed)`` gives bit-identical arrays on any machine with the same NumPy random
streams and Pillow rasteriser. Values computed with transcendental functions (sines, cosines) are
rounded to a fixed grid before use, so their last-bit differences between CPUs cannot change a pixel.

:func:`load_shapes` caches the rendered train and test splits in one ``.npz`` file per
``(train_size, test_size, seed, version)``; it is written atomically and re-rendered when it is
missing or unreadable.
"""
from __future__ import annotations

import numbers
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["CLASSES", "IMAGE_SIZE", "DATASET_VERSION", "render_shapes", "load_shapes", "default_root"]

CLASSES: tuple[str, ...] = (
    "circle", "square", "triangle", "star", "cross", "ring", "crescent", "arrow", "heart", "hourglass",
)
IMAGE_SIZE = 32
# Bump whenever a change to the rendering changes any pixel: it is part of the cache file name.
DATASET_VERSION = 1
SPLITS = ("train", "test")

_SUPERSAMPLE = 2                          # masks are drawn at 2x and averaged down, for antialiasing
_CELL = IMAGE_SIZE * _SUPERSAMPLE         # side of one image's mask at the drawing resolution
_CELLS_PER_ROW = 16                       # masks are drawn 16x16 to a canvas, saving per-image overhead
_MARGIN = 1.0                             # drawing-resolution pixels kept clear at each image border
_COLOUR_CHUNK = 1024                      # images coloured at a time (bounds the float32 temporaries)
_CIRCLE_VERTICES = 48
# Shapes are lighter than their background in every channel. Calibration showed why: with
# arbitrary colour pairs (either polarity, or equal brightness in some channel) a small CNN needs
# several times the training to learn colour-blind edges, and the dataset missed its purpose.
_LIGHT_RANGE = (155, 255)                 # shape colour, each channel, inclusive
_DARK_RANGE = (0, 100)                    # background colour, each channel, inclusive
# The random factors' ranges (see the table in the module docstring).
_SIZE_RANGE = (0.45, 0.90)                # circumscribed diameter, fraction of the image side
_ASPECT_RANGE = (0.8, 1.25)               # width / height before rotation, drawn log-uniformly
_OUTLINE_PROBABILITY = 0.5
_LIGHT_MAX = 30.0                         # brightness change from the centre to an edge
_LINE_PROBABILITY = 0.5
_LINE_OPACITY = (0.15, 0.40)
_NOISE_STD_MAX = 10.0
_TWO_BYTES_STD = float(np.sqrt(2.0 * (256.0 ** 2 - 1.0) / 12.0))   # std of the sum of two uniform bytes
# Grid that derived floats are rounded to; see "Determinism" in the module docstring.
_COORD_STEP = 1.0 / 64.0
_PARAM_STEP = 2.0 ** -16


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------
def _check_int(value: Any, name: str, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``; bools and non-integers are a TypeError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return int(value)


def _quantise(values: np.ndarray, step: float) -> np.ndarray:
    return np.round(values / step) * step


# ----------------------------------------------------------------------------------------------
# Shape outlines: each class is a list of contours, (n, vertices, 2) arrays in unit coordinates
# (centred, circumradius about 1), the first filled, any others cut out as holes.
# ----------------------------------------------------------------------------------------------
def _polar(radii: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Points at ``radii`` (n, V) or (V,) and ``angles`` (V,) as an (n, V, 2) array."""
    cos, sin = _quantise(np.cos(angles), _PARAM_STEP), _quantise(np.sin(angles), _PARAM_STEP)
    return np.stack(np.broadcast_arrays(radii * cos, radii * sin), axis=-1)


def _regular_polygon(count: int, sides: int, first_angle: float = -np.pi / 2.0) -> np.ndarray:
    angles = 2.0 * np.pi * np.arange(sides) / sides + first_angle
    return np.broadcast_to(_polar(np.ones(sides), angles), (count, sides, 2))


def _circle(count: int, radius: np.ndarray | float = 1.0, centre_x: np.ndarray | float = 0.0) -> np.ndarray:
    """(count, V, 2) circles of per-image ``radius`` centred at (``centre_x``, 0)."""
    unit = _regular_polygon(1, _CIRCLE_VERTICES)[0]
    radius = np.broadcast_to(np.asarray(radius, dtype=np.float64), (count,))[:, None, None]
    centre = np.stack([np.broadcast_to(np.asarray(centre_x, dtype=np.float64), (count,)), np.zeros(count)], axis=-1)
    return unit[None] * radius + centre[:, None, :]


def _star(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    inner = rng.uniform(0.38, 0.50, size=count)
    angles = np.pi * np.arange(10) / 5.0 - np.pi / 2.0
    radii = np.where(np.arange(10) % 2 == 0, 1.0, inner[:, None])
    return [_polar(radii, angles)]


def _cross(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    half_width = rng.uniform(0.20, 0.30, size=count)[:, None]
    one = np.ones_like(half_width)
    xs = np.concatenate([half_width, half_width, one, one, half_width, half_width,
                         -half_width, -half_width, -one, -one, -half_width, -half_width], axis=1)
    ys = np.concatenate([one, half_width, half_width, -half_width, -half_width, -one,
                         -one, -half_width, -half_width, half_width, half_width, one], axis=1)
    return [np.stack([xs, ys], axis=-1)]


def _ring(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [_circle(count), _circle(count, rng.uniform(0.45, 0.65, size=count))]


def _crescent(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    hole_radius = rng.uniform(0.75, 0.90, size=count)
    # The hole's centre is far enough out that it always opens the disc on one side.
    offset = rng.uniform(0.35, 0.50, size=count)
    return [_circle(count), _circle(count, hole_radius, offset)]


def _arrow(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    shaft = rng.uniform(0.14, 0.22, size=count)[:, None]
    head = rng.uniform(0.50, 0.65, size=count)[:, None]
    neck = rng.uniform(0.05, 0.25, size=count)[:, None]
    tail, tip = -np.ones_like(shaft), np.ones_like(shaft)
    xs = np.concatenate([tail, neck, neck, tip, neck, neck, tail], axis=1)
    ys = np.concatenate([-shaft, -shaft, -head, 0.0 * shaft, head, shaft, shaft], axis=1)
    return [np.stack([xs, ys], axis=-1)]


def _hourglass(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    # Two triangles meeting tip to tip at a narrow waist.
    end = rng.uniform(0.55, 0.75, size=count)[:, None]
    waist = rng.uniform(0.08, 0.16, size=count)[:, None]
    one, zero = np.ones_like(end), np.zeros_like(end)
    xs = np.concatenate([-one, zero, one, one, zero, -one], axis=1)
    ys = np.concatenate([-end, -waist, -end, end, waist, end], axis=1)
    return [np.stack([xs, ys], axis=-1)]


def _heart(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    # The classic parametric heart, centred on its bounding box and scaled to circumradius ~1.
    t = 2.0 * np.pi * np.arange(40) / 40.0
    xs = 16.0 * np.sin(t) ** 3
    ys = -(13.0 * np.cos(t) - 5.0 * np.cos(2 * t) - 2.0 * np.cos(3 * t) - np.cos(4 * t))
    ys = ys - (ys.max() + ys.min()) / 2.0
    points = _quantise(np.stack([xs, ys], axis=-1) / 17.0, _PARAM_STEP)
    return [np.broadcast_to(points, (count, 40, 2))]


_CONTOURS: dict[str, Callable[[int, np.random.Generator], list[np.ndarray]]] = {
    "circle": lambda count, rng: [_circle(count)],
    # Sides along the axes, so that the aspect jitter makes rectangles rather than rhombi.
    "square": lambda count, rng: [_regular_polygon(count, 4, np.pi / 4.0)],
    "triangle": lambda count, rng: [_regular_polygon(count, 3)],
    "star": _star,
    "cross": _cross,
    "ring": _ring,
    "crescent": _crescent,
    "arrow": _arrow,
    "heart": _heart,
    "hourglass": _hourglass,
}
assert tuple(_CONTOURS) == CLASSES


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------
def _balanced_labels(count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` int64 labels, each class ``count // 10`` or one more times, in random order."""
    return rng.permutation(np.arange(count, dtype=np.int64) % len(CLASSES))


def _place_contours(labels: np.ndarray, rng: np.random.Generator) -> list[list[tuple[list[float], int]]]:
    """Per image, its contours as flat ``[x0, y0, x1, ...]`` lists in its own cell of the canvas, with fill."""
    count = labels.shape[0]
    size = rng.uniform(*_SIZE_RANGE, size=count)
    aspect = _quantise(np.exp(rng.uniform(*np.log(_ASPECT_RANGE), size=count)), _PARAM_STEP)
    angle = rng.uniform(0.0, 2.0 * np.pi, size=count)
    cos, sin = _quantise(np.cos(angle), _PARAM_STEP), _quantise(np.sin(angle), _PARAM_STEP)
    where = rng.uniform(0.0, 1.0, size=(count, 2))

    cell = np.arange(count) % (_CELLS_PER_ROW * _CELLS_PER_ROW)
    cell_origin = np.stack([cell % _CELLS_PER_ROW, cell // _CELLS_PER_ROW], axis=-1) * float(_CELL)

    placed: list[list[tuple[list[float], int]]] = [[] for _ in range(count)]
    for label, name in enumerate(CLASSES):
        index = np.flatnonzero(labels == label)
        if index.size == 0:
            continue
        contours = [np.asarray(c, dtype=np.float64) for c in _CONTOURS[name](index.size, rng)]
        a, c, s = aspect[index, None], cos[index, None], sin[index, None]
        turned = []
        for contour in contours:
            x, y = contour[..., 0] * a, contour[..., 1] / a
            turned.append(np.stack([x * c - y * s, x * s + y * c], axis=-1))
        low, high = turned[0].min(axis=1), turned[0].max(axis=1)            # (n, 2) bounding box
        wanted = size[index] * _CELL / 2.0                                  # circumradius in pixels
        fits = (_CELL - 2.0 * _MARGIN) / (high - low).max(axis=1)
        scale = np.minimum(wanted, fits)[:, None]
        first = _MARGIN - scale * low                                       # lowest allowed offset
        last = _CELL - _MARGIN - scale * high
        offset = first + where[index] * (last - first) + cell_origin[index]
        flat = [_quantise(t * scale[:, :, None] + offset[:, None, :], _COORD_STEP).reshape(index.size, -1).tolist()
                for t in turned]
        for k, image in enumerate(index.tolist()):
            placed[image] = [(flat[0][k], 255)] + [(hole[k], 0) for hole in flat[1:]]
    return placed


def _draw_masks(placed: list[list[tuple[list[float], int]]]) -> np.ndarray:
    """Antialiased shape masks, uint8 (n, 32, 32), 255 inside the shape."""
    count = len(placed)
    per_canvas = _CELLS_PER_ROW * _CELLS_PER_ROW
    masks = np.empty((count, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    side = _CELLS_PER_ROW * _CELL
    for start in range(0, count, per_canvas):
        stop = min(start + per_canvas, count)
        canvas = Image.new("L", (side, side), 0)
        draw = ImageDraw.Draw(canvas)
        for contours in placed[start:stop]:
            for coords, fill in contours:
                draw.polygon(coords, fill=fill)
        small = np.asarray(canvas.reduce(_SUPERSAMPLE))
        cells = small.reshape(_CELLS_PER_ROW, IMAGE_SIZE, _CELLS_PER_ROW, IMAGE_SIZE).transpose(0, 2, 1, 3)
        masks[start:stop] = cells.reshape(per_canvas, IMAGE_SIZE, IMAGE_SIZE)[: stop - start]
    return masks


def _shape_and_background_colours(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(count, 3) float32 shape colours (each channel in ``_LIGHT_RANGE``) and background colours (``_DARK_RANGE``)."""
    shape_colour = rng.integers(_LIGHT_RANGE[0], _LIGHT_RANGE[1] + 1, size=(count, 3)).astype(np.float32)
    background = rng.integers(_DARK_RANGE[0], _DARK_RANGE[1] + 1, size=(count, 3)).astype(np.float32)
    return shape_colour, background


def _erode(alpha: np.ndarray) -> np.ndarray:
    """3x3 minimum filter of (n, H, W) masks, zero outside the image."""
    padded = np.pad(alpha, ((0, 0), (1, 1), (1, 1)))
    height, width = alpha.shape[1:]
    out = alpha.copy()
    for dy in range(3):
        for dx in range(3):
            np.minimum(out, padded[:, dy:dy + height, dx:dx + width], out=out)
    return out


def _colour(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Turn uint8 (n, 32, 32) masks into uint8 (n, 32, 32, 3) images with the colour-side random factors."""
    count = masks.shape[0]
    shape_colour, background = _shape_and_background_colours(count, rng)
    outline_colour = rng.integers(0, 256, size=(count, 3)).astype(np.float32)
    outline_on = (rng.uniform(size=count) < _OUTLINE_PROBABILITY).astype(np.float32)
    light_amount = rng.uniform(0.0, _LIGHT_MAX, size=count)
    light_angle = rng.uniform(0.0, 2.0 * np.pi, size=count)
    light_x = _quantise(light_amount * np.cos(light_angle), _PARAM_STEP).astype(np.float32)
    light_y = _quantise(light_amount * np.sin(light_angle), _PARAM_STEP).astype(np.float32)
    line_colour = rng.integers(0, 256, size=(count, 3)).astype(np.float32)
    line_on = rng.uniform(size=count) < _LINE_PROBABILITY
    line_opacity = np.where(line_on, rng.uniform(*_LINE_OPACITY, size=count), 0.0).astype(np.float32)
    line_x, line_y = rng.uniform(0.0, IMAGE_SIZE - 1.0, size=(2, count)).astype(np.float32)
    line_angle = rng.uniform(0.0, np.pi, size=count)
    line_cos = _quantise(np.cos(line_angle), _PARAM_STEP).astype(np.float32)
    line_sin = _quantise(np.sin(line_angle), _PARAM_STEP).astype(np.float32)
    # Noise is the sum of two uniform bytes (a triangular distribution, close enough to Gaussian
    # for this purpose): integers are several times cheaper to draw than normals, and exact.
    noise_scale = (rng.uniform(0.0, _NOISE_STD_MAX, size=count) / _TWO_BYTES_STD).astype(np.float32)

    # Pixel coordinates, and the same relative to the centre normalised to [-1, 1]: exact in float32.
    pixel = np.arange(IMAGE_SIZE, dtype=np.float32)
    centred = (pixel - np.float32((IMAGE_SIZE - 1) / 2.0)) / np.float32(IMAGE_SIZE / 2.0)
    images = np.empty((count, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for start in range(0, count, _COLOUR_CHUNK):
        part = slice(start, min(start + _COLOUR_CHUNK, count))
        n = part.stop - part.start
        # Work channels-first, (n, 3, H, W), so that every broadcast runs over whole 32x32 planes;
        # per-image scalars are (n, 1, 1) and per-image colours (n, 3, 1, 1).
        alpha = masks[part].astype(np.float32) * np.float32(1.0 / 255.0)
        rim = (alpha - _erode(alpha)) * outline_on[part, None, None]

        # Opacity of the distractor line: it falls off linearly to zero one pixel from the line.
        across = ((pixel[None, None, :] - line_x[part, None, None]) * line_sin[part, None, None]
                  - (pixel[None, :, None] - line_y[part, None, None]) * line_cos[part, None, None])
        line = np.maximum(np.float32(1.0) - np.abs(across), np.float32(0.0)) * line_opacity[part, None, None]

        fill, ground = shape_colour[part, :, None, None], background[part, :, None, None]
        image = ground + (fill - ground) * alpha[:, None]
        image += (outline_colour[part, :, None, None] - image) * rim[:, None]
        image += (line_colour[part, :, None, None] - image) * line[:, None]
        light = light_x[part, None, None] * centred[None, None, :] + light_y[part, None, None] * centred[None, :, None]
        image += light[:, None]
        noise = rng.integers(0, 256, size=(2, n, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
        noise = noise[0].astype(np.float32) + noise[1] - np.float32(255.0)
        noise *= noise_scale[part, None, None, None]
        image += noise
        np.rint(image, out=image)
        np.clip(image, 0.0, 255.0, out=image)
        images[part] = image.astype(np.uint8).transpose(0, 2, 3, 1)
    return images


def render_shapes(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Render ``count`` shapes10 images from ``seed``.

    Returns ``(images, labels)``: images uint8 (count, 32, 32, 3), channels last (HWC), RGB;
    labels int64 (count,), indices into :data:`CLASSES`, balanced (each class ``count // 10`` or
    one more times) and shuffled. The same ``(count, seed)`` always gives identical arrays.
    """
    count = _check_int(count, "count", 0)
    seed = _check_int(seed, "seed", 0)
    rng = np.random.default_rng(seed)
    labels = _balanced_labels(count, rng)
    masks = _draw_masks(_place_contours(labels, rng))
    return _colour(masks, rng), labels


# ----------------------------------------------------------------------------------------------
# The cache
# ----------------------------------------------------------------------------------------------
def default_root() -> Path:
    """Where datasets are cached: ``$MINIDNN_DATA`` if set, else ``~/.cache/minidnn``."""
    configured = os.environ.get("MINIDNN_DATA")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "minidnn"


def _split_seed(seed: int, split: str) -> int:
    # Injective in (seed, split): no two splits of any two base seeds share a rendering seed.
    return 2 * seed + SPLITS.index(split)


def _cache_path(root: Path, train_size: int, test_size: int, seed: int) -> Path:
    return root / f"shapes10-v{DATASET_VERSION}-train{train_size}-test{test_size}-seed{seed}.npz"


def _expected_contents(train_size: int, test_size: int, seed: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {
        "meta": ((4,), np.dtype(np.int64)),
        "train_images": ((train_size, IMAGE_SIZE, IMAGE_SIZE, 3), np.dtype(np.uint8)),
        "train_labels": ((train_size,), np.dtype(np.int64)),
        "test_images": ((test_size, IMAGE_SIZE, IMAGE_SIZE, 3), np.dtype(np.uint8)),
        "test_labels": ((test_size,), np.dtype(np.int64)),
    }


def _read_cache(path: Path, train_size: int, test_size: int, seed: int) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the file is missing, unreadable or not what was asked for."""
    if not path.is_file():
        return None
    expected = _expected_contents(train_size, test_size, seed)
    try:
        with open(path, "rb") as file:
            archive = np.load(file, allow_pickle=False)
            # A plain .npy file loads as an array, not an archive.
            if not isinstance(archive, np.lib.npyio.NpzFile) or set(archive.files) != set(expected):
                return None
            # Reading every member in full makes zipfile check its CRC, which catches bit rot.
            arrays = {name: archive[name] for name in expected}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
    for name, (shape, dtype) in expected.items():
        if arrays[name].shape != shape or arrays[name].dtype != dtype:
            return None
    if arrays["meta"].tolist() != [DATASET_VERSION, train_size, test_size, seed]:
        return None
    for split in SPLITS:
        labels = arrays[f"{split}_labels"]
        if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
            return None
    return arrays


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically: a temporary file in the same directory, then a rename."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def load_shapes(split: str = "train", root: str | os.PathLike[str] | None = None, train_size: int = 20000,
                test_size: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One split of shapes10, rendered on first use and cached under ``root``.

    Returns ``(images, labels)``: images uint8 (N, 32, 32, 3), channels last (NHWC), RGB; labels
    int64 (N,) indices into :data:`CLASSES`, balanced and shuffled; N is ``train_size`` or
    ``test_size``. The train and test splits are rendered from different seeds derived from
    ``seed`` (``2 * seed`` and ``2 * seed + 1``), so they share no images. Both splits live in one
    cache file, ``shapes10-v{version}-train{train_size}-test{test_size}-seed{seed}.npz`` under
    ``root`` (default: ``$MINIDNN_DATA`` or ``~/.cache/minidnn``); a missing, truncated or otherwise
    unreadable file is rendered again and replaced atomically.
    """
    if not isinstance(split, str):
        raise TypeError(f"split must be a string, 'train' or 'test', got {type(split).__name__}")
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path (str or os.PathLike) or None, got {type(root).__name__}")
    train_size = _check_int(train_size, "train_size", 1)
    test_size = _check_int(test_size, "test_size", 1)
    # The seed is stored in the cache file's int64 metadata, and split seeds are 2 * seed (+ 1).
    seed = _check_int(seed, "seed", 0, 2 ** 62 - 1)

    directory = default_root() if root is None else Path(root).expanduser()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"root must be a directory, but {str(directory)!r} is a file")
    directory.mkdir(parents=True, exist_ok=True)
    path = _cache_path(directory, train_size, test_size, seed)

    arrays = _read_cache(path, train_size, test_size, seed)
    if arrays is None:
        train_images, train_labels = render_shapes(train_size, _split_seed(seed, "train"))
        test_images, test_labels = render_shapes(test_size, _split_seed(seed, "test"))
        arrays = {
            "meta": np.array([DATASET_VERSION, train_size, test_size, seed], dtype=np.int64),
            "train_images": train_images, "train_labels": train_labels,
            "test_images": test_images, "test_labels": test_labels,
        }
        _write_cache(path, arrays)
    return arrays[f"{split}_images"], arrays[f"{split}_labels"]
