"""Datasets, the DataLoader and the transforms."""
import threading
import time

import numpy as np
import pytest

import minidnn
from minidnn.data import ArrayDataset, DataLoader, Dataset, Subset, transforms as T


def images_and_labels(count=23, size=6):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8), np.arange(count) % 5


def test_batches_cover_the_dataset_in_order():
    images, labels = images_and_labels()
    loader = DataLoader(ArrayDataset(images, labels, T.ToTensor()), batch_size=5)
    batches = list(loader)
    assert len(loader) == len(batches) == 5
    assert batches[0][0].shape == (5, 3, 6, 6) and batches[0][0].dtype == np.float32
    assert batches[-1][0].shape[0] == 3
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches]), labels)
    np.testing.assert_allclose(batches[1][0].numpy()[0], images[5].transpose(2, 0, 1) / 255, rtol=1e-6)


def test_shuffling_is_seeded_per_epoch_and_drop_last():
    images, labels = images_and_labels()
    loader = DataLoader(ArrayDataset(images, labels), batch_size=4, shuffle=True, drop_last=True, seed=3)
    first = [b[1].numpy() for b in loader]
    again = [b[1].numpy() for b in loader]
    loader.set_epoch(1)
    other = [b[1].numpy() for b in loader]
    assert len(first) == 5 and all(len(b) == 4 for b in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))
    loader.set_epoch(0)
    resumed = [b[1].numpy() for b in loader.iterate(start_batch=2)]
    assert all(np.array_equal(a, b) for a, b in zip(first[2:], resumed))


def test_random_augmentation_is_reproducible_with_threads():
    images, labels = images_and_labels(40, 8)
    pipeline = T.Compose([T.RandomCrop(8, padding=2), T.RandomHorizontalFlip(), T.ToTensor()])
    runs = []
    for workers in (0, 4):
        loader = DataLoader(ArrayDataset(images, labels, pipeline, seed=1), batch_size=8, num_workers=workers)
        runs.append(np.concatenate([b[0].numpy() for b in loader]))
    np.testing.assert_array_equal(*runs)
    assert not np.array_equal(runs[0], np.concatenate([b[0].numpy() for b in DataLoader(
        ArrayDataset(images, labels, pipeline, seed=2), batch_size=8)]))


class SlowDataset(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, index):
        time.sleep(0.1)
        return np.zeros(2, np.float32), index


def test_prefetch_overlaps_decoding_with_compute():
    loader = DataLoader(SlowDataset(), batch_size=1, prefetch=2)
    start = time.perf_counter()
    for _ in loader:
        time.sleep(0.1)  # "compute"
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0  # serial: 6 × (0.1 s decoding + 0.1 s compute) = 1.2 s; overlapped about 0.7 s


class BrokenDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        if index == 2:
            raise ValueError("cannot read image 'broken.png'")
        return np.zeros(1, np.float32), 0


def test_errors_reach_the_consumer_and_the_thread_stops():
    with pytest.raises(ValueError, match="broken.png"):
        list(DataLoader(BrokenDataset(), batch_size=1))
    loader = iter(DataLoader(SlowDataset(), batch_size=1))
    next(loader)
    loader.close()  # leaving early must not leave a producer blocked on a full queue

    def producers_alive():
        return any(t.name == "minidnn-data" and t.is_alive() for t in threading.enumerate())

    deadline = time.time() + 2
    while producers_alive() and time.time() < deadline:
        time.sleep(0.02)
    assert not producers_alive()


def test_loader_and_dataset_errors():
    images, labels = images_and_labels()
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        DataLoader(ArrayDataset(images, labels), batch_size=0)
    with pytest.raises(ValueError, match="same length"):
        ArrayDataset(images, labels[:3])
    with pytest.raises(IndexError, match="out of range"):
        ArrayDataset(images, labels)[99]
    assert len(Subset(ArrayDataset(images, labels), [1, 4])) == 2


def test_transforms():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (10, 14, 3), dtype=np.uint8)
    assert T.Resize(5)(image).shape == (5, 7, 3)
    assert T.Resize((4, 9))(image).shape == (4, 9, 3)
    np.testing.assert_array_equal(T.CenterCrop(4)(image), image[3:7, 5:9])
    assert T.RandomCrop((6, 6), padding=1)(image, rng).shape == (6, 6, 3)
    np.testing.assert_array_equal(T.RandomHorizontalFlip(1.0)(image, rng), image[:, ::-1])
    chw = T.ToTensor()(image)
    assert chw.shape == (3, 10, 14) and chw.max() <= 1.0
    normal = T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))(chw)
    np.testing.assert_allclose(normal, (chw - 0.5) / 0.25, rtol=1e-6)
    assert T.ToTensor()(image[:, :, 0]).shape == (1, 10, 14)
    with pytest.raises(ValueError, match="std > 0"):
        T.Normalize((0.5,), (0.0,))
    with pytest.raises(ValueError, match="larger than"):
        T.CenterCrop(20)(image)
    with pytest.raises(ValueError, match="after ToTensor"):
        T.Normalize((0.5, 0.5, 0.5), (1, 1, 1))(image)


def test_collate_makes_tensors():
    batch = minidnn.data.default_collate([(np.ones((2, 2), np.float32), 1), (np.zeros((2, 2), np.float32), 3)])
    assert isinstance(batch[0], minidnn.Tensor) and batch[0].shape == (2, 2, 2)
    assert batch[1].dtype == np.int64 and batch[1].tolist() == [1, 3]
