"""minidnn.distributed: buckets, the sampler, the launcher, the backends, DDP against one process on the global batch.

The collectives and their failures run in-process, ranks as threads over real sockets; DDP runs as two processes
started by the launcher (this file is also their script: ``python tests/test_distributed.py SCENARIO OUT``),
against the same training done here by one process on the global batch. GPU tests (``gpu``) and tests that need
two GPUs or more (``multigpu``) start their ranks the same way.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # as a rank's script, run from tests/

import minidnn  # noqa: E402
import minidnn.distributed as dist  # noqa: E402
import minidnn.functional as F  # noqa: E402
import minidnn.nn as nn  # noqa: E402
from minidnn import optim  # noqa: E402
from minidnn.distributed import buckets, run  # noqa: E402
from minidnn.distributed.run import free_port  # noqa: E402
from minidnn.distributed.process_group import ReduceOp  # noqa: E402
from minidnn.distributed.sampler import shard  # noqa: E402
from minidnn.distributed.store import TCPStore  # noqa: E402
from minidnn.distributed.tcp import TcpProcessGroup  # noqa: E402


@pytest.fixture(autouse=True)
def _multigpu(request):
    """``@pytest.mark.multigpu``: skipped unless this machine has two GPUs or more."""
    if request.node.get_closest_marker("multigpu") and minidnn.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs or more")


# ----------------------------------------------------------------------------------------------
# Shared by the ranks and the reference: models and data
# ----------------------------------------------------------------------------------------------
GLOBAL_SAMPLES, PER_RANK_BATCH, EPOCHS = 16, 4, 2


def tiny_model(seed: int, norm: type | None = None) -> nn.Module:
    """A conv net small enough for many processes on two cores: (N, 3, 6, 6) -> (N, 5)."""
    minidnn.manual_seed(seed)
    layers = [nn.Conv2d(3, 4, 3, padding=1)] + ([norm(4)] if norm else []) + \
        [nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 5)]
    return nn.Sequential(*layers).double()


def dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((GLOBAL_SAMPLES, 3, 6, 6)), rng.integers(0, 5, GLOBAL_SAMPLES)


def make_optimizer(model: nn.Module) -> optim.SGD:
    return optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def flat_parameters(model: nn.Module) -> np.ndarray:
    return np.concatenate([p.numpy().ravel() for p in model.parameters()])


def state_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    return {key: value.numpy().copy() for key, value in model.state_dict().items()}


def step_batches(epoch: int, world_size: int) -> list[list[np.ndarray]]:
    """For each step of ``epoch``: each rank's batch indices, from its DistributedSampler shard."""
    shards = []
    for rank in range(world_size):
        sampler = dist.DistributedSampler(range(GLOBAL_SAMPLES), num_replicas=world_size, rank=rank, seed=3)
        sampler.set_epoch(epoch)
        shards.append(np.array(list(sampler)))
    steps = len(shards[0]) // PER_RANK_BATCH
    return [[s[k * PER_RANK_BATCH:(k + 1) * PER_RANK_BATCH] for s in shards] for k in range(steps)]


