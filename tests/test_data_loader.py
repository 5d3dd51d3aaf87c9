"""Datasets, the DataLoader (epochs, seeds, worker processes, the batch transform, the GPU feed) and the
transforms. Worker-process tests start real processes (spawn): each costs about a second."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import minidnn
from minidnn.data import ArrayDataset, DataLoader, Dataset, Subset, WorkerError, sample_random, transforms as T


def images_and_labels(count=23, size=6):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8), np.arange(count) % 5


def labels_of(loader):
    return [batch[1].numpy() for batch in loader]


# ----------------------------------------------------------------------------------------------
# Batches and epochs
# ----------------------------------------------------------------------------------------------
def test_batches_cover_the_dataset_in_order():
    images, labels = images_and_labels()
    loader = DataLoader(ArrayDataset(images, labels, T.ToTensor()), batch_size=5)
    batches = list(loader)
    assert len(loader) == len(batches) == 5
    assert batches[0][0].shape == (5, 3, 6, 6) and batches[0][0].dtype == np.float32
    assert batches[-1][0].shape[0] == 3
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches]), labels)
    np.testing.assert_allclose(batches[1][0].numpy()[0], images[5].transpose(2, 0, 1) / 255, rtol=1e-6)


def test_a_plain_epoch_loop_reshuffles_every_epoch():
    images, labels = images_and_labels(40)
    loader = DataLoader(ArrayDataset(images, np.arange(40)), batch_size=8, shuffle=True, seed=3)
    epochs = []
    for _ in range(3):  # PyTorch's loop: nothing but iterating
        epochs.append(np.concatenate([batch[1].numpy() for batch in loader]))
    for order in epochs:
        assert sorted(order.tolist()) == list(range(40))  # each epoch is a permutation of the dataset
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    assert loader.epoch == 3


def test_two_loaders_made_after_the_same_manual_seed_give_the_same_orders():
    images, labels = images_and_labels()

    def orders(seed):
        minidnn.manual_seed(seed)
        loader = DataLoader(ArrayDataset(images, labels), batch_size=4, shuffle=True)
        return [np.concatenate(labels_of(loader)) for _ in range(2)]

    first, again, other = orders(11), orders(11), orders(12)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])


def test_the_seed_comes_from_seed_generator_or_the_global_generator():
    images, labels = images_and_labels()
    dataset = ArrayDataset(images, labels)
    minidnn.manual_seed(5)
    before = minidnn.get_rng_state()
    DataLoader(dataset, shuffle=True, seed=9)
    DataLoader(dataset, shuffle=False)
    assert minidnn.get_rng_state() == before  # neither drew from the global generator
    drawn = DataLoader(dataset, shuffle=True).seed
    assert minidnn.get_rng_state() != before
    assert DataLoader(dataset, shuffle=True, generator=minidnn.random.Generator(5)).seed == drawn
    assert DataLoader(dataset, shuffle=True, generator=np.random.default_rng(1)).seed == \
        int(np.random.default_rng(1).integers(0, 2**63))
    with pytest.raises(ValueError, match="seed or generator, not both"):
        DataLoader(dataset, shuffle=True, seed=1, generator=np.random.default_rng())
    with pytest.raises(TypeError, match="generator must be a minidnn.random.Generator"):
        DataLoader(dataset, shuffle=True, generator=3)
    with pytest.raises(ValueError, match="seed must be None or an int >= 0"):
        DataLoader(dataset, shuffle=True, seed=-1)


def test_set_epoch_and_start_batch_resume_an_epoch_exactly():
    images, labels = images_and_labels(40, 8)
    pipeline = T.Compose([T.RandomCrop(8, padding=2), T.RandomHorizontalFlip(), T.ToTensor()])
    loader = DataLoader(ArrayDataset(images, labels, pipeline, seed=4), batch_size=6, shuffle=True, drop_last=True,
                        seed=2)
    run = [[(x.numpy(), y.numpy()) for x, y in loader] for _ in range(3)]  # epochs 0, 1, 2
    assert len(run[0]) == 6 and all(len(y) == 6 for _, y in run[0])
    resumed = DataLoader(ArrayDataset(images, labels, pipeline, seed=4), batch_size=6, shuffle=True, drop_last=True,
                         seed=2)  # a new process, say
    resumed.set_epoch(1)
    rest = [(x.numpy(), y.numpy()) for x, y in resumed.iterate(start_batch=2)]
    assert len(rest) == 4
    for (x, y), (x_resumed, y_resumed) in zip(run[1][2:], rest):
        np.testing.assert_array_equal(y, y_resumed)
        np.testing.assert_array_equal(x, x_resumed)  # the augmentation of epoch 1 too
    assert resumed.epoch == 2
    np.testing.assert_array_equal(np.concatenate(labels_of(resumed)), np.concatenate([y for _, y in run[2]]))


def test_augmentation_follows_the_epoch_also_without_shuffling():
    images, labels = images_and_labels(12, 8)
    pipeline = T.Compose([T.RandomCrop(8, padding=2), T.ToTensor()])
    loader = DataLoader(ArrayDataset(images, labels, pipeline, seed=1), batch_size=12)
    first, second = (next(iter(loader))[0].numpy() for _ in range(2))
    assert not np.array_equal(first, second)
    loader.set_epoch(0)
    np.testing.assert_array_equal(next(iter(loader))[0].numpy(), first)


@pytest.mark.parametrize("batch_size, drop_last", [(4, False), (5, True), (7, False)])
def test_a_sampler_gives_torchs_batches(batch_size, drop_last, rng):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader as TorchLoader, DistributedSampler as TorchSampler  # noqa: PLC0415

    import minidnn.distributed as dist  # noqa: PLC0415

    count = 23
    images, labels = images_and_labels(count)
    ours_set, theirs_set = ArrayDataset(images, np.arange(count)), torch.utils.data.TensorDataset(torch.arange(count))
    order = rng.permutation(count)[:19].tolist()  # any iterable with a len(): a part of the data, in any order
    ours = [y.numpy().tolist() for _, y in DataLoader(ours_set, batch_size, drop_last=drop_last, sampler=order)]
    theirs = [b[0].tolist() for b in TorchLoader(theirs_set, batch_size, drop_last=drop_last, sampler=order)]
    assert ours == theirs and len(DataLoader(ours_set, batch_size, drop_last=drop_last, sampler=order)) == len(theirs)
    for rank in range(3):  # the unshuffled shards, PyTorch's padding and striding
        sampler = dist.DistributedSampler(ours_set, num_replicas=3, rank=rank, shuffle=False)
        ours = [y.numpy().tolist() for _, y in DataLoader(ours_set, batch_size, drop_last=drop_last, sampler=sampler)]
        torch_sampler = TorchSampler(theirs_set, num_replicas=3, rank=rank, shuffle=False)
        theirs = [b[0].tolist() for b in TorchLoader(theirs_set, batch_size, drop_last=drop_last,
                                                     sampler=torch_sampler)]
        assert ours == theirs, rank
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        TorchLoader(theirs_set, sampler=order, shuffle=True)  # the message we keep
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(ours_set, sampler=order, shuffle=True)


def test_a_sampler_is_told_its_epoch_by_its_user_and_the_loader_keeps_the_augmentation_epoch():
    import minidnn.distributed as dist  # noqa: PLC0415

    images, labels = images_and_labels(30, 8)
    pipeline = T.Compose([T.RandomCrop(8, padding=2), T.ToTensor()])
    dataset = ArrayDataset(images, np.arange(30), pipeline, seed=5)
    sampler = dist.DistributedSampler(dataset, num_replicas=2, rank=1, seed=7)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True)
    assert len(loader) == 3  # 15 of the 30 indices on this rank, in batches of 4
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append([(x.numpy(), y.numpy()) for x, y in loader])
        np.testing.assert_array_equal(np.concatenate([y for _, y in epochs[-1]]), list(sampler)[:12])
    assert not np.array_equal(epochs[0][0][1], epochs[1][0][1])  # the sampler reshuffled
    unchanged = [y.numpy() for _, y in loader]  # no set_epoch: PyTorch's loader does not call it either
    np.testing.assert_array_equal(np.concatenate(unchanged), np.concatenate([y for _, y in epochs[1]]))
    # A resumed epoch: the sampler's epoch chosen by its user, the loader's (the crops) by set_epoch.
    again = DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True)
    sampler.set_epoch(1)
    again.set_epoch(1)
    for (x, y), (x_again, y_again) in zip(epochs[1][1:], again.iterate(start_batch=1), strict=True):
        np.testing.assert_array_equal(y, y_again.numpy())
        np.testing.assert_array_equal(x, x_again.numpy())


def test_sampler_errors():
    images, labels = images_and_labels()
    dataset = ArrayDataset(images, labels)

    class Liar:
        def __iter__(self):
            return iter(range(5))

        def __len__(self):
            return 6

    with pytest.raises(TypeError, match="sampler must be an iterable of dataset indices with a len()"):
        DataLoader(dataset, sampler=iter(range(5)))
    with pytest.raises(ValueError, match=r"the sampler gave 5 indices, but its len\(\) is 6"):
        list(DataLoader(dataset, sampler=Liar()))
    with pytest.raises(ValueError, match="the sampler gave index 23, outside the dataset's range 0..22"):
        list(DataLoader(dataset, batch_size=2, sampler=[0, 23]))


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


def test_in_memory_batches_are_one_gather(monkeypatch):
    images, labels = images_and_labels(17)
    expected = list(DataLoader(ArrayDataset(images, labels, T.Compose([])), batch_size=5, shuffle=True, seed=1))
    dataset = ArrayDataset(images, labels.astype(np.uint8))
    calls = []
    monkeypatch.setattr(ArrayDataset, "__getitem__", lambda self, index: calls.append(index))
    batches = list(DataLoader(dataset, batch_size=5, shuffle=True, seed=1))
    assert calls == []  # no sample fetched one by one
    for (x, y), (x_expected, y_expected) in zip(batches, expected, strict=True):
        assert x.dtype == np.uint8 and y.dtype == np.int64
        np.testing.assert_array_equal(x.numpy(), x_expected.numpy())
        np.testing.assert_array_equal(y.numpy(), y_expected.numpy())
    subset = Subset(dataset, [3, 1, 4])
    np.testing.assert_array_equal(subset.get_batch([2, 0])[0], images[[4, 3]])


def test_a_gather_writes_into_the_arrays_offered_where_they_fit():
    images, labels = images_and_labels(19)
    dataset = Subset(ArrayDataset(images, labels.astype(np.uint8)), np.arange(19)[::-1])
    picks = np.array([4, -2, 0, 18])  # negative indices count from the end, as in NumPy
    rows = np.arange(19)[::-1][picks]
    offered = [np.full((4, 6, 6, 3), 7, np.uint8), np.full(4, -1, np.int64)]
    got = dataset.get_batch(picks, into=offered)
    assert got[0] is offered[0] and got[1] is offered[1]
    np.testing.assert_array_equal(offered[0], images[rows])
    np.testing.assert_array_equal(offered[1], labels[rows])
    unfit = [np.zeros((3, 6, 6, 3), np.uint8), np.zeros(4, np.int32)]  # a row short; labels not int64
    got = dataset.get_batch(picks, into=unfit)
    assert got[0] is not unfit[0] and got[1] is not unfit[1] and not unfit[0].any() and not unfit[1].any()
    np.testing.assert_array_equal(got[0], images[rows])
    assert got[1].dtype == np.int64
    with pytest.raises(IndexError, match="out of range"):
        dataset.dataset.get_batch([3, 19], into=offered)


def test_loader_and_dataset_errors():
    images, labels = images_and_labels()
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        DataLoader(ArrayDataset(images, labels), batch_size=0)
    with pytest.raises(ValueError, match="persistent_workers=True needs num_workers > 0"):
        DataLoader(ArrayDataset(images, labels), persistent_workers=True)
    with pytest.raises(TypeError, match="batch_transform must be a batch transform"):
        DataLoader(ArrayDataset(images, labels), batch_transform=T.ToTensor())
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        DataLoader(ArrayDataset(images, labels)).set_epoch(-1)
    with pytest.raises(ValueError, match="same length"):
        ArrayDataset(images, labels[:3])
    with pytest.raises(IndexError, match="out of range"):
        ArrayDataset(images, labels)[99]
    assert len(Subset(ArrayDataset(images, labels), [1, 4])) == 2


@pytest.mark.skipif(minidnn.backend.cuda_is_available(), reason="a GPU is there")
def test_pin_memory_without_a_gpu_warns_and_goes_on():
    images, labels = images_and_labels()
    with pytest.warns(UserWarning, match="no CUDA GPU"):
        loader = DataLoader(ArrayDataset(images, labels), batch_size=4, pin_memory=True)
    assert len(list(loader)) == 6
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        DataLoader(ArrayDataset(images, labels), device="cuda")


# ----------------------------------------------------------------------------------------------
# The batch transform and the batched per-sample generators
# ----------------------------------------------------------------------------------------------
def test_batch_draws_are_numpys_per_sample_generators(rng):
    for trial in range(12):
        seed = int(rng.integers(0, 2**63)) if trial % 2 else int(rng.integers(0, 1000))
        epoch = int(rng.integers(0, 2**40)) if trial % 5 == 0 else int(rng.integers(0, 100))
        indices = rng.integers(0, 2**33 if trial % 6 == 0 else 50000, 61)
        # 2**31 + 1 rejects about half of Lemire's draws: the exact per-sample path for those samples.
        calls = [("integers", int(rng.choice([1, 2, 37, 2**31 + 1, 2**32]))) for _ in range(int(rng.integers(0, 4)))]
        calls.insert(int(rng.integers(0, len(calls) + 1)), ("random",))
        expected = []
        for index in indices.tolist():
            generator = np.random.default_rng((seed, epoch, index))
            expected.append([generator.integers(0, c[1]) if c[0] == "integers" else generator.random() for c in calls])
        got = sample_random.draw(seed, epoch, indices, calls)
        vector, exact = sample_random._vector_draws(seed, epoch, indices, calls)  # without the exact fallback
        for position in range(len(calls)):
            column = np.array([row[position] for row in expected])
            np.testing.assert_array_equal(got[position], column)
            np.testing.assert_array_equal(vector[position][exact], column[exact])
        small = indices < 2**32  # larger indices are two entropy words: drawn by NumPy itself
        assert not exact[~small].any() and exact[small].mean() > 0.5 ** calls.count(("integers", 2**31 + 1)) / 4
    assert sample_random._agrees  # the batched path was in use throughout


def test_a_numpy_that_draws_differently_is_caught(monkeypatch):
    vector = sample_random._vector_draws
    monkeypatch.setattr(sample_random, "_checked", False)
    monkeypatch.setattr(sample_random, "_agrees", True)
    monkeypatch.setattr(sample_random, "_vector_draws", lambda *a: ([r + 1 for r in vector(*a)[0]], vector(*a)[1]))
    with pytest.warns(RuntimeWarning, match="draws differently"):
        got = sample_random.draw(1, 2, np.arange(10), [("integers", 9)])
    np.testing.assert_array_equal(got[0], [np.random.default_rng((1, 2, i)).integers(0, 9) for i in range(10)])
    assert not sample_random._agrees


CIFAR_MEAN, CIFAR_STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def per_sample_pipeline(crop, padding, flip):
    steps = ([T.RandomCrop(crop, padding=padding)] if crop else []) + ([T.RandomHorizontalFlip(flip)] if flip else [])
    return T.Compose([*steps, T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)])


@pytest.mark.parametrize("crop, padding, flip", [((7, 8), 3, 0.5), (5, 0, None), (None, 0, 0.3), (None, 0, None)])
def test_crop_flip_normalize_gives_the_per_sample_pipelines_images_bitwise(crop, padding, flip):
    images, labels = images_and_labels(29, 7)
    images = np.concatenate([images, images[:, :, :2]], axis=2)  # 7 x 9: rows and columns tell apart
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=crop, padding=padding, flip=flip)
    fast = DataLoader(Subset(ArrayDataset(images, labels, seed=8), np.arange(29)[::-1]), batch_size=6, shuffle=True,
                      seed=1, batch_transform=batch)
    slow = DataLoader(Subset(ArrayDataset(images, labels, per_sample_pipeline(crop, padding, flip), seed=8),
                             np.arange(29)[::-1]), batch_size=6, shuffle=True, seed=1)
    for _ in range(2):  # two epochs: the draws follow the epoch
        for (x, y), (x_slow, y_slow) in zip(fast, slow):
            assert x.dtype == np.float32 and x.shape == x_slow.shape
            np.testing.assert_array_equal(x.numpy(), x_slow.numpy())
            np.testing.assert_array_equal(y.numpy(), y_slow.numpy())


@pytest.mark.parametrize("draw_ahead", [2, 3])
def test_the_draws_made_batches_ahead_are_each_batchs_own(monkeypatch, draw_ahead):
    """The batch transform's draws are made several batches at once (chunks of 2 and 3 batches over 6): every batch,
    of a whole pass and of one resumed part-way, is still the per-sample pipeline's, bitwise."""
    from minidnn.data import loader as loader_module  # noqa: PLC0415

    monkeypatch.setattr(loader_module, "_DRAW_AHEAD", draw_ahead)
    images, labels = images_and_labels(33, 7)
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=(6, 5), padding=2, flip=0.5)
    fast = DataLoader(ArrayDataset(images, labels, seed=3), batch_size=6, shuffle=True, seed=2, batch_transform=batch)
    slow = DataLoader(ArrayDataset(images, labels, per_sample_pipeline((6, 5), 2, 0.5), seed=3), batch_size=6,
                      shuffle=True, seed=2)
    for start in (0, 3):
        fast.set_epoch(1)
        slow.set_epoch(1)
        got, expected = list(fast.iterate(start)), list(slow.iterate(start))
        assert len(got) == len(expected) == 6 - start
        for (x, y), (x_slow, y_slow) in zip(got, expected):
            np.testing.assert_array_equal(x.numpy(), x_slow.numpy())
            np.testing.assert_array_equal(y.numpy(), y_slow.numpy())


