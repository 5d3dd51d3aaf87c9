"""Datasets in the users' formats: IDX (MNIST, Fashion-MNIST), binary CIFAR-10/100, ImageFolder.

Every file is written here, from random data, by code independent of the readers (struct and
per-record loops rather than the readers' vectorised reshapes), and the failure cases check that
the error names the file or argument at fault.
"""
import gzip
import io
import os
import pickle
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from minidnn.data.cifar import CIFAR10, CIFAR100, CIFAR100_COARSE_CLASSES, CIFAR100_FINE_CLASSES, CIFAR10_CLASSES
from minidnn.data.dataset import ArrayDataset, TransformedDataset
from minidnn.data.folder import ImageFolder
from minidnn.data.loader import DataLoader
from minidnn.data.mnist import MNIST, FashionMNIST, read_idx
from minidnn.data.transforms import Compose, RandomCrop, RandomHorizontalFlip, ToTensor

# --------------------------------------------------------------------------- IDX / MNIST


def idx_bytes(array, code):
    """An IDX file: 00 00, type code, ndim, big-endian uint32 sizes, big-endian elements."""
    big = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[code]
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", size) for size in array.shape)
    return header + np.asarray(array).astype(big).tobytes()


def write(path, data, compress=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def write_mnist(directory, rng, counts=(7, 4), compress=False, classes=10):
    """The four MNIST files in ``directory``; returns {split: (images, labels)}."""
    suffix = ".gz" if compress else ""
    splits = {}
    for prefix, count in zip(("train", "t10k"), counts):
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, classes, count, dtype=np.uint8)
        write(directory / f"{prefix}-images-idx3-ubyte{suffix}", idx_bytes(images, 0x08), compress)
        write(directory / f"{prefix}-labels-idx1-ubyte{suffix}", idx_bytes(labels, 0x08), compress)
        splits[prefix] = images, labels
    return splits


@pytest.mark.parametrize("code, values", [
    (0x08, np.array([[0, 1, 255], [128, 7, 9]])),
    (0x09, np.array([[-128, -1, 127], [0, 5, -6]])),
    (0x0B, np.array([[-32768, 300, 32767], [1, -2, 258]])),
    (0x0C, np.array([[-2**31, 70000, 2**31 - 1], [1, -2, 16909060]])),
    (0x0D, np.array([[1.5, -2.25, 3e10], [0.0, -0.0, 1e-7]])),
    (0x0E, np.array([[np.pi, -1e300, 2.0], [5e-324, 1.0, -3.0]])),
])
def test_read_idx_every_type_code_big_endian(tmp_path, code, values):
    array = read_idx(write(tmp_path / "x.idx", idx_bytes(values, code)))
    expected = values.astype({0x08: np.uint8, 0x09: np.int8, 0x0B: np.int16, 0x0C: np.int32,
                              0x0D: np.float32, 0x0E: np.float64}[code])
    assert array.shape == (2, 3) and array.dtype == expected.dtype and array.dtype.isnative
    np.testing.assert_array_equal(array, expected)
    array[0, 0] = 1  # a writable copy, not a view of the file's bytes


def test_read_idx_gzip_by_content_and_other_ranks(tmp_path):
    cube = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(read_idx(write(tmp_path / "cube.gz", idx_bytes(cube, 0x08), compress=True)), cube)
    # gzip recognised by its magic, whatever the name
    np.testing.assert_array_equal(read_idx(write(tmp_path / "cube-raw", idx_bytes(cube, 0x08), compress=True)), cube)
    assert read_idx(write(tmp_path / "empty", idx_bytes(np.zeros((0, 28, 28), np.uint8), 0x08))).shape == (0, 28, 28)


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_round_trip_in_root(tmp_path, rng, compress):
    splits = write_mnist(tmp_path, rng, compress=compress)
    for train, prefix in ((True, "train"), (False, "t10k")):
        dataset = MNIST(tmp_path, train=train)
        images, labels = splits[prefix]
        assert isinstance(dataset, ArrayDataset) and len(dataset) == len(labels)
        assert dataset.images.dtype == np.uint8 and dataset.images.shape == images.shape
        assert dataset.labels.dtype == np.int64
        np.testing.assert_array_equal(dataset.images, images)
        np.testing.assert_array_equal(dataset.labels, labels)
        image, label = dataset[3]
        assert image.shape == (28, 28) and type(label) is int and label == labels[3]
        np.testing.assert_array_equal(image, images[3])