def train_one_process(model: nn.Module, world_size: int) -> list[float]:
    """The reference: one process, each step on the ranks' batches together (the global batch)."""
    x, y = dataset()
    optimizer = make_optimizer(model)
    losses = []
    for epoch in range(EPOCHS):
        for per_rank in step_batches(epoch, world_size):
            batch = np.concatenate(per_rank)
            loss = F.cross_entropy(model(minidnn.tensor(x[batch])), minidnn.tensor(y[batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


class Heads(nn.Module):
    """A trunk and three heads: ``a`` used by every rank, ``b`` by rank 0 only, ``c`` by none."""

    def __init__(self) -> None:
        super().__init__()
        minidnn.manual_seed(11)
        self.trunk, self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 3), nn.Linear(6, 1), nn.Linear(6, 1)

    def forward(self, x, use_b):
        h = F.relu(self.trunk(x))
        out = self.a(h).sum()
        return out + self.b(h).sum() if use_b else out


# ----------------------------------------------------------------------------------------------
# The ranks' side: python tests/test_distributed.py SCENARIO OUT
# ----------------------------------------------------------------------------------------------
def save(out: str, name: str, **arrays) -> None:
    np.savez(os.path.join(out, f"{name}-rank{dist.get_rank()}.npz"), **arrays)


def rank_training(out: str) -> None:
    """DDP from different initial weights (the broadcast must fix them), sampler shards, several small buckets."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = tiny_model(seed=100 + rank)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=400 / 2**20)  # ~400 bytes: several buckets
    optimizer = make_optimizer(ddp)
    x, y = dataset()
    losses = []
    for epoch in range(EPOCHS):
        for per_rank in step_batches(epoch, world_size):
            batch = per_rank[rank]
            loss = F.cross_entropy(ddp(minidnn.tensor(x[batch])), minidnn.tensor(y[batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    save(out, "training", losses=np.array(losses), **state_arrays(model))
    with open(os.path.join(out, f"buckets-rank{rank}.json"), "w") as file:
        json.dump(ddp.bucket_names(), file)


def rank_no_sync(out: str) -> None:
    """Two micro-batches under no_sync (local sums), a third synchronised: the mean of the sums."""
    rank = dist.get_rank()
    model = tiny_model(seed=0)
    ddp = dist.DistributedDataParallel(model)
    x, y = dataset()
    micro = [np.arange(rank * 2 + 4 * k, rank * 2 + 4 * k + 2) for k in range(3)]  # rank r: 2 of each 4
    with ddp.no_sync():
        for batch in micro[:2]:
            F.cross_entropy(ddp(minidnn.tensor(x[batch])), minidnn.tensor(y[batch])).backward()
    local = {f"local.{name}": p.grad.numpy().copy() for name, p in model.named_parameters()}
    F.cross_entropy(ddp(minidnn.tensor(x[micro[2]])), minidnn.tensor(y[micro[2]])).backward()
    save(out, "no_sync", **local, **{f"synced.{name}": p.grad.numpy() for name, p in model.named_parameters()})


class FusedNormNet(nn.Module):
    """Conv, batch norm with its fused ReLU (the form the models use), pooling and a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        minidnn.manual_seed(5)
        self.conv, self.norm, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(F.flatten(F.adaptive_avg_pool2d(self.norm(self.conv(x), relu=True), 1), 1))


def rank_sync_batchnorm(out: str) -> None:
    """SyncBatchNorm: training steps (vs batch norm on the global batch), then shards of unequal sizes."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = dist.SyncBatchNorm.convert_sync_batchnorm(FusedNormNet().double())
    ddp = dist.DistributedDataParallel(model)
    optimizer = make_optimizer(ddp)
    x, y = dataset()
    for per_rank in step_batches(0, world_size):
        batch = per_rank[rank]
        loss = F.cross_entropy(ddp(minidnn.tensor(x[batch])), minidnn.tensor(y[batch]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # Unequal shards: rank 0 has 3 samples, rank 1 has 5; y·weights summed, so the reference sums too.
    norm = dist.SyncBatchNorm(4).double()
    norm.weight.data[...] = np.linspace(0.5, 2.0, 4)
    rng = np.random.default_rng(9)
    inputs, weights = rng.standard_normal((8, 4, 3, 2)) * 3 + 1, rng.standard_normal((8, 4, 3, 2))
    part = slice(0, 3) if rank == 0 else slice(3, 8)
    piece = minidnn.tensor(inputs[part], requires_grad=True)
    output = norm(piece)
    (output * minidnn.tensor(weights[part])).sum().backward()
    save(out, "sync_batchnorm", y=output.numpy(), dx=piece.grad.numpy(), dweight=norm.weight.grad.numpy(),
         running_mean=norm.running_mean.numpy(), running_var=norm.running_var.numpy(), **state_arrays(model))


def rank_unused(out: str) -> None:
    """find_unused_parameters with a head only rank 0 uses and one no rank uses; then the default mode's error."""
    rank = dist.get_rank()
    model = Heads().double()
    ddp = dist.DistributedDataParallel(model, find_unused_parameters=True)
    x = np.random.default_rng(4).standard_normal((4, 4))
    ddp(minidnn.tensor(x[rank * 2:rank * 2 + 2]), use_b=rank == 0).backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}
    strict = dist.DistributedDataParallel(Heads().double())
    strict(minidnn.tensor(x[:2]), use_b=False).backward()
    try:
        strict(minidnn.tensor(x[:2]), use_b=False)
        message = ""
    except RuntimeError as error:
        message = str(error)
    save(out, "unused", message=np.array(message), **grads)


def rank_buffers(out: str) -> None:
    """broadcast_buffers: a forward that synchronises brings rank 0's running statistics; one under no_grad not."""
    rank = dist.get_rank()
    model = tiny_model(seed=0, norm=lambda channels: nn.BatchNorm2d(channels, momentum=0.0))
    ddp = dist.DistributedDataParallel(model)
    norm = model[1]
    norm.running_mean.data[...] = rank + 1.0  # the ranks' statistics drift apart
    x = minidnn.tensor(dataset()[0][:4])
    with minidnn.no_grad():
        ddp(x)
    after_no_grad = norm.running_mean.numpy().copy()
    ddp(x)
    save(out, "buffers", after_no_grad=after_no_grad, after_forward=norm.running_mean.numpy())


def rank_mismatch(out: str) -> None:
    """Models of the same parameter count but other shapes (4x6 against 6x4): every rank refuses to wrap them."""
    rank = dist.get_rank()
    model = nn.Linear(4, 6, bias=False) if rank == 0 else nn.Linear(6, 4, bias=False)
    try:
        dist.DistributedDataParallel(model.double())
        refused = ""
    except ValueError as error:
        refused = str(error)
    save(out, "mismatch", refused=np.array(refused))


def rank_script(scenarios: list[str], out: str) -> None:
    dist.init_process_group("tcp", timeout=60)
    try:
        for scenario in scenarios:
            SCENARIOS[scenario](out)
    finally:
        dist.destroy_process_group()


SCENARIOS = {"training": rank_training, "no_sync": rank_no_sync, "sync_batchnorm": rank_sync_batchnorm,
             "unused": rank_unused, "buffers": rank_buffers, "mismatch": rank_mismatch}


def launch(tmp_path, scenarios, nproc=2, script_args=()):
    """Start ``nproc`` ranks of this file through the launcher (in this process); returns their exit code."""
    environment = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with _environment(environment):
        return run.main(["--nproc-per-node", str(nproc), "--master-port", str(free_port()), __file__,
                         ",".join(scenarios), str(tmp_path), *script_args])


@contextlib.contextmanager
def _environment(values):
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load(tmp_path, name, rank):
    with np.load(tmp_path / f"{name}-rank{rank}.npz", allow_pickle=False) as arrays:
        return {key: arrays[key] for key in arrays.files}


# ----------------------------------------------------------------------------------------------
# Buckets
# ----------------------------------------------------------------------------------------------
def test_bucket_assignment_matches_torch_on_random_sizes_and_dtypes(rng):
    torch = pytest.importorskip("torch")
    from torch import distributed as torch_dist  # noqa: PLC0415

    for _ in range(40):
        count = int(rng.integers(1, 25))
        tensors = [torch.empty(int(n), dtype=torch.float32 if rng.random() < 0.7 else torch.float64)
                   for n in rng.integers(1, 700, count)]
        limits = sorted(int(v) for v in rng.integers(50, 5000, int(rng.integers(1, 3))))
        theirs = torch_dist._compute_bucket_assignment_by_size(tensors, limits, [False] * count)[0]
        ours = buckets.compute_bucket_assignment_by_size([t.numel() * t.element_size() for t in tensors], limits,
                                                         [t.dtype for t in tensors])
        assert ours == [list(bucket) for bucket in theirs]


def test_bucket_boundaries_near_the_cap():
    assign = buckets.compute_bucket_assignment_by_size
    assert assign([40, 60, 1], [100]) == [[0, 1], [2]]  # reaching the cap exactly closes the bucket
    assert assign([40, 59, 1, 5], [100]) == [[0, 1, 2], [3]]  # one byte short: the next tensor joins
    assert assign([250, 10, 10], [100]) == [[0], [1, 2]]  # a tensor over the cap is a bucket of its own
    assert assign([30, 30, 30, 30], [50, 100]) == [[0, 1], [2, 3]]  # the first limit, then the second
    assert assign([4, 8, 4, 8], [10], keys=["f", "d", "f", "d"]) == [[0, 2], [1, 3]]  # one dtype per bucket
    assert buckets.bucket_size_limits(None) == [2**20, 25 * 2**20]
    assert buckets.bucket_size_limits(2) == [2 * 2**20]
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        buckets.bucket_size_limits(0)


def local_group() -> TcpProcessGroup:
    """A world of one: the tcp backend without peers (DDP's whole machinery, nothing to combine)."""
    return TcpProcessGroup(store=None, rank=0, size=1, timeout=5.0)


def test_ddp_buckets_reverse_the_registration_order_and_keep_it_within():
    model = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 100), nn.Linear(100, 10)).double()
    sizes = {name: p.data.nbytes for name, p in model.named_parameters()}  # 80000, 800, 80000, 800, 8000, 80
    ddp = dist.DistributedDataParallel(model, process_group=local_group(), bucket_cap_mb=80800 / 2**20)
    assert ddp.bucket_names() == [["2.weight", "2.bias"], ["1.weight", "1.bias"], ["0.weight", "0.bias"]]
    default = dist.DistributedDataParallel(model, process_group=local_group())
    assert default.bucket_names() == [list(sizes)]  # all 170 KB fit in the 1 MiB first bucket
    # The default's small first bucket holds the first layers (reduced last), the rest the later ones.
    big = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(6)])  # 256 KiB each
    names = dist.DistributedDataParallel(big, process_group=local_group()).bucket_names()
    assert names == [["4.weight", "5.weight"], ["0.weight", "1.weight", "2.weight", "3.weight"]]


