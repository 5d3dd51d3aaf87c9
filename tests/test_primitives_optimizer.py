"""Optimizer update primitives: single- and multi-tensor SGD and Adam against float64 references, the
multi-tensor launch plan, the kernel's table layout, device-resident hyper-parameters and every error."""
from __future__ import annotations

import math
import operator
import os
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from minidnn.primitives import _cuda, optimizer
from minidnn.primitives.optimizer import adam_update, adam_update_multi, sgd_update, sgd_update_multi
from tests.helpers import assert_close, stand_in_driver, to_numpy

driver = pytest.fixture(name="driver")(stand_in_driver)

# More tensors than one launch takes (MAX_TENSORS), empty ones, 0-d and 1-element ones, odd sizes, and
# one large enough to span many blocks of a launch.
SHAPES = ([(), (0,), (1,), (3, 5), (2, 0, 3), (7,), (300_001,), (1, 1)]
          + [(k % 5 + 1, 2 * k + 1) for k in range(45)] + [(0, 4), (4, 4, 3)])
STEPS = 4


# ----------------------------------------------------------------------------------------------
# float64 references: PyTorch's algorithm boxes, one tensor at a time
# ----------------------------------------------------------------------------------------------
def sgd_reference(param, grad, buffer, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                  maximize=False, first_step=False):
    """One SGD step in float64; returns (param, buffer)."""
    g = (-grad if maximize else grad) + weight_decay * param
    if momentum:
        buffer = g.copy() if first_step else momentum * buffer + (1 - dampening) * g
        g = g + momentum * buffer if nesterov else buffer
    return param - lr * g, buffer


def adam_reference(param, grad, m, v, v_max, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                   decoupled_weight_decay=False, amsgrad=False, maximize=False):
    """One Adam/AdamW step in float64; returns (param, m, v, v_max)."""
    g = -grad if maximize else grad
    if decoupled_weight_decay:
        param = param * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * param
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v_max = np.maximum(v_max, v) if amsgrad else v_max
    v_hat = (v_max if amsgrad else v) / (1 - beta2 ** step)
    m_hat = m / (1 - beta1 ** step)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v, v_max


def draw(rng, shapes, dtype=np.float64):
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


def on(xp, arrays):
    """Fresh device copies: the updates are in place."""
    return [xp.array(a, copy=True) for a in arrays]


SGD_OPTIONS = [dict(lr=0.1), dict(lr=0.05, momentum=0.9),
               dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
               dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-3, maximize=True)]
ADAM_OPTIONS = [dict(lr=0.01), dict(lr=0.02, weight_decay=0.1), dict(lr=0.01, amsgrad=True, maximize=True),
                dict(lr=0.01, weight_decay=0.05, decoupled_weight_decay=True, amsgrad=True),
                dict(lr=0.01, beta1=0.5, beta2=0.9, eps=1e-3)]


# ----------------------------------------------------------------------------------------------
# Multi-tensor updates: the reference, and the single-tensor update, over several steps
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", SGD_OPTIONS)
def test_sgd_multi_matches_reference_and_single_tensor_updates(xp, rng, options):
    params = draw(rng, SHAPES)
    expected = [p.copy() for p in params]
    expected_buffers = [None] * len(params)
    multi, single = on(xp, params), on(xp, params)
    momentum = options.get("momentum", 0.0)
    multi_buffers = on(xp, [np.full(p.shape, np.nan) for p in params]) if momentum else None  # never read first
    single_buffers = on(xp, [np.full(p.shape, np.nan) for p in params])
    for step in range(STEPS):
        grads = draw(rng, SHAPES)
        first_step = step == 0
        sgd_update_multi(multi, on(xp, grads), multi_buffers, first_step=first_step, **options)
        for p, g, b in zip(single, on(xp, grads), single_buffers):
            sgd_update(p, g, b, first_step=first_step, **options)
        for i, g in enumerate(grads):
            expected[i], expected_buffers[i] = sgd_reference(expected[i], g, expected_buffers[i], first_step=first_step,
                                                             **options)
    for i in range(len(params)):
        assert_close(multi[i], expected[i], rtol=1e-12, atol=1e-14, name=f"param {i}")
        assert_close(multi[i], single[i], rtol=0, atol=0, name=f"single-tensor param {i}")
        if momentum:
            assert_close(multi_buffers[i], expected_buffers[i], rtol=1e-12, atol=1e-14, name=f"buffer {i}")


