"""A captured step's memory plan: placement by lifetime, the allocator that follows it or falls back, and the
captured step on the GPU with and without it."""
import numpy as np
import pytest

import minidnn
from minidnn.cuda import graphs, memory_plan
from minidnn.primitives import conv
from tests.test_cuda_graphs import batches, make_run

ALIGNMENT = memory_plan.ALIGNMENT


def random_lifetimes(rng, count):
    """A recording's (sizes, starts, ends) in allocation order: each allocation starts at its own tick, after
    the one before it, and ends at a later tick, some never (the end of time)."""
    sizes = rng.integers(1, 5000, count) * rng.choice([1, 7, 300], count)
    ticks = rng.permutation(2 * count) + 1
    starts, ends = np.minimum(ticks[:count], ticks[count:]), np.maximum(ticks[:count], ticks[count:])
    ends[rng.random(count) < 0.1] = 2 * count + 1
    order = np.argsort(starts)
    return sizes, starts[order], ends[order]


def aligned(sizes):
    return -(-np.maximum(sizes, 1) // ALIGNMENT) * ALIGNMENT


@pytest.mark.parametrize("count", [1, 2, 17, 300])
def test_allocations_alive_together_never_share_a_byte(rng, count):
    sizes, starts, ends = random_lifetimes(rng, count)
    plan = memory_plan.place(sizes, starts, ends)
    offsets, extents = plan.offsets, aligned(sizes)
    assert np.all(offsets % ALIGNMENT == 0) and np.all(offsets >= 0)
    assert plan.arena_bytes == np.max(offsets + extents)
    together = (starts[:, None] < ends[None, :]) & (starts[None, :] < ends[:, None])
    sharing = (offsets[:, None] < offsets[None, :] + extents[None, :]) & \
              (offsets[None, :] < offsets[:, None] + extents[:, None])
    np.fill_diagonal(together, False)
    assert not np.any(together & sharing)
    # The peak: the most bytes alive at one tick, by brute force; no arena can be smaller.
    peak = max(int(extents[(starts <= t) & (t < ends)].sum()) for t in range(1, 2 * count + 2))
    assert plan.peak_bytes == peak <= plan.arena_bytes
    # Each allocation's predecessors are the earlier ones sharing its bytes, and were freed before it came.
    for k in range(count):
        expected = [j for j in range(k) if sharing[j, k]]
        assert list(plan.predecessors[k]) == expected
        assert np.all(ends[expected] <= starts[k])


def test_placement_reaches_the_peak_on_a_step_like_recording():
    """Forward activations kept for the backward, freed in reverse while gradients of the same sizes come and
    go: the greedy placement needs no more than the peak."""
    sizes = [4096, 2048, 1024, 1024, 2048, 4096]
    # forward: a0 a1 a2 made; backward: g2 made, a2 freed, g1 made, g2 freed, a1 freed, g0 made, g1 freed, ...
    starts = [1, 2, 3, 4, 6, 9]
    ends = [11, 8, 5, 7, 10, 12]
    plan = memory_plan.place(sizes, starts, ends)
    assert plan.arena_bytes == plan.peak_bytes == 4096 + 2048 + 4096  # a0, g1 and g0 at tick 9


def test_placement_errors():
    with pytest.raises(ValueError, match="of one length"):
        memory_plan.place([1, 2], [1], [2])
    with pytest.raises(ValueError, match="must end after it starts"):
        memory_plan.place([1], [3], [3])
    assert memory_plan.place([], [], []).arena_bytes == 0


class FakeArena:
    ptr, device_id = 1 << 40, 0


@pytest.fixture
def fake_memory(monkeypatch):
    """memory_plan's MemoryPointers replaced by plain holders of (pointer, size, owner): dropping one frees it."""
    class Held:
        def __init__(self, pointer, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = pointer, size, owner, device_id

    monkeypatch.setattr(memory_plan, "_owned", Held)
    return Held


def test_the_allocator_follows_the_plan_and_falls_back_for_good_when_the_step_strays(fake_memory):
    sizes, starts, ends = [1000, 600, 1000], [1, 2, 4], [3, 6, 5]  # the third reuses the first's bytes
    plan = memory_plan.place(sizes, starts, ends)
    assert list(plan.predecessors[2]) == [0]
    fallback_sizes = []
    fallback = lambda size: fallback_sizes.append(size) or ("fallback", size)  # noqa: E731

    allocator = memory_plan.PlannedAllocator(plan, FakeArena(), fallback)
    first, second = allocator.malloc(1000), allocator.malloc(600)
    assert (first.ptr, second.ptr) == (FakeArena.ptr + plan.offsets[0], FakeArena.ptr + plan.offsets[1])
    del first  # freed as recorded: the third may take its bytes
    third = allocator.malloc(1000)
    assert third.ptr == FakeArena.ptr + plan.offsets[2] and allocator.fallbacks == 0
    assert allocator.malloc(8) == ("fallback", 8)  # past the recording
    del second, third

    allocator = memory_plan.PlannedAllocator(plan, FakeArena(), fallback)
    kept = allocator.malloc(1000)
    assert allocator.malloc(601) == ("fallback", 601)  # another size: the capture took another path
    assert allocator.malloc(1000) == ("fallback", 1000)  # and every request after it falls back too
    del kept

    allocator = memory_plan.PlannedAllocator(plan, FakeArena(), fallback)
    kept = [allocator.malloc(1000), allocator.malloc(600)]  # the first still alive when the third comes
    assert allocator.malloc(1000) == ("fallback", 1000) and allocator.fallbacks == 1


@pytest.mark.gpu
def test_the_planned_capture_trains_as_the_pooled_one_in_an_arena_no_larger():
    data = batches(5, np.random.default_rng(3))
    results = {}
    with conv.settings(algo="gemm"):  # deterministic kernels: bitwise equality is the claim
        for plan_memory in (False, True):
            model, _, _, step = make_run()
            captured = graphs.capture(step, data[0], warmup=2, plan_memory=plan_memory)
            assert isinstance(captured, graphs.CapturedStep), getattr(captured, "reason", "")
            losses = [captured(x, y).item() for x, y in data[1:]]
            results[plan_memory] = (losses, {k: v.numpy() for k, v in model.state_dict().items()}, captured)
    (pooled_losses, pooled_state, pooled), (planned_losses, planned_state, planned) = results[False], results[True]
    assert planned_losses == pooled_losses
    for key, value in planned_state.items():
        np.testing.assert_array_equal(value, pooled_state[key], err_msg=key)
    assert planned.planned.fallbacks == 0 and pooled.planned is None
    assert planned.planned.plan.arena_bytes <= planned.memory_bytes <= pooled.memory_bytes


@pytest.mark.gpu
def test_a_capture_that_strays_from_the_recording_falls_back_and_stays_right():
    """The step allocates an extra array only while it is captured: the plan is left there and the rest of
    the capture allocates from the pool, with the pooled capture's results."""
    cupy = minidnn.backend.cupy()
    data = batches(4, np.random.default_rng(4))
    results = {}
    with conv.settings(algo="gemm"):
        for plan_memory in (False, True):
            model, _, _, step = make_run()

            def straying(x, y, step=step):
                if cupy.cuda.get_current_stream().is_capturing():
                    cupy.empty(12345, dtype=np.uint8)  # freed at once: another path's allocation
                return step(x, y)

            captured = graphs.capture(straying, data[0], warmup=2, plan_memory=plan_memory)
            results[plan_memory] = ([captured(x, y).item() for x, y in data[1:]], captured)
    assert results[True][0] == results[False][0]
    assert results[True][1].planned.fallbacks > 0


def test_plan_memory_must_be_a_bool():
    with pytest.raises(TypeError, match="plan_memory must be a bool"):
        graphs.capture(lambda x: x, minidnn.zeros(2), plan_memory="yes")


@pytest.mark.gpu
def test_a_zero_byte_request_is_recorded_and_planned():
    """cuFFT asks for a work area of 0 bytes, whose pointer is null: recording and plan still place it."""
    cupy = minidnn.backend.cupy()
    x = minidnn.tensor(np.arange(64, dtype=np.float32) - 20, device="cuda")

    def step(t):
        cupy.cuda.alloc(0)
        return (t * 2.0).relu()

    captured = graphs.capture(step, x, warmup=2)
    assert isinstance(captured, graphs.CapturedStep), getattr(captured, "reason", "")
    np.testing.assert_array_equal(captured(x).numpy(), np.maximum(2 * (np.arange(64) - 20), 0))
    assert captured.planned.fallbacks == 0


@pytest.mark.gpu
def test_the_capture_hands_back_the_blocks_its_warm_up_left_cached():
    """Eager steps leave their freed arrays' blocks cached in the default pool, which only grows; the replays
    never use them, so the capture releases them. The step holds a temporary larger than any block cached
    before (earlier tests leave blocks, some split with a live array, which no release can return), so its
    block is a chunk of its own: the pool holds at least most of it less after the capture than before.
    The temporary lives through the step: freed while the step allocates, its chunk would be the only free
    block large enough for a new size and be split for it, and a long-lived array there (the first step's
    optimizer momentum, in a process where nothing was cached before) keeps the chunk from being released.
    Likewise the cuBLAS workspace the first capture of a process makes, for life: taken from the pool, it was
    carved from this chunk whenever the test ran first in its process (blas.prepare_capture now takes it from
    the device)."""
    cupy = minidnn.backend.cupy()
    data = batches(3, np.random.default_rng(5))
    _, _, _, step = make_run()
    large = 256 << 20

    def step_with_a_temporary(x, y):
        temporary = cupy.empty(large, dtype=np.uint8)
        loss = step(x, y)
        del temporary  # freed at the step's end, whole
        return loss

    step_with_a_temporary(*data[0])  # an eager step: the temporary's chunk stays cached
    pool = cupy.get_default_memory_pool()
    held = pool.total_bytes()
    captured = graphs.capture(step_with_a_temporary, data[0], warmup=2)
    assert isinstance(captured, graphs.CapturedStep), getattr(captured, "reason", "")
    assert pool.total_bytes() < held - large // 2
    losses = [captured(x, y).item() for x, y in data[1:]]
    assert all(np.isfinite(losses))