@pytest.mark.parametrize("shape", [(37, 5, 7, 3), (2, 9, 1), (11, 4)], ids=["rgb", "one_channel", "flat"])
def test_channel_statistics_from_histograms_against_float64(shape):
    """Each channel's mean and population std of uint8 images (..., C), against NumPy's on a float64 copy; the
    extremes 0 and 255 included, and a constant channel's std exactly 0."""
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, shape, dtype=np.uint8)
    pixels = images.reshape(-1, shape[-1])  # a view: the first two pixels become the extremes
    pixels[0], pixels[1] = 0, 255
    mean, std = T.channel_statistics(images)
    wide = pixels.astype(np.float64)
    np.testing.assert_allclose(mean, wide.mean(axis=0), rtol=1e-13, atol=0)
    np.testing.assert_allclose(std, wide.std(axis=0), rtol=1e-12, atol=0)
    # Nearly constant: a variance of 5e-6 beside a mean square of 65025, which E[x²] − mean² would cancel away.
    bright = np.full((200_000, 1), 255, dtype=np.uint8)
    bright[0] = 254
    np.testing.assert_allclose(T.channel_statistics(bright)[1], bright.astype(np.float64).std(axis=0), rtol=1e-9)
    constant_mean, constant_std = T.channel_statistics(np.full((3, 4, 2), 17, dtype=np.uint8))
    assert constant_mean.tolist() == [17.0, 17.0] and constant_std.tolist() == [0.0, 0.0]
    with pytest.raises(TypeError, match="uint8 array of images"):
        T.channel_statistics(images.astype(np.float32))
    with pytest.raises(ValueError, match="at least one pixel"):
        T.channel_statistics(np.zeros((0, 3), np.uint8))