@pytest.mark.parametrize("options", ADAM_OPTIONS)
def test_adam_multi_matches_reference_and_single_tensor_updates(xp, rng, options):
    params = draw(rng, SHAPES)
    zeros = [np.zeros(shape) for shape in SHAPES]
    expected = [[p.copy(), z, z, z] for p, z in zip(params, zeros)]
    multi, multi_m, multi_v, multi_max = (on(xp, a) for a in (params, zeros, zeros, zeros))
    single, single_m, single_v, single_max = (on(xp, a) for a in (params, zeros, zeros, zeros))
    amsgrad = options.get("amsgrad", False)
    for step in range(1, STEPS + 1):
        grads = draw(rng, SHAPES)
        adam_update_multi(multi, on(xp, grads), multi_m, multi_v, multi_max if amsgrad else None, step=step,
                          **options)
        for p, g, m, v, v_max in zip(single, on(xp, grads), single_m, single_v, single_max):
            adam_update(p, g, m, v, step=step, max_exp_avg_sq=v_max, **options)
        for i, g in enumerate(grads):
            expected[i] = adam_reference(*expected[i][:1], g, *expected[i][1:], step=step, **options)
    for i in range(len(params)):
        for name, actual, wanted in zip(("param", "exp_avg", "exp_avg_sq"), (multi, multi_m, multi_v), expected[i]):
            assert_close(actual[i], wanted, rtol=1e-11, atol=1e-14, name=f"{name} {i}")
        assert_close(multi[i], single[i], rtol=0, atol=0, name=f"single-tensor param {i}")
        if amsgrad:
            assert_close(multi_max[i], expected[i][3], rtol=1e-11, atol=1e-14, name=f"max_exp_avg_sq {i}")


