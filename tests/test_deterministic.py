"""The deterministic mode: minidnn.use_deterministic_algorithms, as torch's.

Under it, ``get``, ``find`` and the micro-batch planners choose only algorithms whose result does not
depend on scheduling, a forced non-deterministic algorithm raises (or warns), cached plans do not
outlive a change of the mode, and two training runs give bitwise-identical weights. On the CPU every
algorithm is deterministic, so the CPU tests use a stand-in: gemm's arithmetic declared
non-deterministic, as an algorithm with atomic additions would be; the GPU's own algorithms are
checked on ConvProblems that name the GPU (choosing needs no GPU) and, on a GPU, by running them.
"""
import json
import os
import re

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import models
from minidnn import optim
from minidnn.primitives import conv
from minidnn.primitives.conv import api, planner, plans, registry, selection
from minidnn.primitives.conv.problem import ConvProblem
from tests.helpers import assert_close, to_numpy
from tests.test_primitives_conv import model_problems

DIRECTIONS = ("forward", "backward_data", "backward_filter")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def restore_settings():
    before = dict(registry._defaults)
    yield
    registry._defaults.clear()
    registry._defaults.update(before)
    registry.clear_caches()


class Scheduled(registry.ConvAlgorithm):
    """gemm's arithmetic, declared non-deterministic in every direction."""

    name = "scheduled_gemm"
    deterministic = False

    def __init__(self):
        self.gemm = registry.get("gemm")

    def supports(self, problem, direction):
        return self.gemm.supports(problem, direction)

    def workspace_bytes(self, problem, direction):
        return self.gemm.workspace_bytes(problem, direction)

    def run(self, *args):
        self.gemm.run(*args)

    def backward_filter(self, x, dy, problem, out, accumulate, workspace):
        self.gemm.backward_filter(x, dy, problem, out, accumulate, workspace)


@pytest.fixture
def scheduled(monkeypatch, tmp_path):
    """The stand-in, registered and first in the rules' order; find's cache in a fresh directory."""
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(registry._algorithms, Scheduled.name, Scheduled())
    rules = selection.preference
    monkeypatch.setattr(selection, "preference", lambda problem, direction: [Scheduled.name] + rules(problem, direction))
    registry.clear_caches()
    selection.clear_cache()
    yield Scheduled.name
    registry.clear_caches()
    selection.clear_cache()


def problem(N=4, C=3, H=9, W=9, K=5, R=3, S=3, stride=1, device="cpu"):
    return ConvProblem(N, C, H, W, K, R, S, (stride, stride), (1, 1), (1, 1), 1, np.dtype(np.float32), device)


def observed_plans(run):
    """Every (direction, plan) the convolutions inside ``run()`` used."""
    seen = []
    plans.call_observer = lambda direction, problem, plan: seen.append((direction, plan))
    try:
        run()
    finally:
        plans.call_observer = None
    return seen


# ----------------------------------------------------------------------------------------------
# The switch
# ----------------------------------------------------------------------------------------------
def test_the_switch_has_torchs_names_and_checks_its_arguments():
    assert minidnn.are_deterministic_algorithms_enabled() is False
    minidnn.use_deterministic_algorithms(True)
    assert minidnn.are_deterministic_algorithms_enabled() is True
    assert registry.is_deterministic_algorithms_warn_only_enabled() is False
    minidnn.use_deterministic_algorithms(True, warn_only=True)
    assert registry.is_deterministic_algorithms_warn_only_enabled() is True
    minidnn.use_deterministic_algorithms(False)
    assert not minidnn.are_deterministic_algorithms_enabled()
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="mode must be a bool"):
            minidnn.use_deterministic_algorithms(bad)
    with pytest.raises(TypeError, match="warn_only must be a bool"):
        minidnn.use_deterministic_algorithms(True, warn_only=1)
    with conv.settings(deterministic=True):
        assert minidnn.are_deterministic_algorithms_enabled()
    assert not minidnn.are_deterministic_algorithms_enabled()