def test_crop_flip_normalize_errors():
    with pytest.raises(ValueError, match="padding needs crop"):
        T.CropFlipNormalize((0.5,), (0.5,), padding=2)
    with pytest.raises(ValueError, match="flip must be None or a probability"):
        T.CropFlipNormalize((0.5,), (0.5,), flip=2)
    with pytest.raises(ValueError, match="std > 0"):
        T.CropFlipNormalize((0.5,), (0.0,))
    images, labels = images_and_labels(4, 6)
    with pytest.raises(ValueError, match="larger than the"):
        list(DataLoader(ArrayDataset(images, labels), batch_transform=T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD,
                                                                                            crop=9)))
    with pytest.raises(ValueError, match="batch_transform works on the batch's first array"):
        list(DataLoader(ArrayDataset(images, labels, T.ToTensor()), batch_transform=T.CropFlipNormalize(
            CIFAR_MEAN, CIFAR_STD)))


# ----------------------------------------------------------------------------------------------
# Worker processes
# ----------------------------------------------------------------------------------------------
class JitteryDataset(Dataset):
    """Samples that take a random time to fetch: workers finish out of order."""

    def __init__(self, count=24):
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        time.sleep(float(np.random.default_rng(index).random()) * 0.02)
        return np.full((2, 3), index, np.float32), index