def test_float32_updates_against_float64_references(xp, rng):
    shapes = SHAPES[:12]
    params, grads = draw(rng, shapes, np.float32), draw(rng, shapes, np.float32)
    buffers = draw(rng, shapes, np.float32)
    sgd_params, sgd_buffers = on(xp, params), on(xp, buffers)
    sgd_update_multi(sgd_params, on(xp, grads), sgd_buffers, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    adam_params, m, v = on(xp, params), on(xp, buffers), on(xp, [b * b for b in buffers])
    adam_update_multi(adam_params, on(xp, grads), m, v, None, step=3, lr=0.01, weight_decay=0.1,
                      decoupled_weight_decay=True)
    for i, (p, g, b) in enumerate(zip(params, grads, buffers)):
        p64, g64, b64 = p.astype(np.float64), g.astype(np.float64), b.astype(np.float64)
        expected, _ = sgd_reference(p64, g64, b64, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
        assert to_numpy(sgd_params[i]).dtype == np.float32
        assert_close(sgd_params[i], expected, rtol=1e-5, atol=1e-6, name=f"sgd {i}")
        expected = adam_reference(p64, g64, b64, b64 * b64, None, 3, lr=0.01, weight_decay=0.1,
                                  decoupled_weight_decay=True)[0]
        assert_close(adam_params[i], expected, rtol=1e-5, atol=1e-6, name=f"adam {i}")


# ----------------------------------------------------------------------------------------------
# Hyper-parameters on the device (NumPy: arrays of one element are accepted, and read)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (1,)])
def test_lr_and_step_may_be_arrays_of_one_element(xp, rng, shape):
    shapes = SHAPES[:10]
    params, grads = draw(rng, shapes), draw(rng, shapes)
    by_number, by_array = on(xp, params), on(xp, params)
    buffers_number, buffers_array = on(xp, params), on(xp, params)
    sgd_update_multi(by_number, on(xp, grads), buffers_number, lr=0.05, momentum=0.9)
    sgd_update_multi(by_array, on(xp, grads), buffers_array, lr=xp.full(shape, 0.05), momentum=0.9)
    for a, b in zip(by_number + buffers_number, by_array + buffers_array):
        assert_close(a, b, rtol=0, atol=0, name="sgd, lr array")
    for step in (xp.full(shape, 3, dtype=xp.int64), xp.full(shape, 3.0)):
        states = [on(xp, [np.abs(p) for p in params]) for _ in range(4)]
        by_number, by_array = on(xp, params), on(xp, params)
        adam_update_multi(by_number, on(xp, grads), states[0], states[1], None, step=3, lr=0.01)
        adam_update_multi(by_array, on(xp, grads), states[2], states[3], None, step=step, lr=xp.full(shape, 0.01))
        for a, b in zip(by_number + states[0] + states[1], by_array + states[2] + states[3]):
            assert_close(a, b, rtol=0, atol=0, name=f"adam, step {step.dtype}")


@pytest.mark.gpu
def test_gpu_device_lr_is_read_at_each_launch_and_replays_in_a_cuda_graph(rng):
    """The kernel reads lr from the device: a fill between CUDA-graph replays changes the rate with no new capture."""
    cupy = __import__("cupy")
    params, grads = draw(rng, SHAPES), draw(rng, SHAPES)
    lr = cupy.full(1, 0.5)
    device_params, device_grads = on(cupy, params), on(cupy, grads)
    sgd_update_multi(device_params, device_grads, None, lr=lr)  # warm-up: compiles outside the capture
    expected = [p - 0.5 * g for p, g in zip(params, grads)]
    cupy.cuda.Device().synchronize()  # the work queued so far, on the default stream, is done
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # the fills below too: a non-blocking stream does not wait for the default stream
        stream.begin_capture()
        sgd_update_multi(device_params, device_grads, None, lr=lr)
        graph = stream.end_capture()
        for rate in (0.25, 0.125, 0.0):
            lr.fill(rate)
            graph.launch(stream=stream)
            expected = [p - rate * g for p, g in zip(expected, grads)]
        stream.synchronize()
    for i in range(len(params)):
        assert_close(device_params[i], expected[i], rtol=1e-12, atol=1e-14, name=f"param {i}")

    step, lr = cupy.full(1, 1, dtype=cupy.int64), cupy.full(1, 0.01)
    params, m, v = on(cupy, params), on(cupy, [np.zeros(s) for s in SHAPES]), on(cupy, [np.zeros(s) for s in SHAPES])
    expected = [[to_numpy(p), np.zeros(p.shape), np.zeros(p.shape)] for p in params]
    adam_update_multi(params, device_grads, m, v, None, step=step, lr=lr)
    expected = [adam_reference(e[0], g, e[1], e[2], None, 1, lr=0.01)[:3] for e, g in zip(expected, grads)]
    cupy.cuda.Device().synchronize()
    with stream:
        stream.begin_capture()
        adam_update_multi(params, device_grads, m, v, None, step=step, lr=lr)
        graph = stream.end_capture()
        for t in (2, 3):
            step.fill(t)
            lr.fill(0.01 / t)
            graph.launch(stream=stream)
            expected = [adam_reference(e[0], g, e[1], e[2], None, t, lr=0.01 / t)[:3] for e, g in zip(expected, grads)]
        stream.synchronize()
    for i in range(len(params)):
        assert_close(params[i], expected[i][0], rtol=1e-11, atol=1e-14, name=f"adam param {i}")


# ----------------------------------------------------------------------------------------------
# The launch plan and the kernel's table (host arithmetic: checked here without a GPU)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [
    [math.prod(shape) for shape in SHAPES],
    [0, 0, 1],
    [5] * 200,
    [10**8, 1, 2**31 - 1, 3] + [0] * 60 + [7] * 50,
    [2047, 2048, 2049, 4096 * 272 + 1],
    [40960] * 48,  # a full chunk whose blocks would not fit MAX_BLOCKS if its tensors' last blocks were ignored
])
def test_launch_plan_covers_every_element_once_within_the_table(sizes):
    """Simulate the kernel's block mapping: each non-empty tensor's elements are covered exactly once."""
    plan = optimizer.launch_plan(tuple(sizes))
    nonempty = [i for i, size in enumerate(sizes) if size]
    assert len(plan) == -(-len(nonempty) // optimizer.MAX_TENSORS)
    covered = {i: [] for i in nonempty}
    for indices, elements_per_block, block_tensor, block_start in plan:
        assert 0 < len(indices) <= optimizer.MAX_TENSORS and 0 < block_tensor.size <= optimizer.MAX_BLOCKS
        assert elements_per_block % optimizer.BLOCK_GRANULE == 0 and elements_per_block < 2**31
        assert block_tensor.dtype == np.uint8 and block_start.dtype == np.int32
        for slot, start in zip(block_tensor.tolist(), block_start.tolist()):
            tensor = indices[slot]
            assert 0 <= start < sizes[tensor]
            covered[tensor].append((start, min(start + elements_per_block, sizes[tensor])))
    assert sorted(covered) == nonempty
    for tensor, ranges in covered.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == sizes[tensor], tensor
        assert all(end == next_start for (_, end), (next_start, _) in zip(ranges, ranges[1:])), tensor


def test_kept_launches_pass_each_calls_addresses_and_hyper_parameters(driver, monkeypatch):
    """A multi-tensor update keeps one packed launch per chunk of its plan: each call writes its arrays' addresses
    into the packed table and its scalars into their slots. On the CPU with a stand-in driver that reads back each
    parameter's bytes, and stand-in arrays (their sizes and addresses)."""
    rng = np.random.default_rng()
    monkeypatch.setattr(_cuda, "function", lambda *names: SimpleNamespace(kernel=SimpleNamespace(ptr=0xF00D)))
    monkeypatch.setattr(optimizer, "_kept", {})
    sizes = [int(v) for v in rng.integers(1, 5000, 50)]
    sizes[7] = 0  # left out of the table

    def arrays(start):
        return [SimpleNamespace(size=n, dtype=np.dtype(np.float32), data=SimpleNamespace(ptr=start + 256 * i,
                                                                                          device_id=0))
                for i, n in enumerate(sizes)]

    f64, i32 = _cuda.f64, _cuda.i32
    lr, found_inf = SimpleNamespace(data=SimpleNamespace(ptr=0xAB00)), SimpleNamespace(data=SimpleNamespace(ptr=0xCD00))
    params, buffers = arrays(0x10_0000), arrays(0x20_0000)
    driver.sizes = [optimizer._TABLE.itemsize, 8, 8, 8, 8, 8, 4, 4, 4, 8]  # the table, lr, five doubles, three ints
    plan = optimizer.launch_plan(tuple(sizes))
    for step, (momentum, first_step, flag) in enumerate(((0.9, 1, None), (0.5, 0, found_inf))):
        grads = arrays(0x30_0000 + 0x1_0000 * step)  # new gradients each step
        scalars = (f64(0.0), f64(momentum), f64(0.25 * step), f64(rng.uniform()), i32(step), i32(1 - step),
                   i32(first_step))
        driver.launches.clear()
        optimizer._launch_chunks("sgd_update_multi", [params, grads, buffers], (lr, *scalars, flag))
        assert len(driver.launches) == len(plan) == 2 and len(optimizer._kept) == 1
        for (function, grid, block, *_, values, _), (indices, per_block, block_tensor, block_start) in \
                zip(driver.launches, plan):
            assert function == 0xF00D and grid == (block_tensor.size, 1, 1) and block == (optimizer.THREADS, 1, 1)
            table = np.frombuffer(values[0], optimizer._TABLE)[0]
            n = len(indices)
            for position, listed in enumerate((params, grads, buffers)):
                assert table["pointers"][position, :n].tolist() == [listed[i].data.ptr for i in indices]
            assert not table["pointers"][3:].any() and not table["pointers"][:, n:].any()
            assert table["sizes"][:n].tolist() == [sizes[i] for i in indices]
            assert table["block_tensor"][:block_tensor.size].tolist() == block_tensor.tolist()
            assert table["block_start"][:block_start.size].tolist() == block_start.tolist()
            assert table["elements_per_block"] == per_block
            assert int.from_bytes(values[1], "little") == lr.data.ptr
            assert [np.frombuffer(v, s.dtype)[0] for v, s in zip(values[2:9], scalars)] == list(scalars)
            assert int.from_bytes(values[9], "little") == (0 if flag is None else flag.data.ptr)


class DeviceArray(np.ndarray):
    """A stand-in CuPy array: NumPy's, on GPU ``device_id`` (what the argument checks read of a CuPy array)."""

    __module__ = "cupy_stand_in"  # backend.is_cuda_array: a CuPy type
    device_id = 0

    @property
    def data(self):
        return SimpleNamespace(device_id=self.device_id, ptr=self.ctypes.data)

    @property
    def device(self):
        return SimpleNamespace(id=self.device_id)


def test_steady_calls_check_only_the_new_gradients_and_still_refuse_bad_arrays(monkeypatch):
    """On the GPU an optimizer's step passes the same parameters and state arrays each step: a repeat checks only its
    gradients, and a bad array, new or beside new parameters, still gets its itemised error. Stand-in GPU arrays."""
    rng = np.random.default_rng()
    monkeypatch.setattr(optimizer, "_passed", {})
    reads = []
    device = operator.attrgetter("data.device_id")
    monkeypatch.setattr(optimizer, "_device", lambda array: (reads.append(1), device(array))[1])
    shapes = [(3, 5), (7,), (2, 3, 2, 2), (1,), (4, 4)]

    def on_gpu(shapes, dtype=np.float32):
        return [rng.standard_normal(shape).astype(dtype).view(DeviceArray) for shape in shapes]

    params, buffers = on_gpu(shapes), on_gpu(shapes)

    def check(params, grads, buffers):
        optimizer._check_lists(optimizer._multi_names, [("param", params), ("grad", grads),
                                                        ("momentum_buffer", buffers)])

    for expected_reads in (3 * len(shapes), len(shapes), len(shapes)):
        reads.clear()
        check(params, on_gpu(shapes), buffers)
        assert len(reads) == expected_reads
    other_device = on_gpu(shapes)
    other_device[2].device_id = 1
    transposed = on_gpu(shapes)
    transposed[4] = transposed[4].T
    bad = [
        (lambda: check(params, on_gpu(shapes[:1] + [(5, 3)] + shapes[2:]), buffers), ValueError,
         r"grads\[1\] must have params\[1\]'s shape \(7,\), got \(5, 3\)"),
        (lambda: check(params, on_gpu(shapes, np.float64), buffers), TypeError,
         r"grads\[0\] must have params\[0\]'s dtype float32, got float64"),
        (lambda: check(params, other_device, buffers), ValueError,
         r"grads\[2\] must be on params\[0\]'s device cuda:0, got cuda:1"),
        (lambda: check(params, transposed, buffers), ValueError, r"grads\[4\] must be a C-contiguous or channels-last"),
        (lambda: check(params, [np.zeros(s, np.float32) for s in shapes], buffers), ValueError,
         r"grads\[0\] must be on params\[0\]'s device cuda:0, got cpu"),
        # New parameters of other shapes beside the same buffers: the buffers no longer fit them.
        (lambda: check(on_gpu([(5, 3)] + shapes[1:]), on_gpu([(5, 3)] + shapes[1:]), buffers), ValueError,
         r"momentum_buffers\[0\] must have params\[0\]'s shape \(5, 3\), got \(3, 5\)"),
        (lambda: check(params, on_gpu(shapes), buffers[:3] + on_gpu([(2,), (4, 4)])), ValueError,
         r"momentum_buffers\[3\] must have params\[3\]'s shape"),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
        check(params, on_gpu(shapes), buffers)  # the good lists still pass


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_table_layout_matches_the_kernels_struct(tmp_path):
    """The NumPy dtype that builds the table has the C struct's size and field offsets, and the Python
    constants are the kernel's (host-compiled)."""
    source = _cuda.read_source("optimizer.cu") + """
#include <cstdio>
#include <cstddef>
int main() {
    std::printf("%zu %zu %zu %zu %zu %zu %d %d %d %d\\n", sizeof(TensorTable), offsetof(TensorTable, pointers),
                offsetof(TensorTable, sizes), offsetof(TensorTable, block_start),
                offsetof(TensorTable, elements_per_block), offsetof(TensorTable, block_tensor),
                LISTS, MAX_TENSORS, MAX_BLOCKS, THREADS);
}
"""
    (tmp_path / "layout.cu").write_text(source)
    fields = optimizer._TABLE.fields
    expected = ([optimizer._TABLE.itemsize] + [fields[name][1] for name in optimizer._TABLE.names]
                + [optimizer.LISTS, optimizer.MAX_TENSORS, optimizer.MAX_BLOCKS, optimizer.THREADS])
    binary = os.fspath(tmp_path / "layout")  # (pointers are 8 bytes for either SCALAR: one build is enough)
    subprocess.run(["nvcc", "-o", binary, os.fspath(tmp_path / "layout.cu")], check=True, capture_output=True,
                   timeout=120)
    printed = subprocess.run([binary], check=True, capture_output=True, text=True).stdout.split()
    assert [int(v) for v in printed] == expected
    # Adam's parameters (the table, three pointers and six doubles, three ints) fit CUDA's 4 KB.
    assert optimizer._TABLE.itemsize + 3 * 8 + 6 * 8 + 3 * 4 <= 4096


@pytest.mark.gpu
def test_gpu_one_launch_per_chunk_of_tensors(rng, monkeypatch):
    cupy = __import__("cupy")
    launches = []
    original, packed = _cuda.launch_blocks, _cuda.PackedLaunch.__call__  # a single update's launch, the kept ones
    monkeypatch.setattr(_cuda, "launch_blocks", lambda kernel, blocks, *args, **kwargs:
                        (launches.append(blocks), original(kernel, blocks, *args, **kwargs))[1])
    monkeypatch.setattr(_cuda.PackedLaunch, "__call__", lambda self, *arrays:
                        (launches.append(self.grid[0]), packed(self, *arrays))[1])
    nonempty = sum(1 for shape in SHAPES if math.prod(shape))
    chunks = -(-nonempty // optimizer.MAX_TENSORS)
    assert chunks == 2 < nonempty
    params = on(cupy, draw(rng, SHAPES))
    sgd_update_multi(params, on(cupy, draw(rng, SHAPES)), on(cupy, draw(rng, SHAPES)), lr=0.1, momentum=0.9)
    assert len(launches) == chunks and all(blocks <= optimizer.MAX_BLOCKS for blocks in launches)
    launches.clear()
    states = [on(cupy, [np.abs(a) for a in draw(rng, SHAPES)]) for _ in range(3)]
    adam_update_multi(params, on(cupy, draw(rng, SHAPES)), *states, step=2, lr=0.01, amsgrad=True)
    assert len(launches) == chunks
    launches.clear()
    sgd_update(params[6], params[6].copy(), lr=0.1)
    assert len(launches) == 1


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------
def error_cases(xp):
    p, g = xp.ones((2, 3)), xp.ones((2, 3))
    ps, gs = [p, xp.ones(4)], [g, xp.ones(4)]
    strided = xp.ones((3, 2)).T
    return [
        (lambda: sgd_update(strided, g, lr=0.1), ValueError, "param must be a C-contiguous or channels-last array"),
        (lambda: sgd_update(p, strided, lr=0.1), ValueError, "grad must be a C-contiguous or channels-last array"),
        (lambda: sgd_update(xp.ones((2, 3, 4, 5)).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2),
                            xp.ones((2, 3, 4, 5)), lr=0.1), ValueError,
         r"grad must be laid out as param \(C-contiguous or channels-last, strides \(480, 8, 120, 24\)\)"),
        (lambda: sgd_update(p, g, strided, lr=0.1, momentum=0.9), ValueError, "momentum_buffer must be a C-contig"),
        (lambda: sgd_update(p, g, None, lr=0.1, momentum=0.9), TypeError, "momentum_buffer must be a float32 or"),
        (lambda: sgd_update(xp.ones(3, dtype=xp.int64), xp.ones(3), lr=0.1), TypeError,
         "param must be a float32 or float64 array"),
        (lambda: sgd_update(p, g.astype(xp.float32), lr=0.1), TypeError,
         "grad must have param's dtype float64, got float32"),
        (lambda: sgd_update(p, xp.ones((3, 2)), lr=0.1), ValueError,
         r"grad must have param's shape \(2, 3\), got \(3, 2\)"),
        (lambda: sgd_update_multi(ps, [g, xp.ones(5)], None, lr=0.1), ValueError,
         r"grads\[1\] must have params\[1\]'s shape \(4,\), got \(5,\)"),
        (lambda: sgd_update_multi([p, xp.ones(4, dtype=xp.float32)], gs, None, lr=0.1), TypeError,
         r"params\[1\] must have params\[0\]'s dtype float64, got float32"),
        (lambda: sgd_update_multi(ps, gs[:1], None, lr=0.1), ValueError,
         r"grads must have one array per parameter \(2\), got 1"),
        (lambda: sgd_update_multi(ps, gs, None, lr=0.1, momentum=0.5), TypeError,
         "momentum_buffers must be a list or tuple of arrays, got NoneType"),
        (lambda: sgd_update_multi(p, g, None, lr=0.1), TypeError, "params must be a list or tuple of arrays"),
        (lambda: adam_update_multi(ps, gs, ps, [p, strided], None, step=1, lr=0.1), ValueError,
         r"exp_avg_sqs\[1\] must have params\[1\]'s shape|exp_avg_sqs\[1\] must be a C-contiguous"),
        (lambda: adam_update_multi(ps, gs, ps, gs, None, step=1, lr=0.1, amsgrad=True), TypeError,
         "max_exp_avg_sqs must be a list or tuple"),
        (lambda: adam_update_multi(ps, gs, ps, gs, [p, None], step=1, lr=0.1, amsgrad=True), TypeError,
         r"max_exp_avg_sqs\[1\] must be a float32 or float64 array"),
        (lambda: sgd_update(p, g, lr=-0.1), ValueError, "lr must be a finite number >= 0, got -0.1"),
        (lambda: sgd_update(p, g, lr=math.inf), ValueError, "lr must be a finite number >= 0, got inf"),
        (lambda: sgd_update(p, g, lr=math.nan), ValueError, "lr must be a finite number >= 0, got nan"),
        (lambda: sgd_update(p, g, lr=True), TypeError, "lr must be a number or a float64 array"),
        (lambda: sgd_update(p, g, lr=xp.ones(2)), TypeError, r"lr must be a number or a float64 array of shape \(\)"),
        (lambda: sgd_update(p, g, lr=xp.ones(1, dtype=xp.float32)), TypeError, "lr must be a number or a float64"),
        (lambda: sgd_update(p, g, lr=0.1, momentum=-0.9), ValueError, "momentum must be a finite number >= 0"),
        (lambda: sgd_update(p, g, lr=0.1, dampening=math.nan), ValueError, "dampening must be a finite number"),
        (lambda: sgd_update(p, g, lr=0.1, weight_decay=-1.0), ValueError, "weight_decay must be a finite number"),
        (lambda: sgd_update(p, g, lr=0.1, nesterov=True), ValueError, "nesterov momentum requires a momentum > 0"),
        (lambda: sgd_update(p, g, lr=0.1, maximize=1), TypeError, "maximize must be a bool, got 1"),
        (lambda: sgd_update(p, g, lr=0.1, first_step=None), TypeError, "first_step must be a bool"),
        (lambda: adam_update(p, g, p, g, step=0, lr=0.1), ValueError, "step must be an int >= 1, got 0"),
        (lambda: adam_update(p, g, p, g, step=1.0, lr=0.1), TypeError, "step must be an int or an array"),
        (lambda: adam_update(p, g, p, g, step=xp.ones(1, dtype=xp.int32), lr=0.1), TypeError,
         "step must be a number or a int64 or float64 array"),
        (lambda: adam_update(p, g, p, g, step=1, lr=0.1, beta1=1.0), ValueError, r"beta1 must be in \[0, 1\)"),
        (lambda: adam_update(p, g, p, g, step=1, lr=0.1, beta2=-0.5), ValueError, r"beta2 must be in \[0, 1\)"),
        (lambda: adam_update(p, g, p, g, step=1, lr=0.1, eps=-1e-8), ValueError, "eps must be a finite number"),
        (lambda: adam_update(p, g, p, g, step=1, lr=0.1, weight_decay=math.inf), ValueError, "weight_decay must be"),
        (lambda: adam_update(p, g, p, g, step=1, lr=0.1, amsgrad="yes"), TypeError, "amsgrad must be a bool"),
        (lambda: adam_update(p, g, p, g, step=1, lr=0.1, decoupled_weight_decay=0), TypeError,
         "decoupled_weight_decay must be a bool"),
        (lambda: adam_update(p, g, p, g, step=1, lr=0.1, amsgrad=True), TypeError,
         "max_exp_avg_sq must be a float32 or float64 array, got NoneType"),
    ]


def test_errors_name_the_argument(xp):
    for call, error, message in error_cases(xp):
        with pytest.raises(error, match=message):
            call()


def test_values_of_host_arrays_are_checked():
    """On NumPy the value of an lr or step array is at hand, so it is checked like a number."""
    p, g = np.ones(3), np.ones(3)
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got -1.0"):
        sgd_update(p, g, lr=np.array([-1.0]))
    with pytest.raises(ValueError, match="step must be an int >= 1, got 0"):
        adam_update(p, g, p.copy(), g.copy(), step=np.array(0), lr=0.1)


def test_nothing_is_updated_when_a_check_fails(xp):
    params = [xp.ones(3), xp.ones(3)]
    with pytest.raises(ValueError):
        sgd_update_multi(params, [xp.ones(3), xp.ones(4)], None, lr=0.1)
    for p in params:
        assert_close(p, np.ones(3), rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_devices_must_match(rng):
    cupy = __import__("cupy")
    p = cupy.ones(3)
    with pytest.raises(ValueError, match=r"grad must be on param's device cuda:0, got cpu"):
        sgd_update(p, np.ones(3), lr=0.1)
    with pytest.raises(ValueError, match=r"lr must be on params\[0\]'s device cuda:0, got cpu"):
        sgd_update_multi([p], [cupy.ones(3)], None, lr=np.ones(1))
    with pytest.raises(ValueError, match=r"step must be on param's device cpu, got cuda:0"):
        adam_update(np.ones(3), np.ones(3), np.ones(3), np.ones(3), step=cupy.ones(1, dtype=cupy.int64), lr=0.1)