def test_the_mode_chooses_by_shape_on_the_gpu_unless_timing_is_asked_for():
    assert registry.benchmark("cuda") and not registry.benchmark("cpu")
    minidnn.use_deterministic_algorithms(True)
    assert not registry.benchmark("cuda")  # timing may rank algorithms differently from run to run
    conv.set_benchmark(True)
    assert registry.benchmark("cuda") and registry.benchmark("cpu")


# ----------------------------------------------------------------------------------------------
# get, find and forced algorithms
# ----------------------------------------------------------------------------------------------
def test_each_algorithm_says_which_directions_are_deterministic():
    gpu, cpu = problem(device="cuda"), problem()
    split_k = ("implicit_gemm", "implicit_gemm_nhwc", "implicit_gemm_wgmma")
    for name in split_k:
        implicit = registry.get(name)
        assert not implicit.is_deterministic(gpu, "backward_filter"), name  # split-K partial sums added with atomics
        assert implicit.is_deterministic(gpu, "forward") and implicit.is_deterministic(gpu, "backward_data"), name
        assert all(implicit.is_deterministic(cpu, d) for d in DIRECTIONS), name  # NumPy: no atomics
    for name, algorithm in registry.algorithms().items():
        if name not in split_k:
            assert all(algorithm.is_deterministic(p, d) for p in (gpu, cpu) for d in DIRECTIONS), name


def test_every_atomic_in_the_kernels_is_accounted_for():
    """Each atomic operation in the CUDA sources, and what it means for determinism: a new one must be
    judged (and its algorithm's flag set) before this list grows."""
    accounted = {
        # the "last block done" count of the per-channel reductions (batch norm, the bias gradient): an integer
        ("minidnn/primitives/channels.cuh", "last = atomicAdd(counter, 1u) == (unsigned int)(splits - 1);"),
        ("minidnn/primitives/conv/implicit_gemm.cu", "atomicAdd(out + r + c, value);"),  # the half build's
        ("minidnn/primitives/conv/implicit_gemm.cu", "atomicAdd(out + r + c, scalar_t(value));"),
        ("minidnn/primitives/conv/implicit_gemm_nhwc.cu",
         "if (row < rows && k < s.K) atomicAdd(sums + k * rows + row, acc[mi][ni][v]);"),
        ("minidnn/primitives/conv/implicit_gemm_wgmma.cu",
         "if (row0 + h * 8 < rows) atomicAdd(sums + k * rows + row0 + h * 8, acc[4 * i + 2 * h + o]);"),
    }
    found = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "minidnn")):
        for name in files:
            if name.endswith((".cu", ".cuh")):
                path = os.path.join(folder, name)
                for line in open(path, encoding="utf-8"):
                    code = line.split("//")[0]
                    if re.search(r"\batomic\w*\s*\(", code):
                        found.add((os.path.relpath(path, ROOT).replace(os.sep, "/"), code.strip()))
    assert found == accounted


def test_get_skips_the_non_deterministic_directions():
    strided = problem(N=64, C=16, H=32, W=32, K=32, stride=2, device="cuda")
    assert selection.get(strided, "backward_filter", 64 << 20).name == "implicit_gemm"
    minidnn.use_deterministic_algorithms(True)
    assert selection.get(strided, "backward_filter", 64 << 20).name == "gemm"
    assert selection.get(strided, "forward", 0).name == "implicit_gemm"  # its forward writes each output once
    assert selection.get(strided, "backward_filter", 0).name == "reference"
    for name in ("alexnet_caffe", "resnet18", "resnet20"):
        for p in _model_problems(name, "cuda"):
            for direction in DIRECTIONS:
                for limit in (0, 64 << 20):
                    assert selection.get(p, direction, limit).is_deterministic(p, direction), (name, direction)