class PickyError(ValueError):
    """An error whose __init__ takes other arguments than its args (UnreadableImageError's shape)."""

    def __init__(self, path, reason):
        super().__init__(f"cannot read {path!r}: {reason}")
        self.path = path


class PickyDataset(JitteryDataset):
    def __getitem__(self, index):
        if index == 13:
            raise PickyError(f"image-{index}.png", "truncated")
        return super().__getitem__(index)


class StuckDataset(JitteryDataset):
    """Sample 5 never arrives (a read that blocks forever, as a named pipe does)."""

    def __getitem__(self, index):
        if index == 5:
            time.sleep(3600)
        return super().__getitem__(index)


def worker_processes():
    import multiprocessing  # noqa: PLC0415
    return [p for p in multiprocessing.active_children() if p.name.startswith("minidnn-data-worker")]


def feeder_threads():
    """The threads multiprocessing's queues write through (only the loaders make such queues here)."""
    return [t for t in threading.enumerate() if t.name == "QueueFeederThread" and t.is_alive()]


def test_workers_give_the_in_process_batches_in_order_and_end_with_the_iteration():
    images, labels = images_and_labels(40, 8)
    pipeline = T.Compose([T.RandomCrop(8, padding=2), T.RandomHorizontalFlip(), T.ToTensor()])
    here = DataLoader(ArrayDataset(images, labels, pipeline, seed=1), batch_size=6, shuffle=True, seed=2)
    there = DataLoader(ArrayDataset(images, labels, pipeline, seed=1), batch_size=6, shuffle=True, seed=2,
                       num_workers=2)
    for (x, y), (x_there, y_there) in zip(here, there, strict=True):
        np.testing.assert_array_equal(x.numpy(), x_there.numpy())
        np.testing.assert_array_equal(y.numpy(), y_there.numpy())
    assert worker_processes() == []  # not persistent: gone with the iteration
    jittery = [y.numpy() for _, y in DataLoader(JitteryDataset(), batch_size=2, num_workers=3, prefetch=3)]
    np.testing.assert_array_equal(np.concatenate(jittery), np.arange(24))  # in order, whatever the timing