def test_mnist_and_fashion_in_torchvision_raw_layout(tmp_path, rng):
    digits = write_mnist(tmp_path / "MNIST" / "raw", rng, compress=True)
    fashion = write_mnist(tmp_path / "FashionMNIST" / "raw", rng, counts=(5, 3))
    for dataset, splits in ((MNIST(tmp_path), digits), (FashionMNIST(tmp_path), fashion),
                            (MNIST(tmp_path / "MNIST"), digits),
                            (FashionMNIST(tmp_path / "FashionMNIST" / "raw"), fashion)):
        np.testing.assert_array_equal(dataset.images, splits["train"][0])
        np.testing.assert_array_equal(dataset.labels, splits["train"][1])
    test = FashionMNIST(tmp_path, train=False)
    np.testing.assert_array_equal(test.labels, fashion["t10k"][1])
    assert MNIST(tmp_path).classes == ("0 - zero", "1 - one", "2 - two", "3 - three", "4 - four",
                                       "5 - five", "6 - six", "7 - seven", "8 - eight", "9 - nine")
    assert test.classes[0] == "T-shirt/top" and test.classes[9] == "Ankle boot" and len(test.classes) == 10
    assert test.class_to_idx["Bag"] == 8


def test_mnist_prefers_raw_over_gz_when_both(tmp_path, rng):
    splits = write_mnist(tmp_path, rng)
    for name in os.listdir(tmp_path):  # a stale .gz of other data beside the raw file: the raw one wins
        write(tmp_path / (name + ".gz"), idx_bytes(np.zeros((1, 28, 28), np.uint8), 0x08), compress=True)
    np.testing.assert_array_equal(MNIST(tmp_path).images, splits["train"][0])


def test_mnist_transforms_are_applied_and_reproducible(tmp_path, rng):
    write_mnist(tmp_path, rng)
    transform = Compose([RandomCrop(24, padding=2), ToTensor()])
    dataset = MNIST(tmp_path, transform=transform, target_transform=lambda y: y + 100, seed=3)
    image, label = dataset[2]
    assert image.shape == (1, 24, 24) and image.dtype == np.float32 and label == dataset.labels[2] + 100
    again = MNIST(tmp_path, transform=transform, target_transform=lambda y: y + 100, seed=3)
    np.testing.assert_array_equal(again[2][0], image)
    batch_images, batch_labels = next(iter(DataLoader(dataset, batch_size=4)))
    assert batch_images.shape == (4, 1, 24, 24) and batch_labels.numpy().tolist() == (dataset.labels[:4] + 100).tolist()


def test_idx_truncated_and_trailing_bytes(tmp_path):
    good = idx_bytes(np.zeros((3, 28, 28), np.uint8), 0x08)
    with pytest.raises(ValueError, match=r"short\.idx.*truncated.*\(3, 28, 28\).*2352 data bytes.*2351"):
        read_idx(write(tmp_path / "short.idx", good[:-1]))
    with pytest.raises(ValueError, match=r"long\.idx.*longer than its header"):
        read_idx(write(tmp_path / "long.idx", good + b"\0"))
    with pytest.raises(ValueError, match=r"header\.idx.*truncated.*3 dimensions"):
        read_idx(write(tmp_path / "header.idx", good[:9]))
    with pytest.raises(ValueError, match=r"short\.gz.*after gunzip.*truncated"):
        read_idx(write(tmp_path / "short.gz", good[:-5], compress=True))
    with pytest.raises(ValueError, match=r"cut\.gz.*damaged or truncated gzip"):
        read_idx(write(tmp_path / "cut.gz", gzip.compress(good)[:-12]))


@pytest.mark.parametrize("data", [b"\x00\x01\x08\x01", b"\x00\x00\x07\x01\x00\x00\x00\x00", b"PK\x03\x04junk", b""])
def test_idx_bad_magic(tmp_path, data):
    with pytest.raises(ValueError, match=r"bad\.idx.* is not an IDX file.*magic"):
        read_idx(write(tmp_path / "bad.idx", data))


def test_mnist_count_mismatch_names_both_files(tmp_path, rng):
    write_mnist(tmp_path, rng)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(np.zeros(6, np.uint8), 0x08))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.* 7 images .*train-labels-idx1-ubyte.* 6 labels"):
        MNIST(tmp_path)


def test_mnist_wrong_shapes_and_labels(tmp_path, rng):
    write_mnist(tmp_path, rng)
    write(tmp_path / "t10k-labels-idx1-ubyte", idx_bytes(np.array([0, 1, 10, 2]), 0x08))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte.*label 10.*0-9"):
        MNIST(tmp_path, train=False)
    write(tmp_path / "t10k-images-idx3-ubyte", idx_bytes(np.zeros((4, 28, 28)), 0x0D))
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.*uint8 images.*float32"):
        MNIST(tmp_path, train=False)


def test_mnist_missing_files_and_bad_arguments(tmp_path, rng):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="MNIST root .*nowhere"):
        MNIST(missing)
    with pytest.raises(FileNotFoundError, match=r"IDX file .*nowhere"):
        read_idx(missing)
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"train-images-idx3-ubyte.*empty.*MNIST.*raw"):
        MNIST(tmp_path / "empty")
    write(tmp_path / "half" / "t10k-images-idx3-ubyte.gz", idx_bytes(np.zeros((1, 28, 28), np.uint8), 0x08), True)
    with pytest.raises(FileNotFoundError, match=r"t10k-images-idx3-ubyte\.gz.*no labels file.*t10k-labels-idx1-ubyte"):
        FashionMNIST(tmp_path / "half", train=False)
    with pytest.raises(TypeError, match="train must be a bool"):
        MNIST(tmp_path, train="test")
    with pytest.raises(TypeError, match="root must be a path"):
        MNIST(None)