def test_a_too_small_limit_runs_a_deterministic_algorithm_in_micro_batches_not_the_reference():
    strided = problem(N=64, C=16, H=32, W=32, K=32, stride=2, device="cuda")
    gemm = registry.get("gemm")
    limit = gemm.workspace_bytes(strided.with_batch(16), "backward_filter")  # a quarter of the batch fits
    minidnn.use_deterministic_algorithms(True)
    plan = api.make_plan(strided, "backward_filter", "auto", limit)
    assert plan.algorithms == ["gemm"] * 4 and [n for n, _ in plan.segments] == [16] * 4
    assert api.make_plan(strided, "backward_filter", "auto", 0).algorithms == ["reference"]  # nothing else fits
    minidnn.use_deterministic_algorithms(False)
    with conv.settings(benchmark=False):  # the rules, not find, which would time on a GPU
        assert api.make_plan(strided, "backward_filter", "auto", limit).algorithms == ["implicit_gemm"]


def test_timing_too_falls_back_to_micro_batches_rather_than_the_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))
    selection.clear_cache()
    # On the CPU implicit GEMM is deterministic; made not to be, a strided weight gradient under a limit
    # below gemm's whole-batch columns leaves find only the reference, as on the GPU.
    monkeypatch.setattr(type(registry.get("implicit_gemm")), "is_deterministic", lambda self, p, d: False)
    strided = problem(N=8, C=4, H=12, W=12, K=6, stride=2)
    limit = registry.get("gemm").workspace_bytes(strided.with_batch(2), "backward_filter")
    minidnn.use_deterministic_algorithms(True)
    with conv.settings(benchmark=True):
        assert [r.algorithm for r in selection.find(strided, "backward_filter", limit)] == ["reference"]
        plan = api.make_plan(strided, "backward_filter", "auto", limit)
    assert plan.algorithms == ["gemm"] * 4
    selection.clear_cache()


def test_find_measures_and_offers_only_deterministic_algorithms(scheduled, tmp_path):
    p = problem()
    assert scheduled in [r.algorithm for r in selection.find(p, "forward", 1 << 30)]
    minidnn.use_deterministic_algorithms(True)
    found = selection.find(p, "forward", 1 << 30)
    assert found and scheduled not in [r.algorithm for r in found]
    assert all(r.deterministic for r in found)
    # The flag comes from the code, not from the cache file: a file saying otherwise is not believed.
    minidnn.use_deterministic_algorithms(False)
    (path,) = tmp_path.glob("conv_find_cpu.json")
    content = json.loads(path.read_text())
    for entries in content["entries"].values():
        entries[scheduled][2] = True
    path.write_text(json.dumps(content))
    selection.clear_cache()
    assert {r.algorithm: r.deterministic for r in selection.find(p, "forward", 1 << 30)}[scheduled] is False
    minidnn.use_deterministic_algorithms(True)
    assert scheduled not in [r.algorithm for r in selection.find(p, "forward", 1 << 30)]


def test_a_forced_non_deterministic_algorithm_raises_or_warns(scheduled, rng):
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    minidnn.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=r"algo='scheduled_gemm' does not have a deterministic implementation.*"
                                           r"use_deterministic_algorithms\(True\)"):
        conv.conv2d_backward_filter(x, dy, (4, 3, 3, 3), 1, 1, algo=scheduled)
    with pytest.raises(RuntimeError, match="'implicit_gemm' does not have a deterministic implementation on cuda"):
        api.make_plan(problem(device="cuda"), "backward_filter", "implicit_gemm", 1 << 30)
    api.make_plan(problem(device="cuda"), "backward_data", "implicit_gemm", 1 << 30)  # deterministic: runs
    minidnn.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match="scheduled_gemm' does not have a deterministic implementation"):
        dw = conv.conv2d_backward_filter(x, dy, (4, 3, 3, 3), 1, 1, algo=scheduled)
    assert_close(dw, conv.conv2d_backward_filter(x, dy, (4, 3, 3, 3), 1, 1, algo="reference"), rtol=1e-4, atol=1e-4)
    minidnn.use_deterministic_algorithms(True)  # the plan made while only warning is not reused
    with pytest.raises(RuntimeError, match="scheduled_gemm"):
        conv.conv2d_backward_filter(x, dy, (4, 3, 3, 3), 1, 1, algo=scheduled)