def test_the_queues_threads_end_within_the_shutdown(monkeypatch):
    """A queue's feeder thread closes its pipe last, and may fail there: the shutdown waits for it, so that it
    ends (and reports) while the loader's thread waits, never later beside other work. Its close slowed here,
    so that a shutdown that did not wait would leave it running."""
    import multiprocessing.connection  # noqa: PLC0415
    close = multiprocessing.connection.Connection.close

    def slow_close(self):
        time.sleep(0.2)
        close(self)

    monkeypatch.setattr(multiprocessing.connection.Connection, "close", slow_close)
    assert np.concatenate(labels_of(DataLoader(JitteryDataset(8), batch_size=4, num_workers=2))).size == 8
    assert feeder_threads() == []


def test_workers_follow_the_sampler():
    images, labels = images_and_labels(20, 8)
    pipeline = T.Compose([T.RandomCrop(8, padding=2), T.ToTensor()])
    order = list(range(19, -1, -3))
    here = DataLoader(ArrayDataset(images, labels, pipeline, seed=1), batch_size=3, sampler=order)
    there = DataLoader(ArrayDataset(images, labels, pipeline, seed=1), batch_size=3, sampler=order, num_workers=2)
    for (x, y), (x_there, y_there) in zip(here, there, strict=True):
        np.testing.assert_array_equal(x.numpy(), x_there.numpy())
        np.testing.assert_array_equal(y.numpy(), y_there.numpy())
    np.testing.assert_array_equal(np.concatenate(labels_of(there)), labels[order])


def test_persistent_workers_serve_every_epoch_and_end_on_close():
    loader = DataLoader(JitteryDataset(12), batch_size=4, shuffle=True, seed=3, num_workers=2, persistent_workers=True)
    first = np.concatenate(labels_of(loader))
    pids = sorted(p.pid for p in worker_processes())
    iterator = iter(loader)
    next(iterator)
    iterator.close()  # left early: its results still in flight must not reach the next epoch
    third = np.concatenate(labels_of(loader))
    assert sorted(p.pid for p in worker_processes()) == pids and len(pids) == 2
    loader.set_epoch(2)
    np.testing.assert_array_equal(third, np.concatenate(labels_of(loader)))
    assert sorted(first.tolist()) == list(range(12)) and not np.array_equal(first, third)
    loader.close()
    assert worker_processes() == []


