"""DataLoader: a dataset's batches in a new shuffled order every epoch, prepared in the background while
the training step runs, on the CPU or fed to a GPU.

**Epochs.** Each iteration (``for batch in loader``) is the next epoch, as in PyTorch: the order of
epoch ``e`` is a permutation drawn from ``(seed, e)``, and each sample's augmentation draws from
``(dataset seed, e, index)``. ``set_epoch(e)`` selects the epoch the next iteration uses, and
``iterate(start_batch)`` starts it part-way, so a run that stopped anywhere resumes with exactly the
batches it would have had. The seed is ``seed=``, or drawn once, when the loader is made, from
``generator=`` or from minidnn's global generator (:func:`minidnn.manual_seed`): two loaders made
after the same ``manual_seed`` give the same orders.

**Sampler.** ``sampler=`` (PyTorch's: any iterable of dataset indices with a ``len()``, such as
:class:`minidnn.distributed.DistributedSampler`, a list or a ``range``) gives the order instead:
each iteration batches what iterating the sampler gives then, so a sampler that reshuffles per epoch
is told the epoch by its user (``sampler.set_epoch(e)`` before the epoch, as in PyTorch); the loader's
own epoch still selects the augmentation draws. A sampler and ``shuffle=True`` exclude each other.

**Where samples are fetched.** ``num_workers=0`` (the default): in this process, which is the fast path
for in-memory datasets (:class:`~minidnn.data.ArrayDataset`, so CIFAR, MNIST, shapes10): without a
per-sample transform a batch is one gather from the arrays (``get_batch``), and a worker process would
cost more (a pickled copy of the whole array at start, then every batch through shared memory) than that
gather does (measured in benchmarks/results/2026-12-02-cpu-input-pipeline/). Feeding a GPU, the iterating
thread fetches each batch itself, one ahead, as PyTorch's ``num_workers=0`` does: a background thread would
contend for the GIL with the training loop's Python, whose step the GPU waits on
(benchmarks/results/2026-12-06-h100-train-loop-bias-one-launch/). On the CPU, one background thread
prepares the batches while the step runs (NumPy's kernels let go of the GIL). ``num_workers=N``: N worker
processes (:mod:`minidnn.data.workers`) fetch whole batches, which is what decoding image files
needs: Pillow's decoding and the per-sample transforms run in parallel, outside this process's GIL.
``persistent_workers=True`` keeps them between epochs.

**Batch transform.** ``batch_transform=transforms.CropFlipNormalize(...)`` augments and normalises a
whole uint8 batch at once instead of each sample: its random choices are drawn on the host from each
sample's own generator (for ``_DRAW_AHEAD`` batches at once), and the work is one primitive call, on the GPU
when the loader feeds one. The dataset then returns raw uint8 HWC images (no ``transform``).

**GPU.** ``DataLoader(..., device="cuda")`` returns batches already on the GPU: they are assembled in
page-locked host buffers and copied on a side stream while the previous step runs
(:mod:`minidnn.data.device`); the batch transform then runs on the device. The device is a loader
option rather than a wrapper around a loader because the loader is what knows when a host buffer
may be refilled and what must run after the copy (the batch transform): a wrapper would have to copy
each batch into pinned memory once more, or reach into the loader's buffers. ``pin_memory=True``
without a device gives CPU batches in page-locked memory, as PyTorch's does (for the caller's own
asynchronous copies).
"""
from __future__ import annotations

import collections
import queue
import threading
import warnings
from typing import Any, Callable, Iterator

import numpy as np

from .. import backend
from .. import random as _random
from ..tensor import Tensor
from .batch import default_collate, fetch, unflatten
from .dataset import Dataset
from .device import DeviceFeeder, HostBatch, pinned_copy
from .workers import DEFAULT_START_METHOD, START_METHODS, WorkerPool

__all__ = ["DataLoader", "default_collate"]

_POLL_SECONDS = 0.1   # how often a wait checks that the background thread is still there
_JOIN_SECONDS = 1.0   # how long closing an iteration waits for the background thread
_DEPTH = 3            # device slots: copies in flight at most
_DRAW_AHEAD = 32      # batches whose batch-transform draws are made together (see _DrawsAhead)