def test_a_change_of_the_mode_invalidates_the_cached_plans(scheduled, rng):
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)

    def chosen():
        (direction, plan), = observed_plans(lambda: conv.conv2d_backward_filter(x, dy, (4, 3, 3, 3), 1, 1))
        return plan.algorithms

    with conv.settings(deterministic=True):  # the rules' next choice
        rules = [selection.get(problem(N=2, H=6, W=6, K=4), "backward_filter", registry.workspace_limit()).name]
    assert rules != [scheduled]
    assert chosen() == [scheduled]
    minidnn.use_deterministic_algorithms(True)
    assert chosen() == rules
    minidnn.use_deterministic_algorithms(True, warn_only=True)
    assert chosen() == rules
    minidnn.use_deterministic_algorithms(False)
    assert chosen() == [scheduled]
    with conv.settings(deterministic=True):
        assert chosen() == rules
    assert chosen() == [scheduled]


def test_the_micro_batch_planners_respect_the_mode(scheduled, rng):
    x = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
    dy = rng.standard_normal((4, 4, 6, 6)).astype(np.float32)

    def step():
        conv.conv2d_backward_filter(x, dy, (4, 3, 3, 3), 1, 1)

    def algorithms_of(seen):
        return {name for _, plan in seen for name in plan.algorithms}

    planner.reset_network()
    try:
        with conv.settings(microbatch="wr", batch_policy="all", deterministic=True):
            assert scheduled not in algorithms_of(observed_plans(step))
        with conv.settings(microbatch="wd", batch_policy="all"):
            step()
            planner.solve_network(1 << 30)
            solved = {name for plan in planner._solved.values() for name in plan.algorithms}
        if scheduled in solved:  # the WD plan chose the stand-in (by timing): the mode must not use it
            with conv.settings(microbatch="wd", deterministic=True):
                with pytest.warns(RuntimeWarning, match="algorithm the deterministic mode excludes"):
                    seen = observed_plans(step)
            assert scheduled not in algorithms_of(seen)
        # Made to choose it, whatever the timing: a solved plan of the stand-in alone.
        kernel = next(iter(planner._solved))
        planner._solved[kernel] = plans.single(registry.get(scheduled), kernel[0], kernel[1])
        registry.clear_caches()
        planner._warned.clear()
        with conv.settings(microbatch="wd", deterministic=True):
            with pytest.warns(RuntimeWarning, match="algorithm the deterministic mode excludes"):
                assert scheduled not in algorithms_of(observed_plans(step))
        with conv.settings(microbatch="wd"):
            assert algorithms_of(observed_plans(step)) == {scheduled}
    finally:
        planner.reset_network()


def _model_problems(name, device):
    """The model's distinct convolution problems at the batch it trains at (test_primitives_conv's recorder)."""
    batch = 128 if name in ("alexnet_caffe", "resnet20") else 64
    return model_problems(name, models.input_size(name), batch, device)


