"""shapes10: rendering, determinism, class balance, the on-disk cache and the argument checks.

Every test renders a few dozen images at most and caches under ``tmp_path``, so the file runs in
about a second.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from minidnn.data import shapes
from minidnn.data.shapes import CLASSES, DATASET_VERSION, IMAGE_SIZE, load_shapes, render_shapes

SMALL = dict(train_size=30, test_size=20, seed=7)


def cache_file(root: Path, train_size: int = 30, test_size: int = 20, seed: int = 7) -> Path:
    return root / f"shapes10-v{DATASET_VERSION}-train{train_size}-test{test_size}-seed{seed}.npz"


@pytest.fixture
def render_calls(monkeypatch):
    """Counts the calls load_shapes makes to render_shapes (the real one still runs)."""
    calls: list[tuple[int, int]] = []
    real = shapes.render_shapes

    def counting(count: int, seed: int):
        calls.append((count, seed))
        return real(count, seed)

    monkeypatch.setattr(shapes, "render_shapes", counting)
    return calls


# ----------------------------------------------------------------------------------------------
# render_shapes
# ----------------------------------------------------------------------------------------------
def test_classes_are_ten_distinct_names():
    assert len(CLASSES) == 10 and len(set(CLASSES)) == 10
    assert all(isinstance(name, str) and name for name in CLASSES)


def test_render_shapes_returns_uint8_nhwc_images_and_int64_labels():
    images, labels = render_shapes(25, seed=3)
    assert images.shape == (25, IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == np.uint8
    assert labels.shape == (25,) and labels.dtype == np.int64
    assert labels.min() >= 0 and labels.max() < len(CLASSES)
    # Every image shows something: a light shape on a dark background spans a wide range.
    spread = images.reshape(25, -1).max(axis=1).astype(int) - images.reshape(25, -1).min(axis=1)
    assert (spread > 60).all()


def test_render_shapes_of_zero_images_is_empty():
    images, labels = render_shapes(0, seed=0)
    assert images.shape == (0, IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == np.uint8
    assert labels.shape == (0,) and labels.dtype == np.int64


def test_same_seed_gives_identical_arrays_and_another_seed_does_not():
    first_images, first_labels = render_shapes(20, seed=11)
    again_images, again_labels = render_shapes(20, seed=11)
    other_images, _ = render_shapes(20, seed=12)
    np.testing.assert_array_equal(first_images, again_images)
    np.testing.assert_array_equal(first_labels, again_labels)
    assert not np.array_equal(first_images, other_images)


def test_numpy_integers_are_accepted():
    images, labels = render_shapes(np.int64(10), np.int32(4))
    np.testing.assert_array_equal(images, render_shapes(10, 4)[0])
    assert labels.shape == (10,)


def test_rendering_is_bit_identical_to_the_recorded_digest():
    # Guards the promise that a seed means the same images everywhere. If this fails after a
    # deliberate change to the rendering, bump DATASET_VERSION (old caches must not be reused)
    # and record the new digest; if nothing was changed, Pillow or NumPy changed their output.
    images, labels = render_shapes(20, seed=0)
    digest = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()
    assert digest == RECORDED_DIGEST


RECORDED_DIGEST = "8ea68aa9a36c9c007f87c0a4a8749469ca54cfdcebe9faa4d7557305dd98214a"


@pytest.mark.parametrize("count", [10, 50, 57, 3])
def test_labels_are_balanced_and_shuffled(count):
    _, labels = render_shapes(count, seed=5)
    counts = np.bincount(labels, minlength=len(CLASSES))
    assert counts.sum() == count
    assert counts.max() - counts.min() <= 1
    if count >= 50:
        assert not np.array_equal(labels, np.arange(count) % len(CLASSES))


# ----------------------------------------------------------------------------------------------
# load_shapes and its cache
# ----------------------------------------------------------------------------------------------
def test_load_shapes_returns_both_splits_with_their_sizes(tmp_path):
    train_images, train_labels = load_shapes("train", root=tmp_path, **SMALL)
    test_images, test_labels = load_shapes("test", root=tmp_path, **SMALL)
    assert train_images.shape == (30, IMAGE_SIZE, IMAGE_SIZE, 3) and train_images.dtype == np.uint8
    assert test_images.shape == (20, IMAGE_SIZE, IMAGE_SIZE, 3) and test_images.dtype == np.uint8
    assert train_labels.shape == (30,) and train_labels.dtype == np.int64
    assert test_labels.shape == (20,) and test_labels.dtype == np.int64
    assert np.bincount(train_labels, minlength=10).tolist() == [3] * 10
    assert np.bincount(test_labels, minlength=10).tolist() == [2] * 10


def test_train_and_test_come_from_different_seeds_and_share_no_image(tmp_path, render_calls):
    train_images, _ = load_shapes("train", root=tmp_path, **SMALL)
    test_images, _ = load_shapes("test", root=tmp_path, **SMALL)
    (_, train_seed), (_, test_seed) = render_calls
    assert train_seed != test_seed
    assert not {image.tobytes() for image in train_images} & {image.tobytes() for image in test_images}


def test_split_seeds_never_collide_across_base_seeds():
    derived = [shapes._split_seed(seed, split) for seed in range(50) for split in ("train", "test")]
    assert len(set(derived)) == len(derived)


def test_cache_hit_returns_identical_arrays_without_rendering(tmp_path, monkeypatch):
    first = load_shapes("train", root=tmp_path, **SMALL)
    first_test = load_shapes("test", root=tmp_path, **SMALL)

    def must_not_render(count, seed):
        raise AssertionError("render_shapes called although the cache holds the data")

    monkeypatch.setattr(shapes, "render_shapes", must_not_render)
    again = load_shapes("train", root=tmp_path, **SMALL)
    again_test = load_shapes("test", root=tmp_path, **SMALL)
    for expected, actual in zip(first + first_test, again + again_test):
        np.testing.assert_array_equal(expected, actual)
        assert expected.dtype == actual.dtype


def test_both_splits_are_rendered_once_into_one_file(tmp_path, render_calls):
    load_shapes("test", root=tmp_path, **SMALL)
    load_shapes("train", root=tmp_path, **SMALL)
    assert sorted(count for count, _ in render_calls) == [20, 30]
    assert [p.name for p in tmp_path.iterdir()] == [cache_file(tmp_path).name]


def test_different_sizes_or_seeds_use_different_files(tmp_path):
    load_shapes("train", root=tmp_path, **SMALL)
    load_shapes("train", root=tmp_path, train_size=30, test_size=20, seed=8)
    load_shapes("train", root=tmp_path, train_size=40, test_size=20, seed=7)
    assert len(list(tmp_path.glob("*.npz"))) == 3


def test_cache_goes_to_minidnn_data_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDNN_DATA", str(tmp_path / "data"))
    load_shapes("train", **SMALL)
    assert cache_file(tmp_path / "data").is_file()


def test_root_may_be_a_string_and_is_created(tmp_path):
    root = tmp_path / "nested" / "dir"
    load_shapes("train", root=str(root), **SMALL)
    assert cache_file(root).is_file()


def _write_npz(path: Path, **arrays) -> None:
    with open(path, "wb") as file:
        np.savez(file, **arrays)


def _write_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as file:   # a file object, so that np.save does not append ".npy"
        np.save(file, array)


def _corruptions(path: Path, good: bytes):
    """Ways a cache file can go bad, each a function that writes the bad file."""
    valid = dict(np.load(path, allow_pickle=False))
    return {
        "empty": lambda: path.write_bytes(b""),
        "truncated": lambda: path.write_bytes(good[: len(good) // 2]),
        "garbage": lambda: path.write_bytes(b"not a zip file at all" * 10),
        "flipped bytes": lambda: path.write_bytes(good[:2000] + bytes(b ^ 0xFF for b in good[2000:2100]) + good[2100:]),
        "missing key": lambda: _write_npz(path, **{k: v for k, v in valid.items() if k != "test_labels"}),
        "extra key": lambda: _write_npz(path, extra=np.zeros(1), **valid),
        "wrong shape": lambda: _write_npz(path, **{**valid, "train_images": valid["train_images"][:5]}),
        "wrong dtype": lambda: _write_npz(path, **{**valid, "train_labels": valid["train_labels"].astype(np.int32)}),
        "wrong meta": lambda: _write_npz(path, **{**valid, "meta": valid["meta"] + 1}),
        "labels out of range": lambda: _write_npz(path, **{**valid, "train_labels": valid["train_labels"] + 10}),
        "pickled object array": lambda: _write_npz(
            path, **{**valid, "train_labels": np.array(list(valid["train_labels"]), dtype=object)}),
        "a plain .npy": lambda: _write_npy(path, valid["train_images"]),
    }


def test_every_kind_of_corrupt_cache_is_detected_and_regenerated(tmp_path, render_calls):
    expected = load_shapes("train", root=tmp_path, **SMALL)
    path = cache_file(tmp_path)
    good = path.read_bytes()
    for name, corrupt in _corruptions(path, good).items():
        corrupt()
        render_calls.clear()
        images, labels = load_shapes("train", root=tmp_path, **SMALL)
        assert render_calls, f"{name}: the corrupt cache was used"
        np.testing.assert_array_equal(images, expected[0], err_msg=name)
        np.testing.assert_array_equal(labels, expected[1], err_msg=name)
        assert path.read_bytes() == good, f"{name}: the cache file was not rewritten"


def test_a_directory_in_place_of_the_cache_file_is_a_clear_os_error(tmp_path):
    cache_file(tmp_path).mkdir()
    with pytest.raises(OSError):
        load_shapes("train", root=tmp_path, **SMALL)


def test_successful_write_leaves_no_temporary_files(tmp_path):
    load_shapes("train", root=tmp_path, **SMALL)
    assert [p.name for p in tmp_path.iterdir()] == [cache_file(tmp_path).name]


def test_failed_write_leaves_neither_a_temporary_nor_a_partial_file(tmp_path, monkeypatch):
    def savez_that_dies_half_way(file, **arrays):
        file.write(b"PK\x03\x04 half of a zip")
        raise OSError("disk full")

    monkeypatch.setattr(shapes.np, "savez", savez_that_dies_half_way)
    with pytest.raises(OSError, match="disk full"):
        load_shapes("train", root=tmp_path, **SMALL)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("count, seed, error, match", [
    (-1, 0, ValueError, "count"),
    (2.0, 0, TypeError, "count"),
    (True, 0, TypeError, "count"),
    ("3", 0, TypeError, "count"),
    (3, -1, ValueError, "seed"),
    (3, 1.5, TypeError, "seed"),
    (3, None, TypeError, "seed"),
])
def test_render_shapes_rejects_bad_arguments(count, seed, error, match):
    with pytest.raises(error, match=match):
        render_shapes(count, seed)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(split="valid"), ValueError, "split"),
    (dict(split="Train"), ValueError, "split"),
    (dict(split=0), TypeError, "split"),
    (dict(train_size=0), ValueError, "train_size"),
    (dict(train_size=10.0), TypeError, "train_size"),
    (dict(test_size=-5), ValueError, "test_size"),
    (dict(test_size=False), TypeError, "test_size"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed="0"), TypeError, "seed"),
    (dict(seed=2 ** 62), ValueError, "seed"),
    (dict(root=42), TypeError, "root"),
])
def test_load_shapes_rejects_bad_arguments(tmp_path, kwargs, error, match):
    arguments = dict(split="train", root=tmp_path, train_size=10, test_size=10, seed=0)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        load_shapes(**arguments)
    assert not list(tmp_path.glob("*.npz"))


def test_load_shapes_rejects_a_file_as_root(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    with pytest.raises(ValueError, match="root"):
        load_shapes("train", root=not_a_directory, **SMALL)
