"""Whole models on the GPU: the same training steps give the same losses as on the CPU; memory stats.

All marked ``gpu``: they skip cleanly on a machine without CUDA.
"""
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import models
from minidnn import backend, optim
from minidnn.primitives import _cuda
from minidnn.primitives.conv import step_choice

pytestmark = pytest.mark.gpu


def losses_of(name, device, image, batch, steps, classes=10):
    minidnn.manual_seed(0)
    model = models.create(name, num_classes=classes).to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = minidnn.tensor(rng.standard_normal((batch, 3, image, image)).astype(np.float32), device=device)
        y = minidnn.tensor(rng.integers(0, classes, batch), device=device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses)


@pytest.mark.parametrize("name, image, batch", [("resnet20", 32, 16), ("alexnet_caffe", 227, 4), ("alexnet", 224, 4)])
def test_training_steps_match_the_cpu(name, image, batch):
    # Dropout masks are equal on both devices (counter-based generator), so the runs are comparable.
    cpu = losses_of(name, "cpu", image, batch, steps=4)
    gpu = losses_of(name, "cuda", image, batch, steps=4)
    np.testing.assert_allclose(gpu, cpu, rtol=2e-3, atol=1e-4)


def test_peak_memory_is_a_high_water_mark():
    cupy = backend.cupy()
    _cuda.reset_peak_memory_stats()
    before = _cuda.memory_allocated()
    big = cupy.empty(64 << 20, dtype=cupy.uint8)
    del big
    after = _cuda.memory_allocated()
    assert after == before
    assert _cuda.max_memory_allocated() >= before + (64 << 20)
    _cuda.reset_peak_memory_stats()
    assert _cuda.max_memory_allocated() == _cuda.memory_allocated()
    stats = minidnn.cuda.memory_stats()
    assert stats["reserved"] >= stats["allocated"]


SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def test_no_host_synchronisation_inside_a_training_step():
    """Queue a one-second busy kernel, then a whole training step: if the step returns to the host
    long before the GPU is free, nothing in it waited for the GPU (no .item(), no copy to the host). The steady
    state's step: the warm-up runs until the convolutions' whole-step trial (conv/step_choice.py) has settled, whose
    timed steps synchronise on purpose (from the third step of a process where find's choices offer a trade)."""
    import time

    cupy = backend.cupy()
    step_choice.clear()  # a trial of this step's own, not one that a test before it left unsettled
    minidnn.manual_seed(0)
    model = models.create("resnet20").to("cuda")
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = minidnn.randn(8, 3, 32, 32, device="cuda")
    y = minidnn.tensor(np.arange(8) % 10, device="cuda")

    def step():
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(2):  # warm up: kernels compile, buffers exist
        step()
    for _ in range(100):  # and the whole-step trial, if one runs, times its sets and settles
        if not step_choice.running():
            break
        step()
    assert not step_choice.running(), "the whole-step trial did not settle in 100 steps"
    cupy.cuda.Device().synchronize()
    spin = cupy.RawKernel(SPIN, "spin")
    spin((1,), (1,), (np.int64(2_000_000_000),))  # about one second at the H200's ~2 GHz
    start = time.perf_counter()
    loss = step()
    host_seconds = time.perf_counter() - start
    cupy.cuda.Device().synchronize()
    gpu_seconds = time.perf_counter() - start
    assert gpu_seconds > 0.5, "the busy kernel did not keep the GPU busy; the test proves nothing"
    assert host_seconds < 0.5 * gpu_seconds, f"the step waited for the GPU ({host_seconds:.3f} s of {gpu_seconds:.3f} s)"
    assert np.isfinite(loss.item())


def test_tf32_switch_changes_float32_products():
    cupy = backend.cupy()
    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.standard_normal((512, 512)).astype(np.float32))
    exact = cupy.asnumpy(a.astype(cupy.float64) @ a.astype(cupy.float64))
    with _cuda.tf32(False):
        fp32 = cupy.asnumpy(a @ a)
    with _cuda.tf32(True):
        tf32 = cupy.asnumpy(a @ a)
    error_fp32 = np.abs(fp32 - exact).max()
    error_tf32 = np.abs(tf32 - exact).max()
    assert error_tf32 > 10 * error_fp32  # 10-bit mantissas are visibly coarser
    assert not _cuda.allow_tf32()