# ----------------------------------------------------------------------------------------------
# Whole training runs
# ----------------------------------------------------------------------------------------------
def train_weights(device, steps=3, batch=8):
    """ResNet-20 (3x3 and strided convolutions, batch norm) trained a few SGD steps from seed 0."""
    registry.clear_caches()
    selection.clear_cache()
    minidnn.manual_seed(0)
    model = models.create("resnet20").to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    rng = np.random.default_rng(1)
    used = set()

    def step():
        x = minidnn.tensor(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32), device=device)
        y = minidnn.tensor(rng.integers(0, 10, batch), device=device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(steps):
        for direction, plan in observed_plans(step):
            used.update((direction, name) for name in plan.algorithms)
    return {name: to_numpy(p.data).copy() for name, p in model.named_parameters()}, used


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_two_training_runs_under_the_mode_give_bitwise_identical_weights(device, monkeypatch):
    monkeypatch.setenv("MINIDNN_CACHE_DIR", "")  # nothing carried from one run to the next
    minidnn.use_deterministic_algorithms(True)
    first, used = train_weights(device, steps=3 if device == "cuda" else 1, batch=16 if device == "cuda" else 4)
    second, _ = train_weights(device, steps=3 if device == "cuda" else 1, batch=16 if device == "cuda" else 4)
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    probe = problem(device=device)
    assert all(registry.get(name).is_deterministic(probe, direction) for direction, name in used)
    if device == "cuda":
        assert ("backward_filter", "implicit_gemm") not in used


@pytest.mark.gpu
def test_training_without_the_mode_runs():
    weights, used = train_weights("cuda", steps=2, batch=16)
    assert all(np.isfinite(w).all() for w in weights.values()) and used


@pytest.mark.parametrize("xp", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_every_deterministic_direction_repeats_bitwise(xp, rng):
    """A necessary condition, on a reduction long enough that a scheduling-dependent sum would show:
    each algorithm's deterministic directions give the same bits three times over."""
    module = np if xp == "numpy" else minidnn.backend.cupy()
    device = "cpu" if xp == "numpy" else "cuda"
    for shape in ((16, 8, 16, 16, 8, 3, 3, 1), (16, 8, 16, 16, 8, 3, 3, 2), (8, 6, 20, 20, 4, 5, 5, 1),
                  (16, 8, 16, 16, 8, 1, 1, 1)):
        N, C, H, W, K, R, S, stride = shape
        p = ConvProblem(N, C, H, W, K, R, S, (stride, stride), ((R - 1) // 2,) * 2 if R > 1 else (0, 0), (1, 1), 1,
                        np.dtype(np.float32), device)
        x = module.asarray(rng.standard_normal(p.x_shape).astype(np.float32))
        w = module.asarray(rng.standard_normal(p.w_shape).astype(np.float32))
        dy = module.asarray(rng.standard_normal(p.y_shape).astype(np.float32))
        inputs = {"forward": (x, w, p.y_shape), "backward_data": (dy, w, p.x_shape),
                  "backward_filter": (x, dy, p.w_shape)}
        for name, algorithm in registry.algorithms().items():
            for direction in DIRECTIONS:
                if not algorithm.supports(p, direction) or not algorithm.is_deterministic(p, direction):
                    continue
                first, second, out_shape = inputs[direction]
                results = []
                for _ in range(3):
                    out = module.empty(out_shape, dtype=np.float32)
                    size = algorithm.workspace_bytes(p, direction)
                    workspace = module.empty(size, dtype=np.uint8) if size else None
                    algorithm.run(direction, first, second, p, out, False, workspace)
                    results.append(to_numpy(out))
                for again in results[1:]:
                    np.testing.assert_array_equal(results[0], again, err_msg=f"{name} {direction} {shape}")


def test_train_py_deterministic_sets_the_mode(tmp_path, monkeypatch):
    import train

    monkeypatch.setenv("MINIDNN_DATA", str(tmp_path / "data"))
    train.main(["--model", "tiny_cnn", "--train-size", "40", "--test-size", "20", "--batch-size", "8", "--workers",
                "0", "--epochs", "1", "--max-steps", "1", "--deterministic", "--out", str(tmp_path / "run")])
    assert minidnn.are_deterministic_algorithms_enabled()
    train.main(["--model", "tiny_cnn", "--train-size", "40", "--test-size", "20", "--batch-size", "8", "--workers",
                "0", "--epochs", "1", "--max-steps", "1", "--out", str(tmp_path / "again")])
    assert not minidnn.are_deterministic_algorithms_enabled()