def _check_count(name: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _seed_from(generator: Any) -> int:
    """A seed drawn from ``generator`` (a minidnn or NumPy generator), or from minidnn's global one."""
    source = _random.default_generator if generator is None else generator
    if isinstance(source, _random.Generator):
        source = source.numpy
    if not isinstance(source, np.random.Generator):
        raise TypeError(f"generator must be a minidnn.random.Generator or a numpy.random.Generator, "
                        f"got {type(generator).__name__}")
    return int(source.integers(0, 2**63))


class DataLoader:
    """``DataLoader(dataset, batch_size=1, shuffle=False, drop_last=False, seed=None, num_workers=0,
    prefetch=2, collate_fn=None, *, sampler=None, generator=None, pin_memory=False, device=None,
    batch_transform=None, persistent_workers=False, multiprocessing_context=None)``; see the module docstring.

    ``sampler``: the order of the indices (see the module docstring); ``len(loader)`` then counts the
    sampler's indices, not the dataset's.

    ``prefetch``: batches prepared ahead (and, with workers, queued per worker). ``collate_fn``: turns a
    list of samples into a batch (default: :func:`default_collate`, a tuple of Tensors).
    ``multiprocessing_context``: how worker processes start, ``"forkserver"`` (the default where the
    platform has it) or ``"spawn"`` (see :mod:`minidnn.data.workers`).
    """

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int | None = None, num_workers: int = 0, prefetch: int = 2,
                 collate_fn: Callable[[list[Any]], Any] | None = None, *, sampler: Any = None, generator: Any = None,
                 pin_memory: bool = False, device: Any = None, batch_transform: Any = None,
                 persistent_workers: bool = False, multiprocessing_context: str | None = None) -> None:
        _check_count("batch_size", batch_size, 1)
        _check_count("num_workers", num_workers, 0)
        _check_count("prefetch", prefetch, 1)
        if len(dataset) == 0:
            raise ValueError("dataset is empty")
        if sampler is not None:
            if shuffle:
                raise ValueError("sampler option is mutually exclusive with shuffle: give sampler= (which sets the "
                                 "order) or shuffle=True (the loader's own permutation), not both")
            if not hasattr(sampler, "__iter__") or not hasattr(sampler, "__len__"):
                raise TypeError(f"sampler must be an iterable of dataset indices with a len(), such as "
                                f"DistributedSampler, a list or a range; got {type(sampler).__name__}")
        if seed is not None and generator is not None:
            raise ValueError("give seed or generator, not both (the seed is drawn from the generator)")
        if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0):
            raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
        if batch_transform is not None and not (callable(batch_transform) and hasattr(batch_transform, "parameters")):
            raise TypeError(f"batch_transform must be a batch transform such as transforms.CropFlipNormalize "
                            f"(callable, with a parameters() method), got {batch_transform!r}")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers=True needs num_workers > 0")
        if multiprocessing_context is not None and multiprocessing_context not in START_METHODS:
            raise ValueError(f"multiprocessing_context must be one of {', '.join(START_METHODS)} (never 'fork', which "
                             f"copies this process mid-way through its threads), got {multiprocessing_context!r}")
        self.multiprocessing_context = multiprocessing_context or DEFAULT_START_METHOD
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, bool(shuffle), drop_last
        self.sampler = sampler
        self.num_workers, self.prefetch, self.collate_fn = num_workers, prefetch, collate_fn
        self.batch_transform, self.persistent_workers = batch_transform, persistent_workers
        # Drawn now, once: the order then depends on the seed and the epoch only (resume, two loaders alike).
        self.seed = int(seed) if seed is not None else (_seed_from(generator) if self.shuffle else 0)
        self.device = None if device is None else backend.device(device)
        if self.device is not None and self.device.type == "cpu":
            self.device = None
        if self.device is not None and not backend.cuda_is_available():
            raise ValueError(f"device={str(self.device)!r} needs a CUDA GPU and CuPy (pip install -e '.[cuda13]')")
        self.pin_memory = bool(pin_memory)
        if self.pin_memory and self.device is None and not backend.cuda_is_available():
            warnings.warn("pin_memory=True, but there is no CUDA GPU: batches stay in ordinary memory", stacklevel=2)
            self.pin_memory = False
        self.epoch = 0  # the epoch the next iteration uses
        self._pool: WorkerPool | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffled order (and augmentation draws) the next iteration uses; the
        iterations after it go on from there (epoch + 1, ...)."""
        if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = int(epoch)

    def __len__(self) -> int:
        full, rest = divmod(len(self.dataset) if self.sampler is None else len(self.sampler), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def batch_indices(self, epoch: int | None = None) -> list[np.ndarray]:
        """The index arrays of epoch ``epoch``'s batches (default: the next iteration's), in order. With a
        sampler, the order is what iterating the sampler gives now, whatever ``epoch`` is (its own
        ``set_epoch`` chooses its epoch)."""
        epoch = self.epoch if epoch is None else epoch
        if self.sampler is not None:
            order = self._sampled_order()
        elif self.shuffle:
            order = np.random.default_rng((self.seed, epoch)).permutation(len(self.dataset))
        else:
            order = np.arange(len(self.dataset))
        return [order[start:start + self.batch_size] for start in range(0, len(self) * self.batch_size, self.batch_size)]

    def _sampled_order(self) -> np.ndarray:
        """The sampler's indices as an int64 array, checked: as many as its len() says (the loader's length,
        and so a resumed position, counts on it), each an index of the dataset."""
        order = np.fromiter((int(index) for index in self.sampler), dtype=np.int64)
        if order.size != len(self.sampler):
            raise ValueError(f"the sampler gave {order.size} indices, but its len() is {len(self.sampler)}")
        size = len(self.dataset)
        if order.size and (order.min() < 0 or order.max() >= size):
            bad = order[(order < 0) | (order >= size)][0]
            raise ValueError(f"the sampler gave index {bad}, outside the dataset's range 0..{size - 1}")
        return order

    def __iter__(self) -> Iterator[Any]:
        return self.iterate()

    def iterate(self, start_batch: int = 0) -> Iterator[Any]:
        """The next epoch's batches from number ``start_batch`` on (resuming mid-epoch skips the rest unread).
        The epoch is taken now, when the iterator is made."""
        _check_count("start_batch", start_batch, 0)
        epoch, self.epoch = self.epoch, self.epoch + 1
        return self._iteration(epoch, self.batch_indices(epoch)[start_batch:])

    def close(self) -> None:
        """End persistent worker processes now (they also end with the loader, and at exit)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, modules may be half gone
            pass

    # --- one pass ---------------------------------------------------------------------------------
    def _workers(self) -> WorkerPool | None:
        if self.num_workers == 0:
            return None
        if self._pool is None or self._pool.closed:
            self._pool = WorkerPool(self.dataset, self.num_workers, self.collate_fn, self.prefetch,
                                    self.multiprocessing_context)
        return self._pool

    def _iteration(self, epoch: int, batches: list[np.ndarray]) -> Iterator[Any]:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        pool = self._workers()
        feeder = None if self.device is None else DeviceFeeder(self.device, slots=self.prefetch + _DEPTH + 1,
                                                               depth=_DEPTH)
        draws = None if self.batch_transform is None else _DrawsAhead(self.batch_transform, self.dataset, batches)
        if pool is None and feeder is not None:
            try:
                yield from self._fed_here(batches, feeder, draws)
            finally:
                feeder.close()
            return
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        producer = threading.Thread(target=self._produce, args=(epoch, batches, pool, feeder, ready, stop, draws),
                                    name="minidnn-data", daemon=True)
        producer.start()
        try:
            if feeder is None:
                while True:
                    kind, item = self._next(ready, producer, None)
                    if kind == "done":
                        return
                    if kind == "error":
                        raise item
                    yield item
            yield from self._fed(ready, producer, feeder)
        finally:
            stop.set()
            producer.join(_JOIN_SECONDS)  # one stuck in a read (num_workers=0) is left behind: a daemon thread
            if feeder is not None:
                feeder.close()
            if pool is not None and not self.persistent_workers:
                pool.shutdown()
                self._pool = None

    def _fed(self, ready: queue.Queue, producer: threading.Thread, feeder: DeviceFeeder) -> Iterator[Any]:
        """The device batches: batch i + 1's copy is queued before batch i is handed out, so it overlaps step i."""
        pending: collections.deque = collections.deque()

        def start(entry: tuple) -> Any:
            return feeder.start_copy(entry[1]) if entry[0] == "batch" else entry

        while True:
            if not pending:
                pending.append(start(self._next(ready, producer, feeder)))
            if len(pending) == 1 and not isinstance(pending[0], tuple):
                try:
                    pending.append(start(ready.get_nowait()))
                except queue.Empty:
                    pass
            head = pending.popleft()
            if isinstance(head, tuple):
                if head[0] == "done":
                    return
                raise head[1]
            arrays = feeder.finish(head, self.batch_transform)
            yield unflatten(arrays, head.batch.tree)

    def _fed_here(self, batches: list[np.ndarray], feeder: DeviceFeeder, draws: "_DrawsAhead | None") -> Iterator[Any]:
        """num_workers=0 feeding a GPU: each batch fetched and pinned by the iterating thread itself, as PyTorch's
        num_workers=0 loads in the main process, with batch i + 1's copy queued before batch i is handed out. A
        background thread would take the GIL from the training loop while the loop's Python issues the step: every
        launch lets it in, and the loop then waits for it to let go. What a batch costs this thread here is its
        gather, straight into a free pinned slot, the batch transform's draws and the copy queued, no more."""
        stop = threading.Event()  # never set: nothing here waits on another thread

        def copies() -> Iterator[Any]:
            for indices in batches:
                feeder.wait_for_slot()
                slot = feeder.take_free()  # None for the first batch, which lays the slots out
                into = None if slot is None else slot.rows((len(indices),) * len(slot.arrays))
                arrays, tree = fetch(self.dataset, indices, self.collate_fn, into=into)
                yield feeder.start_copy(self._prepare(_Fetched(arrays, tree, None), indices, feeder, stop, draws, slot))

        queued = copies()
        ahead = next(queued, None)
        while ahead is not None:
            current, ahead = ahead, next(queued, None)
            yield unflatten(feeder.finish(current, self.batch_transform), current.batch.tree)

    @staticmethod
    def _next(ready: queue.Queue, producer: threading.Thread, feeder: DeviceFeeder | None) -> tuple:
        while True:
            if feeder is not None:
                feeder.wait_for_slot()
            try:
                return ready.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not producer.is_alive() and ready.empty():
                    return "error", RuntimeError("the DataLoader's background thread ended without its batches")

    def _produce(self, epoch: int, batches: list[np.ndarray], pool: WorkerPool | None, feeder: DeviceFeeder | None,
                 ready: queue.Queue, stop: threading.Event, draws: "_DrawsAhead | None") -> None:
        """The background thread: fetch, transform (on the CPU) or pin (for the GPU), hand on in order."""

        def put(entry: tuple) -> bool:
            while not stop.is_set():  # a timeout, so that a consumer gone away never blocks this thread
                try:
                    ready.put(entry, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            fetched = pool.batches(epoch, batches, stop) if pool is not None else self._fetch_here(batches)
            for indices, batch in zip(batches, fetched):
                if stop.is_set() or not put(("batch", self._prepare(batch, indices, feeder, stop, draws))):
                    return
            put(("done", None))
        except BaseException as error:  # noqa: BLE001 - every error reaches the consumer, with its file name
            put(("error", error))

    def _fetch_here(self, batches: list[np.ndarray]) -> Iterator[Any]:
        """num_workers=0: each batch in this thread, one gather when the dataset can (ArrayDataset.get_batch)."""
        for indices in batches:
            arrays, tree = fetch(self.dataset, indices.tolist(), self.collate_fn)
            yield _Fetched(arrays, tree, None)

    def _prepare(self, batch: Any, indices: np.ndarray, feeder: DeviceFeeder | None, stop: threading.Event,
                 draws: "_DrawsAhead | None" = None, slot: Any = None) -> Any:
        """A fetched batch made ready: for the GPU a HostBatch in a pinned slot (``slot``, the one it was gathered
        into, else a free one), else the batch itself."""
        arrays, extra = list(batch.arrays), 0
        if self.batch_transform is not None:
            if not arrays or arrays[0].ndim != 4 or arrays[0].dtype != np.uint8:
                raise ValueError("batch_transform works on the batch's first array, uint8 images (N, H, W, C); "
                                 f"this batch's is {arrays[0].dtype if arrays else 'missing'} "
                                 f"{tuple(arrays[0].shape) if arrays else ''} (give the dataset no transform)")
            parameters = draws(indices, arrays[0].shape) if draws is not None else \
                self.batch_transform.parameters(self.dataset, indices, arrays[0].shape)
            arrays, extra = [*arrays, *parameters], len(parameters)
        if feeder is not None:
            host, slot = feeder.fill(arrays, stop, slot)
            if slot is None and batch.release is not None:  # out of the worker's memory before it is reused
                host = [np.array(a) for a in host]
            if batch.release is not None:
                batch.release()
            return HostBatch(host, batch.tree, extra, slot)
        fresh = 0  # leading arrays made here, in no worker's shared memory
        if extra:
            kept = arrays[:len(arrays) - extra]
            arrays, fresh = [self.batch_transform(kept[0], *arrays[len(kept):]), *kept[1:]], 1
        if self.pin_memory:
            arrays = [pinned_copy(a) for a in arrays]
        elif batch.release is not None:  # out of the worker's memory before it is reused
            arrays = arrays[:fresh] + [np.array(a) for a in arrays[fresh:]]
        if batch.release is not None:
            batch.release()
        return unflatten(arrays, batch.tree, Tensor)


class _DrawsAhead:
    """A pass's batch-transform parameters, drawn ``_DRAW_AHEAD`` batches at a time: each sample's draws come from its
    own generator, so a chunk's draws are its batches' draws, and drawing them together costs little more than one
    batch's (NumPy's fixed cost per call, not the samples, sets a batch's time). Asked for the pass's batches in
    order; a batch that is not the next one expected is drawn alone, and one whose images differ in size from the
    chunk's (the draws depend on it) begins a new chunk."""

    def __init__(self, transform: Any, dataset: Any, batches: list[np.ndarray]) -> None:
        self.transform, self.dataset, self.batches = transform, dataset, batches
        self.position = 0  # the pass's next batch
        self.ahead: collections.deque = collections.deque()  # drawn parameters of the batches from position on
        self.shape: tuple | None = None  # the image size the chunk was drawn for

    def __call__(self, indices: np.ndarray, shape: tuple) -> tuple:
        expected = self.position < len(self.batches) and self.batches[self.position] is indices
        if not expected or (self.ahead and tuple(shape[1:3]) != self.shape):
            self.ahead.clear()
            if not expected:
                return self.transform.parameters(self.dataset, indices, shape)
        if not self.ahead:
            chunk = self.batches[self.position:self.position + _DRAW_AHEAD]
            drawn = self.transform.parameters(self.dataset, np.concatenate(chunk), shape)
            ends = np.cumsum([len(b) for b in chunk])[:-1]
            self.ahead.extend(zip(*(np.split(array, ends) for array in drawn)))
            self.shape = tuple(shape[1:3])
        self.position += 1
        return self.ahead.popleft()


class _Fetched:
    """A batch as fetched: its arrays, its structure, and (from a worker) how to free its shared memory."""

    __slots__ = ("arrays", "tree", "release")

    def __init__(self, arrays: list[np.ndarray], tree: Any, release: Callable[[], None] | None) -> None:
        self.arrays, self.tree, self.release = arrays, tree, release