def test_a_workers_error_arrives_at_its_batch_with_its_type_and_attributes():
    loader = iter(DataLoader(PickyDataset(), batch_size=4, num_workers=2))
    got = [next(loader)[1].numpy().tolist() for _ in range(3)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(PickyError, match=r"cannot read 'image-13.png': truncated") as caught:
        next(loader)
    assert caught.value.path == "image-13.png"
    assert any("DataLoader worker process" in note for note in caught.value.__notes__)


def test_an_unpicklable_dataset_is_a_clear_error():
    images, labels = images_and_labels()
    dataset = ArrayDataset(images, labels, transform=lambda image, rng: image)
    with pytest.raises(TypeError, match="cannot be pickled.*no lambdas"):
        list(DataLoader(dataset, num_workers=1))


def test_workers_ignore_ctrl_c_and_a_killed_worker_is_a_clear_error():
    loader = iter(DataLoader(JitteryDataset(60), batch_size=1, num_workers=2))
    next(loader), next(loader)  # batch 1 came from worker 1: both are in their loop
    for worker in worker_processes():
        os.kill(worker.pid, signal.SIGINT)  # Ctrl-C reaches the process group; the loop decides, not a worker
    for _ in range(10):
        next(loader)
    os.kill(worker_processes()[0].pid, signal.SIGTERM)  # SIGTERM ends a worker at once
    with pytest.raises(WorkerError, match="was ended by SIGTERM"):
        for _ in loader:
            pass
    assert worker_processes() == []


def test_a_stuck_worker_is_ended_when_the_loop_is_interrupted():
    """A signal handler that raises (Ctrl-C, a second SIGTERM) while the loop waits for a batch that never comes
    ends the wait, and closing the iteration ends the stuck worker within seconds instead of waiting for it."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in DataLoader(StuckDataset(), batch_size=2, num_workers=2):
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 8
    assert worker_processes() == []


PARENT = textwrap.dedent("""
    import multiprocessing
    import sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from test_data_loader import StuckDataset
    from minidnn.data import DataLoader

    if __name__ == "__main__":  # worker processes import this script again, as PyTorch's do
        iterator = iter(DataLoader(StuckDataset(), batch_size=2, num_workers=2))
        next(iterator)
        print(" ".join(str(p.pid) for p in multiprocessing.active_children() if p.name.startswith("minidnn-data")),
              flush=True)
        next(iterator)  # batch 2 holds the stuck sample: waits forever
""")


def test_workers_never_outlive_their_process(tmp_path):
    """Two runs waiting on a stuck worker, one ended by SIGKILL, one by SIGTERM's default action (no Python
    cleanup runs in either): their workers end on their own, stuck read or not."""
    tests = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=os.path.dirname(tests), tests=tests))
    parents = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        pids = []
        for parent, ending in zip(parents, (signal.SIGKILL, signal.SIGTERM)):
            workers = [int(p) for p in parent.stdout.readline().split()]
            assert len(workers) == 2
            pids += workers
            parent.send_signal(ending)
        for parent in parents:
            parent.wait(10)
    finally:
        for parent in parents:
            parent.kill()
            parent.stdout.close()
            parent.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as file:  # a zombie waiting to be reaped is gone for our purpose
            return file.read().split(")")[-1].split()[0] != "Z"

    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


# ----------------------------------------------------------------------------------------------
# Transforms and collation
# ----------------------------------------------------------------------------------------------
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
    assert minidnn.data.default_collate([(0.5,), (1.5,)])[0].dtype == np.float32


def keep_strings(samples):
    """A collate_fn returning a dict with a Tensor, an array and a list of strings."""
    return {"x": minidnn.tensor(np.stack([s[0] for s in samples])), "index": np.array([s[1] for s in samples]),
            "name": [f"sample-{s[1]}" for s in samples]}


@pytest.mark.parametrize("workers", [0, 1])
def test_a_collate_fn_keeps_its_structure(workers):
    batches = list(DataLoader(JitteryDataset(5), batch_size=2, collate_fn=keep_strings, num_workers=workers))
    assert isinstance(batches[0]["x"], minidnn.Tensor) and isinstance(batches[0]["index"], np.ndarray)
    assert [b["name"] for b in batches] == [["sample-0", "sample-1"], ["sample-2", "sample-3"], ["sample-4"]]
    np.testing.assert_array_equal(batches[2]["x"].numpy(), np.full((1, 2, 3), 4, np.float32))


# ----------------------------------------------------------------------------------------------
# The GPU feed's bookkeeping, with a stand-in CuPy (on every machine)
# ----------------------------------------------------------------------------------------------
class StandInDeviceArray(np.ndarray):
    """A "device" array (NumPy underneath, so the primitives take their NumPy path) that logs its copies."""

    log: list = []

    def set(self, host, stream=None):
        self.log.append(("copy", stream.name, host.ctypes.data))
        self[...] = host


class StandInCupy:
    """Just enough of CuPy for minidnn.data.device: streams and events that log what waits for what."""

    def __init__(self):
        self.log = StandInDeviceArray.log = []
        self.pinned = 0
        log = self.log

        class Stream:
            def __init__(self, non_blocking=False, name="side"):
                assert non_blocking or name == "compute"
                self.name = name

            def wait_event(self, event):
                log.append(("wait", self.name, event.number))

        class Event:
            made = 0

            def __init__(self, block=False, disable_timing=False):
                Event.made += 1
                self.number, self.done = Event.made, False

            def record(self, stream):
                log.append(("record", stream.name, self.number))
                self.done = True  # the stand-in "GPU" finishes everything at once

            def synchronize(self):
                pass

        compute = Stream(name="compute")

        class Device:
            def __init__(self, index):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.cuda = type("cuda", (), {"Stream": Stream, "Event": Event, "Device": Device,
                                      "get_current_stream": staticmethod(lambda: compute)})

    def empty(self, shape, dtype):
        return np.zeros(shape, dtype).view(StandInDeviceArray)

    def empty_pinned(self, shape, dtype):  # cupyx's
        self.pinned += 1
        return np.empty(shape, dtype)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_gpu_feed_copies_on_a_side_stream_and_waits_on_events(monkeypatch, workers):
    from minidnn.data import device as feed

    cupy = StandInCupy()
    monkeypatch.setattr(minidnn.backend, "cuda_is_available", lambda: True)
    monkeypatch.setattr(minidnn.backend, "cupy", lambda: cupy)
    monkeypatch.setattr(feed, "cupyx_module", lambda: cupy)
    images, labels = images_and_labels(53, 9)
    dataset = ArrayDataset(images, labels, seed=6)
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=9, padding=2, flip=0.5)
    options = dict(batch_size=8, shuffle=True, seed=4, batch_transform=batch)
    fed = DataLoader(dataset, device="cuda", num_workers=workers, persistent_workers=workers > 0, **options)
    on_cpu = DataLoader(dataset, **options)
    for epoch in range(2):
        cupy.log.clear()
        got = list(fed)  # all kept, then compared: none was overwritten by a later copy
        for (x, y), (x_cpu, y_cpu) in zip(got, on_cpu, strict=True):
            np.testing.assert_array_equal(x.numpy(), x_cpu.numpy())
            np.testing.assert_array_equal(y.numpy(), y_cpu.numpy())
        log = cupy.log
        copies = [entry for entry in log if entry[0] == "copy"]
        assert {stream for _, stream, _ in copies} == {"side"} and len(copies) == 7  # 5 arrays a batch, one copy
        records = [entry for entry in log if entry[0] == "record"]
        copied = [number for _, stream, number in records if stream == "side"]
        # A new device slot's event: recorded on the step's stream and waited on by the side stream at once.
        allocated = [number for i, (kind, stream, number) in enumerate(log)
                     if (kind, stream) == ("record", "compute") and log[i + 1:i + 2] == [("wait", "side", number)]]
        consumed = [number for _, stream, number in records if stream == "compute" and number not in allocated]
        assert len(copied) == len(consumed) == 7 and len(allocated) == 3  # 3 device slots, made on first use
        first_copies = [i for i, entry in enumerate(log) if entry[0] == "copy"]
        for k in range(3):  # a new slot's first copy waits for the work queued on the step's stream before it
            assert log.index(("wait", "side", allocated[k])) < first_copies[k]
        for number in copied:  # the step's stream waits for each copy, after it is recorded
            assert log.index(("wait", "compute", number)) > log.index(("record", "side", number))
        for k in range(3, 7):  # a device slot is refilled only after its last batch was used (3 slots)
            wait = log.index(("wait", "side", consumed[k - 3]))
            assert log.index(("record", "compute", consumed[k - 3])) < wait < log.index(("record", "side", copied[k]))
    # One buffer a slot. A pass makes its slots once (prefetch + 3 + 1), and with workers each batch the background
    # thread prepared before the first slot existed (prefetch at most) gets one more.
    assert cupy.pinned <= 2 * (fed.prefetch + 3 + 1 + (fed.prefetch if workers else 0))


def test_without_workers_each_batch_is_gathered_straight_into_its_pinned_slot(monkeypatch):
    """The GPU feed without workers offers the dataset a free pinned slot's rows: the images are gathered there, and
    only the first batch, which lays the slots out, is copied into one."""
    from minidnn.data import device as feed

    cupy = StandInCupy()
    monkeypatch.setattr(minidnn.backend, "cuda_is_available", lambda: True)
    monkeypatch.setattr(minidnn.backend, "cupy", lambda: cupy)
    monkeypatch.setattr(feed, "cupyx_module", lambda: cupy)
    image_copies = []
    copyto = np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, src, **kw: (image_copies.append(dst.shape) if dst.ndim == 4 else None,
                                                              copyto(dst, src, **kw)))
    images, labels = images_and_labels(41, 7)
    dataset = ArrayDataset(images, labels, seed=2)
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=7, padding=1, flip=0.5)
    options = dict(batch_size=6, shuffle=True, seed=8, batch_transform=batch)
    got = list(DataLoader(dataset, device="cuda", **options))
    assert image_copies == [(6, 7, 7, 3)]
    for (x, y), (x_cpu, y_cpu) in zip(got, DataLoader(dataset, **options), strict=True):
        np.testing.assert_array_equal(x.numpy(), x_cpu.numpy())
        np.testing.assert_array_equal(y.numpy(), y_cpu.numpy())


def test_the_gpu_feed_without_workers_takes_per_sample_batches_and_a_collate_fn_too(monkeypatch):
    """A dataset that cannot gather (a per-sample transform) and a collate_fn's batch of other arrays: the slot's
    rows offered for the gather go unused, and the batches are the CPU loader's all the same."""
    from minidnn.data import device as feed

    cupy = StandInCupy()
    monkeypatch.setattr(minidnn.backend, "cuda_is_available", lambda: True)
    monkeypatch.setattr(minidnn.backend, "cupy", lambda: cupy)
    monkeypatch.setattr(feed, "cupyx_module", lambda: cupy)
    images, labels = images_and_labels(29, 5)
    for dataset, collate in [(ArrayDataset(images, labels, T.ToTensor(), seed=1), None),
                             (ArrayDataset(images, labels, seed=1), keep_strings_of_arrays)]:
        options = dict(batch_size=4, shuffle=True, seed=2, collate_fn=collate)
        got = [unflattened(batch) for batch in DataLoader(dataset, device="cuda", **options)]
        expected = [unflattened(batch) for batch in DataLoader(dataset, **options)]
        assert len(got) == len(expected) == 8
        for ours, theirs in zip(got, expected):
            assert ours.keys() == theirs.keys()
            for key in ours:
                np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def keep_strings_of_arrays(samples):
    """A collate_fn returning arrays of its own shapes (the images flattened, the labels doubled) and a name list."""
    return {"x": np.stack([np.asarray(s[0]).reshape(-1) for s in samples]),
            "y": np.array([2 * s[1] for s in samples]), "name": [f"{s[1]}" for s in samples]}