# --------------------------------------------------------------------------- CIFAR


def cifar_record(labels, image):
    """label byte(s), then the R plane, G plane and B plane of a 32x32x3 HWC image, row-major."""
    planes = b"".join(bytes(image[:, :, channel].ravel().tolist()) for channel in range(3))
    return bytes(labels) + planes


def write_cifar10(directory, rng, per_batch=3):
    """The binary CIFAR-10 files with ``per_batch`` records each; returns {file: (images, labels)}."""
    contents = {}
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        images = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch)
        write(directory / name, b"".join(cifar_record([y], x) for x, y in zip(images, labels)))
        contents[name] = images, labels
    return contents


def test_cifar10_round_trip_plane_order_and_hwc(tmp_path, rng):
    directory = tmp_path / "cifar-10-batches-bin"
    contents = write_cifar10(directory, rng)
    red = np.zeros((32, 32, 3), np.uint8)
    red[:, :, 0] = 255
    red[0, 1] = (1, 2, 3)  # row 0, column 1: tells rows from columns and the channel order
    write(directory / "test_batch.bin", cifar_record([4], red) + cifar_record([7], contents["test_batch.bin"][0][0]))
    for root in (tmp_path, directory):
        train = CIFAR10(root)
        assert isinstance(train, ArrayDataset) and len(train) == 15
        assert train.images.shape == (15, 32, 32, 3) and train.images.dtype == np.uint8
        assert train.labels.dtype == np.int64 and train.images.flags.c_contiguous
        names = [f"data_batch_{i}.bin" for i in range(1, 6)]  # batches concatenated in order
        np.testing.assert_array_equal(train.images, np.concatenate([contents[n][0] for n in names]))
        np.testing.assert_array_equal(train.labels, np.concatenate([contents[n][1] for n in names]))
        image, label = train[4]
        assert type(label) is int and label == contents["data_batch_2.bin"][1][1]
        np.testing.assert_array_equal(image, contents["data_batch_2.bin"][0][1])
    test = CIFAR10(tmp_path, train=False)
    image, label = test[0]
    assert label == 4 and image.shape == (32, 32, 3)
    assert image[5, 5].tolist() == [255, 0, 0] and image[1, 0].tolist() == [255, 0, 0]
    assert image[0, 1].tolist() == [1, 2, 3]
    np.testing.assert_array_equal(test[1][0], contents["test_batch.bin"][0][0])
    assert test.classes == CIFAR10_CLASSES and test.class_to_idx["truck"] == 9