# ----------------------------------------------------------------------------------------------
# DDP in one process (a world of one): views, hooks, no_sync, unused parameters
# ----------------------------------------------------------------------------------------------
def test_ddp_gradients_are_views_of_the_buckets_and_equal_the_plain_ones():
    x, y = dataset()
    plain, wrapped = tiny_model(0), tiny_model(0)
    ddp = dist.DistributedDataParallel(wrapped, process_group=local_group(), bucket_cap_mb=400 / 2**20)
    for model in (plain, ddp):
        F.cross_entropy(model(minidnn.tensor(x[:5])), minidnn.tensor(y[:5])).backward()
    flats = [bucket.flat for bucket in ddp.reducer.buckets]
    assert len(flats) > 2
    for (name, p), q in zip(wrapped.named_parameters(), plain.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy(), err_msg=name)
        assert sum(np.shares_memory(p.grad.data, flat) for flat in flats) == 1, name


def test_no_sync_accumulates_without_reducing_and_the_next_step_reduces_the_sum(monkeypatch):
    x, y = dataset()
    group = local_group()
    calls = []
    monkeypatch.setattr(group, "all_reduce", lambda array, op=ReduceOp.SUM: calls.append(array.size) or
                        TcpProcessGroup.all_reduce(group, array, op))
    ddp = dist.DistributedDataParallel(tiny_model(0), process_group=group)
    plain = tiny_model(0)
    calls.clear()
    with ddp.no_sync():
        for model in (ddp, plain):
            F.cross_entropy(model(minidnn.tensor(x[:3])), minidnn.tensor(y[:3])).backward()
    assert calls == []
    for model in (ddp, plain):
        F.cross_entropy(model(minidnn.tensor(x[3:6])), minidnn.tensor(y[3:6])).backward()
    assert len(calls) == len(ddp.reducer.buckets)
    for p, q in zip(ddp.parameters(), plain.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


class Reuse(nn.Module):
    """``w`` used twice: by the first and the last matrix product, or by the last two."""

    def __init__(self, far_apart: bool) -> None:
        super().__init__()
        minidnn.manual_seed(2)
        self.w, self.v = nn.Parameter(minidnn.randn(3, 3).double()), nn.Parameter(minidnn.randn(3, 3).double())
        self.far_apart = far_apart

    def forward(self, x):
        if self.far_apart:
            return (((x @ self.w) @ self.v) @ self.w).sum()
        return (((x @ self.v) @ self.w) @ self.w).sum()


def test_a_parameter_used_twice_is_summed_before_its_bucket_starts_or_refused_after():
    x = minidnn.tensor(np.random.default_rng(1).standard_normal((2, 3)))
    plain, wrapped = Reuse(far_apart=False), Reuse(far_apart=False)
    ddp = dist.DistributedDataParallel(wrapped, process_group=local_group())  # one bucket
    plain(x).backward()
    ddp(x).backward()
    for p, q in zip(wrapped.parameters(), plain.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    far = dist.DistributedDataParallel(Reuse(far_apart=True), process_group=local_group(), bucket_cap_mb=1e-5)
    with pytest.raises(RuntimeError, match="w received a gradient after its bucket's all-reduce had started"):
        far(x).backward()


def test_an_unused_parameter_stops_the_next_forward_by_name_unless_found():
    x = minidnn.tensor(np.ones((2, 4)))
    strict = dist.DistributedDataParallel(Heads().double(), process_group=local_group())
    strict(x, use_b=True).backward()
    with pytest.raises(RuntimeError, match=r"(?s)Expected to have finished reduction.*: c\.weight, c\.bias.*"
                                           r"find_unused_parameters=True"):
        strict(x, use_b=True)
    found = Heads().double()
    dist.DistributedDataParallel(found, process_group=local_group(), find_unused_parameters=True)(x, False).backward()
    assert found.c.weight.grad is None and found.b.weight.grad is None and found.a.weight.grad is not None


def test_ddp_refuses_what_it_cannot_wrap():
    with pytest.raises(RuntimeError, match="doesn't have any parameter that requires a gradient"):
        dist.DistributedDataParallel(tiny_model(0).requires_grad_(False), process_group=local_group())
    with pytest.raises(TypeError, match="minidnn.nn.Module"):
        dist.DistributedDataParallel(lambda x: x, process_group=local_group())
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.DistributedDataParallel(tiny_model(0))


def test_the_post_accumulate_grad_hook_runs_after_each_accumulation_and_can_be_removed():
    w = nn.Parameter(minidnn.tensor(np.array([1.0, 2.0])))
    seen = []
    handle = w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    (w * w).sum().backward()  # two edges into w: one call each, the second seeing the sum
    assert [s.tolist() for s in seen] == [[1.0, 2.0], [2.0, 4.0]]
    handle.remove()
    (w * 3).sum().backward()
    assert len(seen) == 2
    with pytest.raises(RuntimeError, match="non-leaf"):
        (w * 2).register_post_accumulate_grad_hook(print)


# ----------------------------------------------------------------------------------------------
# SyncBatchNorm in one process: the same as batch norm, by its own formulas
# ----------------------------------------------------------------------------------------------
def test_sync_batchnorm_function_equals_batch_norm_in_a_world_of_one(rng):
    """Its own formulas (sums of squares, inference's normalisation, the two statistics terms of the gradient)
    against batch norm's training node, fused ReLU or not; the cross-rank sums are the two-process test's."""
    from minidnn.distributed.sync_batchnorm import SyncBatchNormFunction  # noqa: PLC0415

    x = rng.standard_normal((3, 4, 5, 2)) * 2 + 3
    weights, gamma = rng.standard_normal(x.shape), rng.standard_normal(4)
    names = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")
    for relu in (False, True):
        outcomes = []
        for synced in (False, True):
            inputs = minidnn.tensor(x, requires_grad=True)
            weight = nn.Parameter(minidnn.tensor(gamma.copy()))
            bias = nn.Parameter(minidnn.tensor(np.linspace(-1, 1, 4)))
            mean, var = minidnn.tensor(np.zeros(4)), minidnn.tensor(np.ones(4))
            if synced:
                y = SyncBatchNormFunction.apply(inputs, weight, bias, mean.data, var.data, 0.1, 1e-5, relu,
                                                local_group())
            else:
                y = F.batch_norm(inputs, mean, var, weight, bias, True, 0.1, 1e-5, relu)
            (y * minidnn.tensor(weights)).sum().backward()
            outcomes.append([t.numpy() for t in (y, inputs.grad, weight.grad, bias.grad, mean, var)])
        for ours, theirs, name in zip(outcomes[1], outcomes[0], names):
            np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12, err_msg=f"{name}, relu={relu}")


def test_convert_sync_batchnorm_keeps_the_tensors_and_the_order():
    model = tiny_model(0, norm=nn.BatchNorm2d)
    norm = model[1]
    converted = dist.convert_sync_batchnorm(model)
    assert converted is model and type(model[1]) is dist.SyncBatchNorm and nn.SyncBatchNorm is dist.SyncBatchNorm
    assert model[1].weight is norm.weight and model[1].running_var is norm.running_var
    assert [name for name, _ in model.named_children()] == [str(i) for i in range(6)]
    assert type(dist.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm2d(3))) is dist.SyncBatchNorm
    x = minidnn.tensor(dataset()[0][:3])
    np.testing.assert_array_equal(model(x).numpy(), tiny_model(0, norm=nn.BatchNorm2d)(x).numpy())  # no group: BN