def unflattened(batch):
    """A batch (a tuple of Tensors or a collate_fn's dict) as a dict of NumPy arrays and lists."""
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    return {str(key): value.numpy() if isinstance(value, minidnn.Tensor) else np.asarray(value) for key, value in items}


# ----------------------------------------------------------------------------------------------
# The GPU feed (run on a GPU machine)
# ----------------------------------------------------------------------------------------------
def gpu_pairs(device_loader, cpu_loader):
    """Both loaders' batches, the GPU's brought back (after everything was queued: none overwritten)."""
    gpu = list(device_loader)
    return [(x.numpy(), y.numpy()) for x, y in gpu], [(x.numpy(), y.numpy()) for x, y in cpu_loader]


@pytest.mark.gpu
@pytest.mark.parametrize("transform", [None, "crop_flip"])
@pytest.mark.parametrize("workers", [0, 2])
def test_gpu_batches_are_the_cpu_batches(transform, workers):
    images, labels = images_and_labels(53, 9)
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=9, padding=2, flip=0.5) if transform else None
    dataset = ArrayDataset(images, labels, None if transform else T.ToTensor(), seed=6)
    options = dict(batch_size=8, shuffle=True, seed=4, batch_transform=batch, num_workers=workers)
    device_loader, cpu_loader = DataLoader(dataset, device="cuda", **options), DataLoader(dataset, **options)
    for _ in range(2):
        got, expected = gpu_pairs(device_loader, cpu_loader)
        assert len(got) == 7 and got[-1][0].shape[0] == 5  # the short last batch too
        for (x, y), (x_cpu, y_cpu) in zip(got, expected):
            np.testing.assert_array_equal(x, x_cpu)
            np.testing.assert_array_equal(y, y_cpu)