def test_cifar10_class_names_from_meta_and_transforms(tmp_path, rng):
    write_cifar10(tmp_path, rng)
    names = [f"class{i}" for i in range(10)]
    (tmp_path / "batches.meta.txt").write_text("\n".join(names) + "\n\n")  # the real file ends in blank lines
    transform = Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), ToTensor()])
    dataset = CIFAR10(tmp_path, transform=transform, seed=1)
    assert dataset.classes == tuple(names)
    image, _ = dataset[0]
    assert image.shape == (3, 32, 32) and image.dtype == np.float32
    np.testing.assert_array_equal(CIFAR10(tmp_path, transform=transform, seed=1)[0][0], image)
    (tmp_path / "batches.meta.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"batches\.meta\.txt.*names 2 classes, expected 10"):
        CIFAR10(tmp_path)


def test_cifar100_fine_and_coarse(tmp_path, rng):
    directory = tmp_path / "cifar-100-binary"
    splits = {}
    for name, count in (("train.bin", 5), ("test.bin", 3)):
        images = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
        coarse, fine = rng.integers(0, 20, count), rng.integers(0, 100, count)
        write(directory / name, b"".join(cifar_record([c, f], x) for x, c, f in zip(images, coarse, fine)))
        splits[name] = images, coarse, fine
    fine_set = CIFAR100(tmp_path)
    coarse_set = CIFAR100(directory, train=False, label="coarse")
    images, coarse, fine = splits["train.bin"]
    np.testing.assert_array_equal(fine_set.images, images)
    np.testing.assert_array_equal(fine_set.labels, fine)
    np.testing.assert_array_equal(fine_set.coarse_labels, coarse)
    assert fine_set[2][1] == fine[2] and fine_set.classes == CIFAR100_FINE_CLASSES
    images, coarse, fine = splits["test.bin"]
    np.testing.assert_array_equal(coarse_set.images, images)
    np.testing.assert_array_equal(coarse_set.labels, coarse)
    np.testing.assert_array_equal(coarse_set.fine_labels, fine)
    assert coarse_set[1][1] == coarse[1] and coarse_set.classes == CIFAR100_COARSE_CLASSES
    # the built-in names are the distribution's: alphabetical, 100 and 20 distinct
    for names, count in ((CIFAR100_FINE_CLASSES, 100), (CIFAR100_COARSE_CLASSES, 20)):
        assert len(set(names)) == count and list(names) == sorted(names)
    (directory / "coarse_label_names.txt").write_text("".join(f"super{i}\n" for i in range(20)))
    assert CIFAR100(tmp_path, label="coarse").classes[19] == "super19"
    with pytest.raises(ValueError, match="label must be 'fine' or 'coarse'"):
        CIFAR100(tmp_path, label="both")


def test_cifar_truncated_file_names_file_and_sizes(tmp_path, rng):
    write_cifar10(tmp_path, rng)
    data = (tmp_path / "data_batch_3.bin").read_bytes()
    write(tmp_path / "data_batch_3.bin", data[:-100])
    with pytest.raises(ValueError, match=r"data_batch_3\.bin.* 9119 bytes.* 3073-byte records"):
        CIFAR10(tmp_path)
    write(tmp_path / "train.bin", data)  # CIFAR-10 records are one byte shorter than CIFAR-100's
    with pytest.raises(ValueError, match=r"train\.bin.* 9219 bytes.* 3074-byte records"):
        CIFAR100(tmp_path)


def test_cifar_labels_out_of_range(tmp_path, rng):
    write_cifar10(tmp_path, rng)
    write(tmp_path / "test_batch.bin", cifar_record([10], np.zeros((32, 32, 3), np.uint8)))
    with pytest.raises(ValueError, match=r"test_batch\.bin.*label 10.*10 classes"):
        CIFAR10(tmp_path, train=False)


def test_cifar_missing_files(tmp_path, rng):
    with pytest.raises(FileNotFoundError, match=r"CIFAR-10 root .*nowhere"):
        CIFAR10(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"data_batch_1\.bin.*cifar-10-batches-bin"):
        CIFAR10(tmp_path)
    write_cifar10(tmp_path / "cifar-10-batches-bin", rng)
    os.remove(tmp_path / "cifar-10-batches-bin" / "data_batch_4.bin")
    with pytest.raises(FileNotFoundError, match=r"cifar-10-batches-bin.* lacks data_batch_4\.bin"):
        CIFAR10(tmp_path)
    assert len(CIFAR10(tmp_path, train=False)) == 3  # the test split needs only test_batch.bin
    write(tmp_path / "other" / "cifar-100-binary.tar.gz", b"not extracted")
    with pytest.raises(FileNotFoundError, match=r"cifar-100-binary\.tar\.gz.* not extracted"):
        CIFAR100(tmp_path / "other")
    with pytest.raises(TypeError, match="train must be a bool"):
        CIFAR10(tmp_path, train=1)


class _CreatesMarker:
    """Unpickling this calls open(marker, 'w'), i.e. creates the marker file: code run by a pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("dataset, layout", [
    (CIFAR10, {"cifar-10-batches-py": ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                                       "data_batch_5", "test_batch", "batches.meta"]}),
    (CIFAR10, {".": ["data_batch_1", "test_batch"]}),
    (CIFAR100, {"cifar-100-python": ["train", "test", "meta"]}),
])
def test_cifar_pickle_version_refused_and_never_unpickled(tmp_path, dataset, layout):
    marker = tmp_path / "unpickled-marker"
    payload = pickle.dumps(_CreatesMarker(marker))
    # The payload does run code when unpickled (shown on a separate marker, by the test's own loads):
    proof = tmp_path / "proof-marker"
    pickle.loads(pickle.dumps(_CreatesMarker(proof))).close()
    assert proof.exists()
    root = tmp_path / "root"
    for directory, names in layout.items():
        for name in names:
            write(root / directory / name, payload)
    for train in (True, False):
        with pytest.raises(ValueError, match=r"pickle.*refuses.*arbitrary code.*binary"):
            dataset(root, train=train)
    assert not marker.exists()


# --------------------------------------------------------------------------- ImageFolder


def save_image(path, array, **options):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **options)
    return path


@pytest.fixture
def image_tree(tmp_path, rng):
    """root/{cat, dog, ant}: PNGs and JPEGs, a nested directory, decoys; returns (root, {path: array})."""
    root = tmp_path / "images"
    arrays = {}
    for relative, shape in (("cat/b.png", (5, 7, 3)), ("cat/a.png", (6, 4, 3)), ("cat/deeper/c.png", (3, 3, 3)),
                            ("ant/x.PNG", (4, 4, 3)), ("dog/photo.jpg", (16, 24, 3)), ("dog/other.jpeg", (8, 8, 3))):
        array = rng.integers(0, 256, shape, dtype=np.uint8)
        if relative.endswith(("jpg", "jpeg")):  # smooth content so JPEG stays close to the original
            array = np.broadcast_to(np.linspace(20, 230, shape[1], dtype=np.uint8)[None, :, None], shape).copy()
        save_image(root / relative, array, **({"quality": 95} if "jp" in relative else {}))
        arrays[str(root / relative)] = array
    gray = rng.integers(0, 256, (3, 5), dtype=np.uint8)
    save_image(root / "ant" / "gray.png", gray)
    arrays[str(root / "ant" / "gray.png")] = np.repeat(gray[:, :, None], 3, axis=2)
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "dog" / "._photo.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # macOS resource fork
    (root / ".ipynb_checkpoints").mkdir()
    (root / "README.md").write_text("a file at the top level is not a class")
    return root, arrays


def test_image_folder_classes_order_and_pixels(image_tree):
    root, arrays = image_tree
    dataset = ImageFolder(root)
    assert isinstance(dataset, TransformedDataset)
    assert dataset.classes == ("ant", "cat", "dog") and dataset.class_to_idx == {"ant": 0, "cat": 1, "dog": 2}
    relative = [(os.path.relpath(path, root), target) for path, target in dataset.samples]
    assert relative == [("ant/gray.png", 0), ("ant/x.PNG", 0), ("cat/a.png", 1), ("cat/b.png", 1),
                        ("cat/deeper/c.png", 1), ("dog/other.jpeg", 2), ("dog/photo.jpg", 2)]
    assert dataset.targets == [0, 0, 1, 1, 1, 2, 2] and len(dataset) == 7
    for index, (path, target) in enumerate(dataset.samples):
        image, label = dataset[index]
        assert type(label) is int and label == target
        assert image.dtype == np.uint8 and image.shape == arrays[path].shape  # RGB HWC, gray expanded
        if path.endswith("png") or path.endswith("PNG"):
            np.testing.assert_array_equal(image, arrays[path])
        else:
            assert np.abs(image.astype(int) - arrays[path]).max() <= 8  # JPEG is lossy
    np.testing.assert_array_equal(dataset[-1][0], dataset[6][0])
    with pytest.raises(IndexError, match="index 7 is out of range"):
        dataset[7]
    with pytest.warns(UserWarning, match=r"classes without images in .*: ant, cat$"):
        assert len(ImageFolder(root, extensions=(".jpg",))) == 1  # the empty classes keep their indices
    with pytest.warns(UserWarning, match=r"classes without images in .*: dog$"):
        assert len(ImageFolder(root, extensions=".png")) == 5  # case-insensitive; ".PNG" counts


def test_image_folder_rgba_and_palette_become_rgb(tmp_path, rng):
    rgba = rng.integers(0, 256, (4, 5, 4), dtype=np.uint8)
    save_image(tmp_path / "a" / "rgba.png", rgba)
    Image.fromarray(rgba[:, :, :3]).convert("P").save(tmp_path / "a" / "palette.png")
    dataset = ImageFolder(tmp_path)
    np.testing.assert_array_equal(dataset[1][0], rgba[:, :, :3])
    assert dataset[0][0].shape == (4, 5, 3)


def test_image_folder_transforms_and_loader(image_tree):
    root, _ = image_tree
    transform = Compose([RandomCrop(3), RandomHorizontalFlip(), ToTensor()])
    dataset = ImageFolder(root, transform=transform, target_transform=lambda y: -y, seed=5)
    image, label = dataset[5]
    assert image.shape == (3, 3, 3) and image.dtype == np.float32 and label == -2
    np.testing.assert_array_equal(ImageFolder(root, transform=transform, seed=5)[5][0], image)
    loader = DataLoader(dataset, batch_size=3, shuffle=True, num_workers=2, seed=1)
    first = [(x.numpy(), y.numpy()) for x, y in loader]
    again = [(x.numpy(), y.numpy()) for x, y in loader]
    assert [x.shape for x, _ in first] == [(3, 3, 3, 3), (3, 3, 3, 3), (1, 3, 3, 3)]
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def corrupt_tree(tmp_path, rng):
    root = tmp_path / "images"
    good = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    save_image(root / "a" / "1.png", good)
    buffer = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(buffer, "JPEG")
    write(root / "a" / "2-truncated.jpg", buffer.getvalue()[:len(buffer.getvalue()) // 2])
    write(root / "b" / "3-garbage.jpg", b"this is not a JPEG at all")
    save_image(root / "b" / "4.png", good[::-1])
    return root, good


def test_image_folder_corrupt_image_raises_with_filename(tmp_path, rng):
    root, _ = corrupt_tree(tmp_path, rng)
    dataset = ImageFolder(root)  # listing opens no file
    assert len(dataset) == 4
    with pytest.raises(ValueError, match=r"cannot read image '.*2-truncated\.jpg'"):
        dataset[1]
    with pytest.raises(ValueError, match=r"cannot read image '.*3-garbage\.jpg'"):
        dataset[2]
    with pytest.raises(ValueError, match=r"cannot read image '.*2-truncated\.jpg'"):  # through the loader's thread
        list(DataLoader(dataset, batch_size=4, num_workers=2))


def test_image_folder_skip_corrupt_warns_and_keeps_indices_fixed(tmp_path, rng):
    root, good = corrupt_tree(tmp_path, rng)
    with pytest.warns(UserWarning) as record:
        dataset = ImageFolder(root, skip_corrupt=True)
    messages = [str(w.message) for w in record]
    assert any("2-truncated.jpg" in m for m in messages) and any("3-garbage.jpg" in m for m in messages)
    assert [os.path.basename(p) for p, _ in dataset.skipped] == ["2-truncated.jpg", "3-garbage.jpg"]
    assert len(dataset) == 2 and dataset.targets == [0, 1] and dataset.classes == ("a", "b")
    np.testing.assert_array_equal(dataset[0][0], good)
    np.testing.assert_array_equal(dataset[1][0], good[::-1])
    batches = [y.numpy().tolist() for _, y in DataLoader(dataset, batch_size=2)]
    assert batches == [[0, 1]]
    os.remove(root / "a" / "2-truncated.jpg")
    os.remove(root / "b" / "3-garbage.jpg")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to skip: no warning
        clean = ImageFolder(root, skip_corrupt=True)
    assert clean.samples == dataset.samples and clean.skipped == []


def test_image_folder_all_corrupt_or_empty_class(tmp_path):
    write(tmp_path / "only" / "bad.jpg", b"\xff\xd8\xff broken")
    with pytest.warns(UserWarning, match=r"bad\.jpg"):
        with pytest.raises(ValueError, match=r"none of the 1 images .*bad\.jpg"):
            ImageFolder(tmp_path, skip_corrupt=True)
    save_image(tmp_path / "zeta" / "z.png", np.zeros((2, 2, 3), np.uint8))
    with pytest.warns(UserWarning) as record:
        dataset = ImageFolder(tmp_path, skip_corrupt=True)
    assert [str(w.message).split(":")[0] for w in record] == [
        f"ImageFolder skips {str(tmp_path / 'only' / 'bad.jpg')!r}, which cannot be read",
        f"ImageFolder classes without readable images in {str(tmp_path)!r}"]
    assert str(record[1].message).endswith(": only")
    assert dataset.classes == ("only", "zeta") and dataset.targets == [1]


def test_image_folder_bad_roots_and_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ImageFolder root .*nowhere.* does not exist"):
        ImageFolder(tmp_path / "nowhere")
    file = write(tmp_path / "file.png", b"")
    with pytest.raises(NotADirectoryError, match=r"file\.png.* not a directory"):
        ImageFolder(file)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty.* no class sub-directories"):
        ImageFolder(tmp_path / "empty")
    (tmp_path / "noimages" / "cat").mkdir(parents=True)
    (tmp_path / "noimages" / "cat" / "x.txt").write_text("text")
    with pytest.raises(FileNotFoundError, match=r"no images with extensions .jpg.*noimages"):
        ImageFolder(tmp_path / "noimages")
    with pytest.raises(ValueError, match="extensions must be"):
        ImageFolder(tmp_path / "noimages", extensions=("png",))
    with pytest.raises(TypeError, match="root must be a path"):
        ImageFolder(3)


def test_image_folder_splits_share_the_training_class_indices(tmp_path):
    # val/ lacks "ant": sorted on their own its classes would be cat=0, dog=1, while the model
    # learned ant=0, cat=1, dog=2, and every validation image would be scored against a wrong label.
    for relative in ("train/ant/1.png", "train/cat/2.png", "train/dog/3.png", "val/cat/4.png", "val/dog/5.png"):
        save_image(tmp_path / relative, np.zeros((2, 2, 3), np.uint8))
    train = ImageFolder(tmp_path / "train")
    with pytest.warns(UserWarning, match=r"no directory for the classes: ant \(their indices stay reserved\)"):
        val = ImageFolder(tmp_path / "val", classes=train.classes)
    assert val.classes == train.classes and val.class_to_idx == train.class_to_idx
    assert val.targets == [1, 2] and [label for _, label in (val[0], val[1])] == [1, 2]
    save_image(tmp_path / "val" / "eel" / "6.png", np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match=r"val' has class directories that are not among the given classes: eel "
                                         r"\(the classes are: ant, cat, dog\)"):
        ImageFolder(tmp_path / "val", classes=train.classes)
    with pytest.raises(ValueError, match="classes must be a non-empty sequence of distinct"):
        ImageFolder(tmp_path / "train", classes=("ant", "ant", "cat", "dog"))


def test_image_folder_unreadable_image_error_is_a_value_error_with_the_path(tmp_path, rng):
    from minidnn.data.folder import UnreadableImageError

    root, _ = corrupt_tree(tmp_path, rng)
    with pytest.raises(UnreadableImageError) as info:
        ImageFolder(root)[2]
    assert isinstance(info.value, ValueError) and info.value.path.endswith("3-garbage.jpg")


# --------------------------------------------------------------------------- every mode and bit depth


def png_bytes(samples, color_type):
    """A PNG written here from its specification (not by Pillow): 8 or 16 bits per sample, no filter."""
    height, width = samples.shape[:2]
    depth = 16 if samples.dtype == np.uint16 else 8

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = samples.reshape(height, -1).astype(">u2" if depth == 16 else "u1")
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    header = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def decoded(path):
    """What an ImageFolder sample holding ``path`` decodes to (the class folder is ``path``'s parent)."""
    dataset = ImageFolder(path.parent.parent, extensions=(path.suffix,))
    return dataset[[p for p, _ in dataset.samples].index(str(path))][0]


def eight_bit_files(root, rng):
    """(mode Pillow opens the file in, path) for files of every 8-bit mode, in formats that keep the mode."""
    rgb = Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    files = []
    for mode, suffix in (("1", ".png"), ("L", ".png"), ("LA", ".png"), ("P", ".png"), ("RGB", ".png"),
                         ("RGBA", ".png"), ("CMYK", ".jpg"), ("CMYK", ".tiff"), ("YCbCr", ".tiff"),
                         ("LAB", ".tiff")):
        picture = rgb.convert("RGBA") if mode == "RGBA" else rgb.convert(mode)
        if mode in ("RGBA", "LA"):  # an alpha channel of its own, which must not leak into the colours
            picture.putalpha(Image.fromarray(rng.integers(0, 256, (5, 7), dtype=np.uint8)))
        path = root / "modes" / f"{mode}-{suffix[1:]}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        picture.save(path)
        files.append((mode, path))
    return files


def test_every_8_bit_mode_decodes_as_pillow_converts_it(tmp_path, rng):
    for mode, path in eight_bit_files(tmp_path, rng):
        with Image.open(path) as picture:
            assert picture.mode == mode, path  # the file really holds that mode
            oracle = np.array(picture.convert("RGB"))
        image = decoded(path)
        assert image.dtype == np.uint8 and image.shape == (5, 7, 3), mode
        np.testing.assert_array_equal(image, oracle, err_msg=mode)


def test_modes_without_a_file_format_and_with_alpha_keep_their_colours(rng):
    from minidnn.data.folder import to_rgb

    rgb = rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
    picture = Image.fromarray(rgb)
    for mode in ("HSV", "PA", "RGBX"):
        converted = picture.convert("P").convert("PA") if mode == "PA" else picture.convert(mode)
        np.testing.assert_array_equal(to_rgb(converted), np.array(converted.convert("RGB")), err_msg=mode)
    low = rng.integers(0, 256, (4, 6), dtype=np.uint16)
    wide = rgb[:, :, 0].astype(np.uint16) * 256 + low  # 16-bit samples whose high byte is the 8-bit value
    for mode, order in (("I;16L", "<u2"), ("I;16N", "=u2"), ("I;16B", ">u2")):
        sixteen = Image.frombytes(mode, (6, 4), wide.astype(order).tobytes())  # (convert() would clip at 255)
        np.testing.assert_array_equal(to_rgb(sixteen), rgb[:, :, [0, 0, 0]], err_msg=mode)
    rgba = np.concatenate([rgb, rng.integers(0, 256, (4, 6, 1), dtype=np.uint8)], axis=2)
    np.testing.assert_array_equal(to_rgb(Image.fromarray(rgba)), rgb)  # alpha dropped, colours kept exactly
    gray = rng.integers(0, 256, (4, 6), dtype=np.uint8)
    np.testing.assert_array_equal(to_rgb(Image.fromarray(gray)), gray[:, :, None].repeat(3, axis=2))


def sixteen_bit_samples(rng):
    samples = rng.integers(0, 65536, (5, 7), dtype=np.uint16)
    samples.flat[:4] = [0, 255, 256, 65535]  # the edges of the high byte
    return samples


def test_16_bit_grey_keeps_its_values_as_pillow_reads_16_bit_colour(tmp_path, rng):
    # Pillow reduces 16-bit RGB, grey+alpha and RGBA PNGs to 8 bits itself (the high byte): the oracle for
    # the 16-bit grey modes, which its convert("RGB") clips at 255 instead (an almost white image).
    samples = sixteen_bit_samples(rng)
    root = tmp_path / "sixteen" / "a"
    root.mkdir(parents=True)
    (root / "rgb16.png").write_bytes(png_bytes(np.stack([samples] * 3, axis=2), color_type=2))
    with Image.open(root / "rgb16.png") as picture:
        assert picture.mode == "RGB"
        oracle = np.array(picture)
    np.testing.assert_array_equal(oracle, (samples >> 8)[:, :, None].repeat(3, axis=2))  # the high byte, indeed
    (root / "gray16.png").write_bytes(png_bytes(samples, color_type=0))
    (root / "gray-alpha16.png").write_bytes(png_bytes(np.stack([samples, samples[::-1]], axis=2), color_type=4))
    Image.fromarray(samples).save(root / "gray16.tiff")
    Image.frombytes("I;16B", samples.shape[::-1], samples.astype(">u2").tobytes()).save(root / "gray16b.tiff")
    Image.fromarray(samples).save(root / "gray16.pgm")
    expected_modes = {"gray16.png": "I;16", "gray-alpha16.png": "RGBA", "gray16.tiff": "I;16",
                      "gray16b.tiff": "I;16B", "gray16.pgm": "I"}
    for name, mode in expected_modes.items():
        with Image.open(root / name) as picture:
            assert picture.mode == mode, name
        np.testing.assert_array_equal(decoded(root / name), oracle, err_msg=name)


def test_32_bit_integer_and_float_images(tmp_path, rng):
    root = tmp_path / "wide" / "a"
    root.mkdir(parents=True)
    samples = sixteen_bit_samples(rng).astype(np.int32)
    samples.flat[4:6] = [-5, 70000]  # outside 16 bits: clipped, as Pillow's convert("I;16") clips
    Image.fromarray(samples).save(root / "int32.tiff")
    with Image.open(root / "int32.tiff") as picture:
        assert picture.mode == "I"
        clipped = np.array(picture.convert("I;16")).astype(np.int64)
    np.testing.assert_array_equal(clipped, np.clip(samples, 0, 65535))
    np.testing.assert_array_equal(decoded(root / "int32.tiff"), (clipped >> 8)[:, :, None].repeat(3, axis=2))
    floats = rng.uniform(-20, 280, (5, 7)).astype(np.float32)  # Pillow's F scale is L's: 0..255
    Image.fromarray(floats).save(root / "float.tiff")
    with Image.open(root / "float.tiff") as picture:
        assert picture.mode == "F"
        oracle = np.array(picture.convert("RGB"))
    np.testing.assert_array_equal(decoded(root / "float.tiff"), oracle)


# --------------------------------------------------------------------------- what the walk reads


def test_a_named_pipe_or_a_socket_in_a_class_folder_is_skipped_with_a_warning(tmp_path):
    import socket

    save_image(tmp_path / "a" / "1.png", np.zeros((2, 2, 3), np.uint8))
    save_image(tmp_path / "b" / "2.png", np.zeros((2, 2, 3), np.uint8))
    os.mkfifo(tmp_path / "a" / "pipe.png")  # opening it blocks until someone writes: never
    os.symlink(tmp_path / "nowhere.png", tmp_path / "b" / "dangling.png")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(tmp_path / "b" / "socket.jpg"))
        with pytest.warns(UserWarning) as record:
            dataset = ImageFolder(tmp_path)
    finally:
        server.close()
    messages = sorted(str(w.message) for w in record)
    assert [os.path.basename(p) for p, _ in dataset.samples] == ["1.png", "2.png"]
    assert len(messages) == 3
    assert "pipe.png', which is a named pipe, not a regular file" in messages[0]
    assert "dangling.png', which is a link to nothing" in messages[1]
    assert "socket.jpg', which is a socket" in messages[2]
    assert [dataset[i][1] for i in range(2)] == [0, 1]  # and reading never blocks


def test_a_symlink_loop_is_walked_once_and_no_link_leads_out_of_the_class(tmp_path):
    for relative in ("cat/1.png", "cat/deep/2.png", "cat/deep/deeper/3.png", "dog/4.png", "dog/5.png"):
        save_image(tmp_path / relative, np.zeros((2, 2, 3), np.uint8))
    os.symlink("..", tmp_path / "cat" / "deep" / "loop")          # back up to cat: a loop
    os.symlink(".", tmp_path / "cat" / "deep" / "deeper" / "self")  # a loop onto itself
    os.symlink("deep", tmp_path / "cat" / "alias")                 # a second name for a directory inside
    os.symlink("../dog", tmp_path / "cat" / "dogs")                # another class: its images are no cats
    os.symlink(str(tmp_path.parent), tmp_path / "dog" / "outside")  # out of the data set entirely
    os.symlink("../dog/4.png", tmp_path / "cat" / "linked.png")      # a link to a file is followed
    with pytest.warns(UserWarning) as record:
        dataset = ImageFolder(tmp_path)
    relative = [(os.path.relpath(path, tmp_path), target) for path, target in dataset.samples]
    assert relative == [("cat/1.png", 0), ("cat/linked.png", 0), ("cat/alias/2.png", 0),
                        ("cat/alias/deeper/3.png", 0), ("dog/4.png", 1), ("dog/5.png", 1)]
    messages = sorted(str(w.message) for w in record)
    assert len(messages) == 2
    assert "dogs', a link to" in messages[0] and "outside the class folder" in messages[0]
    assert "outside', a link to" in messages[1]