# ----------------------------------------------------------------------------------------------
# The sampler
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [1, 7, 10, 13])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_matches_torch_and_covers_the_data(length, replicas, drop_last):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler as TorchSampler  # noqa: PLC0415

    data = list(range(length))
    if drop_last and length < replicas:
        with pytest.raises(ValueError, match="leaves nothing"):
            dist.DistributedSampler(data, replicas, 0, drop_last=True)
        return
    ours = [list(dist.DistributedSampler(data, replicas, r, shuffle=False, drop_last=drop_last))
            for r in range(replicas)]
    theirs = [list(TorchSampler(data, replicas, r, shuffle=False, drop_last=drop_last)) for r in range(replicas)]
    assert ours == theirs
    # Shuffled: torch's permutation through our padding and striding gives torch's shards.
    for epoch in (0, 3):
        sampler = TorchSampler(data, replicas, 0, shuffle=True, seed=5, drop_last=drop_last)
        sampler.set_epoch(epoch)
        generator = torch.Generator()
        generator.manual_seed(5 + epoch)
        permutation = torch.randperm(length, generator=generator).tolist()
        for rank in range(replicas):
            sampler.rank = rank
            assert shard(permutation, replicas, rank, drop_last) == list(sampler)
    flat = sorted(i for part in ours for i in part)
    assert len({len(part) for part in ours}) == 1
    if drop_last:
        assert len(set(flat)) == len(flat) == (length // replicas) * replicas  # disjoint, the tail dropped
    else:
        assert set(flat) == set(data) and len(flat) == math.ceil(length / replicas) * replicas  # covering, padded


def test_sampler_shards_are_disjoint_cover_and_reshuffle_each_epoch():
    data = list(range(23))
    orders = []
    for epoch in range(3):
        shards = []
        for rank in range(3):
            sampler = dist.DistributedSampler(data, num_replicas=3, rank=rank, seed=1, drop_last=True)
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        assert all(len(s) == 7 for s in shards)
        flat = [i for s in shards for i in s]
        assert len(set(flat)) == 21 and set(flat) <= set(data)
        orders.append(flat)
    assert orders[0] != orders[1] != orders[2]
    again = dist.DistributedSampler(data, num_replicas=3, rank=1, seed=1, drop_last=True)
    again.set_epoch(1)
    assert list(again) == orders[1][7:14]  # the same epoch gives the same shard (a resumed run too)


def test_sampler_errors():
    with pytest.raises(ValueError, match=r"invalid rank 2, rank should be in the interval \[0, 1\]"):
        dist.DistributedSampler(range(4), num_replicas=2, rank=2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.DistributedSampler(range(4))
    with pytest.raises(ValueError, match="num_replicas must be an int >= 1"):
        dist.DistributedSampler(range(4), num_replicas=0, rank=0)


# ----------------------------------------------------------------------------------------------
# The tcp backend: ranks as threads, real sockets
# ----------------------------------------------------------------------------------------------
def start_world(size, timeout=10.0):
    """``size`` TcpProcessGroups (rank 0 runs the store), made in parallel as real ranks would."""
    port = free_port()
    groups, errors = [None] * size, []

    def join(rank):
        try:
            store = TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=timeout)
            groups[rank] = TcpProcessGroup(store, rank, size, timeout)
            groups[rank].store = store
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return groups


def close_world(groups):
    for group in groups:
        group.shutdown()
    for group in reversed(groups):
        group.store.close()


def on_every_rank(groups, work):
    """Run ``work(rank, group)`` on each rank's own thread; returns the results, or raises the first error."""
    results, errors = [None] * len(groups), [None] * len(groups)

    def body(rank):
        try:
            results[rank] = work(rank, groups[rank])
        except BaseException as error:  # noqa: BLE001
            errors[rank] = error

    threads = [threading.Thread(target=body, args=(rank,)) for rank in range(len(groups))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results, errors


def test_tcp_collectives_on_three_ranks(rng):
    inputs = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(3)]
    groups = start_world(3)
    try:
        def work(rank, group):
            out = {}
            for op in ReduceOp:
                array = inputs[rank].copy()
                dist.all_reduce(array, op, group=group)
                out[op] = array
            tensor = minidnn.tensor(np.full(4, float(rank)))
            handle = dist.broadcast(tensor, src=2, group=group, async_op=True)
            handle.wait()
            out["broadcast"] = tensor.numpy()
            counts = np.array([rank + 1], dtype=np.int64)
            dist.all_reduce(counts, group=group)
            out["int"] = counts
            dist.barrier(group)
            return out

        results, errors = on_every_rank(groups, work)
    finally:
        close_world(groups)
    assert errors == [None] * 3
    stacked = np.stack(inputs)
    expected = {ReduceOp.SUM: (stacked[0] + stacked[1]) + stacked[2], ReduceOp.MAX: stacked.max(0),
                ReduceOp.MIN: stacked.min(0)}
    expected[ReduceOp.AVG] = expected[ReduceOp.SUM] / np.float32(3)
    for op, value in expected.items():
        for rank in range(3):
            np.testing.assert_array_equal(results[rank][op], value, err_msg=f"{op} on rank {rank}")
    for rank in range(3):
        np.testing.assert_array_equal(results[rank]["broadcast"], np.full(4, 2.0))
        assert results[rank]["int"].tolist() == [6]


def test_tcp_ranks_that_disagree_stop_with_both_sides_named():
    groups = start_world(2)
    try:
        def work(rank, group):
            array = np.zeros(3, np.float32)
            if rank == 0:
                dist.all_reduce(array, group=group)
            else:
                dist.broadcast(array, src=1, group=group)

        _, errors = on_every_rank(groups, work)
    finally:
        close_world(groups)
    for error in errors:
        assert isinstance(error, RuntimeError)
        assert "rank 0 runs #0 all_reduce SUM of 12 bytes" in str(error)
        assert "rank 1 runs #0 broadcast from rank 1 of 12 bytes" in str(error)


def test_tcp_a_rank_that_dies_or_hangs_fails_the_others_quickly():
    groups = start_world(2, timeout=0.5)
    groups[1].shutdown()  # rank 1 is gone: its socket closes
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 closed its connection during collective #0 all_reduce"):
        dist.all_reduce(np.ones(2), group=groups[0])
    with pytest.raises(RuntimeError, match="broken by an earlier failure"):
        dist.barrier(groups[0])
    assert time.monotonic() - start < 2
    close_world(groups)
    groups = start_world(2, timeout=0.5)  # rank 1 alive but silent
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0 waited more than 0.5s for rank 1 in collective #0"):
        dist.all_reduce(np.ones(2), group=groups[0])
    assert time.monotonic() - start < 3
    close_world(groups)


def test_store_set_get_add_and_timeouts():
    port = free_port()
    master = TCPStore("127.0.0.1", port, 2, is_master=True, timeout=2)
    client = TCPStore("127.0.0.1", port, 2, timeout=2)
    try:
        threading.Timer(0.1, lambda: master.set("late", b"\x00\xff")).start()
        assert client.get("late") == b"\x00\xff"  # waits for it
        assert client.add("n", 2) == 2 and master.add("n", 3) == 5
        with pytest.raises(TimeoutError, match="did not appear"):
            client.get("never", timeout=0.2)
    finally:
        client.close()
        master.close()
    with pytest.raises(TimeoutError, match="could not reach the rendezvous store"):
        TCPStore("127.0.0.1", free_port(), timeout=0.3)


def test_init_process_group_reads_the_environment_and_says_what_is_missing(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="environment variable RANK is not set"):
        dist.init_process_group("tcp")
    with pytest.raises(ValueError, match="backend must be one of"):
        dist.init_process_group("gloo")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("tcp", timeout=5)
    try:
        assert (dist.is_initialized(), dist.get_rank(), dist.get_world_size(), dist.get_backend()) == \
            (True, 0, 1, "tcp")
        with pytest.raises(RuntimeError, match="twice"):
            dist.init_process_group("tcp")
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------------------------
# The launcher
# ----------------------------------------------------------------------------------------------
ENVIRONMENT_SCRIPT = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"]
with open(os.path.join(sys.argv[1], "env-" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ[k] for k in keys} | {"argv": sys.argv[2:]}, f)
"""


def test_launcher_gives_each_process_its_ranks(tmp_path):
    script = tmp_path / "env.py"
    script.write_text(ENVIRONMENT_SCRIPT)
    code = run.main(["--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3",
                     "--master-port", "4567", str(script), str(tmp_path), "--lr", "0.1"])
    assert code == 0
    seen = {json.loads(path.read_text())["LOCAL_RANK"]: json.loads(path.read_text())
            for path in tmp_path.glob("env-*.json")}
    assert sorted(seen) == ["0", "1", "2"]
    for local, values in seen.items():
        assert values == {"RANK": str(3 + int(local)), "LOCAL_RANK": local, "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3",
                          "GROUP_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "4567", "argv": ["--lr", "0.1"]}


DYING_SCRIPT = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
if rank == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a rank that will not stop: SIGKILL after the grace period
    time.sleep(60)
elif rank == 1:
    time.sleep(0.3)
    sys.exit(3)
elif rank == 2:
    time.sleep(60)
"""


def test_launcher_ends_the_job_when_a_rank_dies_with_its_code_and_a_message(tmp_path, capsys):
    script = tmp_path / "dying.py"
    script.write_text(DYING_SCRIPT)
    start = time.monotonic()
    code = run.main(["--nproc-per-node", "3", "--master-port", str(free_port()), "--grace-period", "0.5", str(script)])
    elapsed = time.monotonic() - start
    assert code == 3
    assert elapsed < 5
    message = capsys.readouterr().err
    assert "rank 1 (local rank 1, pid" in message and "exited with code 3; stopping the other 2 rank(s)" in message
    script.write_text("import os, signal, time\nif os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
                      "time.sleep(60)\n")
    assert run.main(["--nproc-per-node", "2", "--master-port", str(free_port()), str(script)]) == 128 + 9
    assert "rank 1 (local rank 1, pid" in capsys.readouterr().err.replace("was killed by signal SIGKILL", "")


def test_launcher_forwards_a_signal_and_stops(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text("import os, signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[1] + os.environ['RANK'], 'w').close(),"
                      " sys.exit(0)))\nopen(sys.argv[2] + os.environ['RANK'], 'w').close()\ntime.sleep(60)\n")
    # The launcher's file run as a script: it imports the standard library only, so it starts at once.
    launcher = subprocess.Popen([sys.executable, os.path.join(ROOT, "minidnn", "distributed", "run.py"),
                                 "--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
                                 str(tmp_path / "stopped"), str(tmp_path / "ready")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while len(list(tmp_path.glob("ready*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=10)
    assert launcher.returncode == 128 + signal.SIGTERM
    assert b"received SIGTERM" in err
    assert sorted(p.name for p in tmp_path.glob("stopped*")) == ["stopped0", "stopped1"]


def run_alone(code: str) -> None:
    """Run ``code`` (with os, signal, sys and the launcher's module as run) in a fresh process: its waitpid(-1)
    must see only the job's children, not the test process's other ones (a data loader's workers)."""
    prelude = f"import os, signal, sys\nsys.path.insert(0, {ROOT!r})\nfrom minidnn.distributed import run\n"
    done = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_signalling_the_ranks_leaves_an_ended_rank_for_the_launcher_to_reap():
    """A rank that ended just before the launcher signals the others must still be reaped by the launcher's
    own wait: a signal sent through Popen.send_signal polls, reaps it unseen, and the launcher then waited
    out its whole grace period for a rank that was gone (the signal test above hung 3 runs in 15)."""
    run_alone("job = run._Job([[sys.executable, '-c', 'pass']], [dict(os.environ)], [0])\n"
              "os.waitid(os.P_PID, job.processes[0].pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped yet\n"
              "job.signal_all(signal.SIGTERM)\n"
              "assert job.reap(block=True) == (0, 0) and not job.alive\n")


def test_a_job_whose_ranks_were_all_reaped_elsewhere_has_none_alive():
    """With no child left to wait for, reap says so by leaving no rank alive: the launcher's loop
    (while job.alive: reap) would otherwise spin for ever on ranks that are gone."""
    run_alone("job = run._Job([[sys.executable, '-c', 'pass']], [dict(os.environ)], [0])\n"
              "os.waitpid(job.processes[0].pid, 0)  # reaped behind the job's back\n"
              "assert job.reap(block=True) is None and not job.alive\n")


def test_launcher_rejects_bad_arguments(capsys):
    for arguments in (["--nproc-per-node", "0", "x.py"], ["--nnodes", "2", "--node-rank", "2", "x.py"],
                      ["--master-port", "70000", "x.py"]):
        with pytest.raises(SystemExit):
            run.main(arguments)
    assert "--node-rank must be in 0..1" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Two processes, the CPU backend: DDP against one process on the global batch
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    assert launch(out, list(SCENARIOS)) == 0
    return out


def test_ranks_whose_parameter_shapes_differ_are_refused_on_every_rank(two_rank_results):
    for rank in range(2):
        refused = str(load(two_rank_results, "mismatch", rank)["refused"])
        assert "the ranks' models differ" in refused, f"rank {rank} wrapped a model of other shapes"


def test_ddp_two_processes_equal_one_process_on_the_global_batch(two_rank_results):
    ranks = [load(two_rank_results, "training", rank) for rank in range(2)]
    for key in ranks[0]:
        if key != "losses":  # the weights, bit for bit; the losses are each rank's own batch's
            np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    reference = tiny_model(seed=100)  # rank 0's initial weights: DDP broadcast them
    losses = train_one_process(reference, world_size=2)
    for key, value in state_arrays(reference).items():
        np.testing.assert_allclose(ranks[0][key], value, rtol=1e-10, atol=1e-13, err_msg=key)
    np.testing.assert_allclose((ranks[0]["losses"] + ranks[1]["losses"]) / 2, losses, rtol=1e-10)
    # 864, 32, 1440 and 40 bytes filled to 400 in registration order, then reversed.
    assert json.loads((two_rank_results / "buckets-rank0.json").read_text()) == \
        [["4.bias"], ["0.bias", "4.weight"], ["0.weight"]]


def test_ddp_two_processes_no_sync_reduces_the_accumulated_sum(two_rank_results):
    ranks = [load(two_rank_results, "no_sync", rank) for rank in range(2)]
    model = tiny_model(seed=0)
    x, y = dataset()
    for k in range(3):
        for rank in range(2):  # the mean over ranks of each rank's sum of its micro-batches' gradients
            batch = np.arange(rank * 2 + 4 * k, rank * 2 + 4 * k + 2)
            (F.cross_entropy(model(minidnn.tensor(x[batch])), minidnn.tensor(y[batch])) * 0.5).backward()
    for name, p in model.named_parameters():
        assert not np.array_equal(ranks[0][f"local.{name}"], ranks[1][f"local.{name}"]), name  # not reduced
        np.testing.assert_array_equal(ranks[0][f"synced.{name}"], ranks[1][f"synced.{name}"])
        np.testing.assert_allclose(ranks[0][f"synced.{name}"], p.grad.numpy(), rtol=1e-10, atol=1e-14, err_msg=name)


def test_sync_batchnorm_two_processes_equal_batch_norm_on_the_global_batch(two_rank_results):
    ranks = [load(two_rank_results, "sync_batchnorm", rank) for rank in range(2)]
    reference = FusedNormNet().double()
    x, y = dataset()
    optimizer = make_optimizer(reference)
    for per_rank in step_batches(0, 2):
        batch = np.concatenate(per_rank)
        loss = F.cross_entropy(reference(minidnn.tensor(x[batch])), minidnn.tensor(y[batch]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for key, value in state_arrays(reference).items():
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
        np.testing.assert_allclose(ranks[0][key], value, rtol=1e-9, atol=1e-12, err_msg=key)
    # Unequal shards: each rank's output and input gradient are its slice of batch norm's on all 8 samples.
    norm = nn.BatchNorm2d(4).double()
    norm.weight.data[...] = np.linspace(0.5, 2.0, 4)
    rng = np.random.default_rng(9)
    inputs, weights = rng.standard_normal((8, 4, 3, 2)) * 3 + 1, rng.standard_normal((8, 4, 3, 2))
    whole = minidnn.tensor(inputs, requires_grad=True)
    output = norm(whole)
    (output * minidnn.tensor(weights)).sum().backward()
    for rank, part in ((0, slice(0, 3)), (1, slice(3, 8))):
        np.testing.assert_allclose(ranks[rank]["y"], output.numpy()[part], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(ranks[rank]["dx"], whole.grad.numpy()[part], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(ranks[rank]["running_var"], norm.running_var.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ranks[0]["dweight"] + ranks[1]["dweight"], norm.weight.grad.numpy(), rtol=1e-10)


def test_ddp_two_processes_find_unused_parameters(two_rank_results):
    ranks = [load(two_rank_results, "unused", rank) for rank in range(2)]
    model = Heads().double()
    x = np.random.default_rng(4).standard_normal((4, 4))
    loss = (model(minidnn.tensor(x[:2]), use_b=True) + model(minidnn.tensor(x[2:]), use_b=False)) * 0.5
    loss.backward()
    for rank in range(2):
        assert "c.weight" not in ranks[rank]  # no rank used it: no gradient
        for name, p in model.named_parameters():
            if name.startswith("c."):
                continue
            np.testing.assert_allclose(ranks[rank][name], p.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)
        assert "last backward: b.weight, b.bias, c.weight, c.bias." in str(ranks[rank]["message"])


def test_ddp_two_processes_broadcast_buffers_at_each_synchronised_forward(two_rank_results):
    ranks = [load(two_rank_results, "buffers", rank) for rank in range(2)]
    assert ranks[1]["after_no_grad"].tolist() == [2.0] * 4  # no broadcast without a backward to come
    assert ranks[0]["after_forward"].tolist() == ranks[1]["after_forward"].tolist() == [1.0] * 4


# ----------------------------------------------------------------------------------------------
# GPU: NCCL with one rank (any GPU), and several ranks (two GPUs or more)
# ----------------------------------------------------------------------------------------------
def gpu_model(seed: int, norm: type | None = nn.BatchNorm2d) -> nn.Module:
    minidnn.manual_seed(seed)
    layers = [nn.Conv2d(3, 8, 3, padding=1)] + ([norm(8)] if norm else []) + \
        [nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
         nn.Flatten(), nn.Linear(16, 5)]
    return nn.Sequential(*layers)


def gpu_batches(count: int, per_rank: int, world_size: int):
    rng = np.random.default_rng(21)
    return [(rng.standard_normal((per_rank * world_size, 3, 8, 8)).astype(np.float32),
             rng.integers(0, 5, per_rank * world_size)) for _ in range(count)]


def gpu_step(model, optimizer):
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return step


@pytest.fixture
def one_rank_nccl(monkeypatch):
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(key, value)
    dist.init_process_group("nccl", timeout=60)
    yield dist
    dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_one_rank_nccl_step_equals_the_plain_step_bitwise(one_rank_nccl, captured):
    from minidnn.cuda import graphs  # noqa: PLC0415
    from minidnn.primitives import conv  # noqa: PLC0415

    data = [(minidnn.tensor(x, device="cuda"), minidnn.tensor(y, device="cuda")) for x, y in gpu_batches(6, 6, 1)]

    def train(wrap):
        model = gpu_model(0).to("cuda")
        network = dist.DistributedDataParallel(model, bucket_cap_mb=0.0005) if wrap else model
        if wrap:
            assert len(network.reducer.buckets) == 3
        step = gpu_step(network, optim.SGD(network.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4))
        if captured and wrap:
            step = graphs.capture(step, data[0], warmup=2)
            assert isinstance(step, graphs.CapturedStep), getattr(step, "reason", "")
        elif captured:
            step(*data[0]), step(*data[0])  # what capture's two warm-up steps do
        losses = [step(x, y).item() for x, y in (data[1:] if captured else data)]
        return losses, state_arrays(model)

    with conv.settings(algo="gemm"):  # deterministic kernels: bitwise equality is the claim
        (plain_losses, plain), (ddp_losses, wrapped) = train(False), train(True)
    assert ddp_losses == plain_losses
    for key, value in plain.items():
        np.testing.assert_array_equal(wrapped[key], value, err_msg=key)


GPU_STEPS = 20


def rank_gpu(out: str, backend_name: str, sync_norm: bool) -> None:
    """Training on GPU ``LOCAL_RANK`` (or GPU 0 for every rank, with the tcp backend): losses and weights. The
    model has SyncBatchNorm (``sync_norm``) or no normalisation: either computes what the global batch does."""
    dist.init_process_group(backend_name, timeout=120)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{os.environ['LOCAL_RANK']}" if backend_name == "nccl" else "cuda:0"
    model = gpu_model(0, norm=nn.BatchNorm2d if sync_norm else None).to(device)
    if sync_norm:
        model = dist.convert_sync_batchnorm(model)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.0005)
    step = gpu_step(ddp, optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9))
    losses = []
    for x, y in gpu_batches(GPU_STEPS, 4, world_size):
        part = slice(rank * 4, rank * 4 + 4)
        losses.append(step(minidnn.tensor(x[part], device=device), minidnn.tensor(y[part], device=device)).item())
    save(out, f"gpu-{backend_name}", losses=np.array(losses), **state_arrays(model))
    dist.destroy_process_group()


def one_gpu_global_batch(world_size: int, sync_norm: bool):
    """The reference: one GPU, the ranks' batches together (batch norm where the ranks have SyncBatchNorm)."""
    model = gpu_model(0, norm=nn.BatchNorm2d if sync_norm else None).to("cuda")
    step = gpu_step(model, optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    losses = [step(minidnn.tensor(x, device="cuda"), minidnn.tensor(y, device="cuda")).item()
              for x, y in gpu_batches(GPU_STEPS, 4, world_size)]
    return np.array(losses), state_arrays(model)


def check_ranks_against_one_gpu(out, name, world_size, sync_norm):
    """Every rank's weights are rank 0's, bit for bit; the loss curve (the ranks' mean) and the weights are the
    global batch's on one GPU, within float32 rounding."""
    ranks = [load(out, name, rank) for rank in range(world_size)]
    for rank in range(1, world_size):
        for key, value in ranks[0].items():
            if key != "losses":
                np.testing.assert_array_equal(ranks[rank][key], value, err_msg=f"{key} on rank {rank}")
    losses, weights = one_gpu_global_batch(world_size, sync_norm)
    np.testing.assert_allclose(np.mean([r["losses"] for r in ranks], axis=0), losses, rtol=1e-4)
    for key, value in weights.items():
        np.testing.assert_allclose(ranks[0][key], value, rtol=1e-3, atol=1e-5, err_msg=key)


@pytest.mark.gpu
def test_two_ranks_on_one_gpu_through_the_tcp_backend(tmp_path):
    """The DDP GPU path (buckets, views, copies) with two ranks on the one GPU NCCL cannot share; SyncBatchNorm,
    so the comparison with one process on the global batch is exact up to float32 rounding."""
    assert launch(tmp_path, ["gpu-tcp-sync"]) == 0
    check_ranks_against_one_gpu(tmp_path, "gpu-tcp", 2, sync_norm=True)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("sync_norm", [False, True], ids=["no-norm", "sync-batch-norm"])
def test_nccl_ranks_stay_identical_and_follow_one_gpu_on_the_global_batch(tmp_path, sync_norm):
    world_size = min(minidnn.cuda.device_count(), 4)
    assert launch(tmp_path, ["gpu-nccl-sync" if sync_norm else "gpu-nccl-plain"], nproc=world_size) == 0
    check_ranks_against_one_gpu(tmp_path, "gpu-nccl", world_size, sync_norm)


WATCHDOG_SCRIPT = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import minidnn, minidnn.distributed as dist
dist.init_process_group("nccl", timeout=3)
if dist.get_rank() == 1:
    os._exit(5)  # dies without a word: rank 0's all-reduce can never finish
x = minidnn.zeros(1000, device="cuda:0").data
dist.all_reduce(x)
minidnn.cuda.synchronize()
print("unreachable")
"""


@pytest.mark.gpu
@pytest.mark.multigpu
def test_nccl_watchdog_ends_a_rank_whose_peer_died(tmp_path):
    script = tmp_path / "watchdog.py"
    script.write_text(WATCHDOG_SCRIPT)
    port = str(free_port())
    processes = [subprocess.Popen([sys.executable, str(script), ROOT], stderr=subprocess.PIPE, env={
        **os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port}) for rank in range(2)]
    start = time.monotonic()
    _, err = processes[0].communicate(timeout=60)
    processes[1].wait(timeout=10)
    assert processes[0].returncode == 1 and time.monotonic() - start < 45
    # A peer's death shows as the collective's timeout, or as NCCL's own asynchronous error where it notices.
    assert b"rank 0:" in err and b"aborting the NCCL communicator and ending this process" in err


if __name__ == "__main__":
    requested, out_dir = sys.argv[1].split(","), sys.argv[2]
    if requested[0].startswith("gpu-"):  # gpu-{nccl,tcp}-{plain,sync}
        _, backend_name, variant = requested[0].split("-")
        rank_gpu(out_dir, backend_name, sync_norm=variant == "sync")
    else:
        rank_script(requested, out_dir)