@pytest.mark.gpu
def test_gpu_feed_without_workers_fetches_in_the_iterating_thread():
    """num_workers=0 feeding a GPU starts no background thread (it would contend for the GIL with the training
    loop's Python), and still hands out the CPU loader's batches, one copy queued ahead."""
    import threading  # noqa: PLC0415

    images, labels = images_and_labels(37, 8)
    dataset = ArrayDataset(images, labels, seed=5)
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=8, padding=2, flip=0.5)
    options = dict(batch_size=6, shuffle=True, seed=3, batch_transform=batch)
    expected = list(DataLoader(dataset, **options))
    got = []
    for x, y in DataLoader(dataset, device="cuda", **options):
        assert not any(t.name == "minidnn-data" for t in threading.enumerate())
        got.append((x.numpy(), y.numpy()))
    assert len(got) == len(expected) == 7
    for (x, y), (x_cpu, y_cpu) in zip(got, expected):
        np.testing.assert_array_equal(x, x_cpu.numpy())
        np.testing.assert_array_equal(y, y_cpu.numpy())


@pytest.mark.gpu
def test_gpu_feed_waits_for_the_compute_stream_on_the_device():
    """The step's stream far behind the host (held 20 ms before every batch): each copy into a device slot must
    wait for the slot's last use, and each batch for its copy, on the device, or batches come out mixed."""
    from minidnn.primitives import _cuda

    images, labels = images_and_labels(64, 8)
    dataset = ArrayDataset(images, labels, seed=2)
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=8, padding=1, flip=0.5)
    sums = []
    for x, y in DataLoader(dataset, batch_size=4, shuffle=True, seed=1, device="cuda", batch_transform=batch):
        _cuda.hold_stream(20)
        sums.append((x.data.sum(axis=(1, 2, 3)), y.data * 1))
    expected = list(DataLoader(dataset, batch_size=4, shuffle=True, seed=1, batch_transform=batch))
    for (x_sum, y), (x_cpu, y_cpu) in zip(sums, expected):
        np.testing.assert_allclose(x_sum.get(), x_cpu.numpy().sum(axis=(1, 2, 3)), rtol=1e-5)
        np.testing.assert_array_equal(y.get(), y_cpu.numpy())


@pytest.mark.gpu
def test_a_new_device_slot_waits_for_the_work_queued_on_its_memory():
    """The pool hands a new device slot memory freed on the step's stream while kernels queued there still
    write it (here: fills held back 200 ms). The side stream's copy into the slot must wait for them, or they
    overwrite the batch: labels of -1 made a captured ResNet-20 step's loss NaN on the H200."""
    from minidnn.primitives import _cuda

    cupy = minidnn.backend.cupy()
    images, labels = images_and_labels(16, 8)
    dataset = ArrayDataset(images, labels, seed=2)
    expected = [(x.numpy(), y.numpy()) for x, y in DataLoader(dataset, batch_size=4)]
    list(DataLoader(dataset, batch_size=4, device="cuda"))  # pinned memory in CuPy's pool: no cudaHostAlloc
    _cuda.hold_stream(1)  # and every kernel below compiled: the fills must be queued well within the hold
    for dtype, value in [(np.int64, -1), (np.uint8, 255)]:
        cupy.empty(1, dtype).fill(value)
    cupy.cuda.Device().synchronize()
    _cuda.hold_stream(200)
    poisoned = [cupy.empty(shape, dtype) for shape, dtype in [((4, 8, 8, 3), np.uint8), ((4,), np.int64)] * 64]
    for array in poisoned:
        array.fill(-1 if array.dtype == np.int64 else 255)  # queued behind the hold
    del poisoned, array  # free in the pool now, still to be written on the device
    got = [(x.numpy(), y.numpy()) for x, y in DataLoader(dataset, batch_size=4, device="cuda")]
    for (x, y), (x_cpu, y_cpu) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(y, y_cpu)
        np.testing.assert_array_equal(x, x_cpu)


@pytest.mark.gpu
def test_pin_memory_gives_page_locked_batches():
    from minidnn.data.device import is_pinned

    images, labels = images_and_labels()
    for x, y in DataLoader(ArrayDataset(images, labels), batch_size=4, pin_memory=True):
        assert is_pinned(x.data) and is_pinned(y.data) and not x.is_cuda


@pytest.mark.gpu
def test_a_captured_step_trains_on_the_gpu_feed_as_the_eager_step_on_cpu_batches():
    from minidnn.cuda import graphs

    images, labels = images_and_labels(48, 8)
    dataset = ArrayDataset(images, labels, seed=3)
    batch = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=8, padding=2, flip=0.5)

    def train(device_feed):
        minidnn.manual_seed(0)
        model = minidnn.nn.Sequential(minidnn.nn.Conv2d(3, 4, 3, padding=1), minidnn.nn.ReLU(), minidnn.nn.Flatten(),
                                      minidnn.nn.Linear(4 * 64, 5)).to("cuda")
        optimizer = minidnn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            loss = minidnn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss

        loader = DataLoader(dataset, batch_size=8, shuffle=True, seed=5, batch_transform=batch,
                            device="cuda" if device_feed else None)
        captured = None
        for _ in range(2):
            for x, y in loader:
                x, y = x.to("cuda"), y.to("cuda")
                if not device_feed:
                    step(x, y)
                elif captured is None:
                    captured = graphs.capture(step, (x, y), warmup=1)
                else:
                    captured(x, y)
        assert not device_feed or isinstance(captured, graphs.CapturedStep)
        return [p.numpy() for p in model.parameters()]

    for fed, eager in zip(train(True), train(False)):
        np.testing.assert_allclose(fed, eager, rtol=1e-4, atol=1e-5)
