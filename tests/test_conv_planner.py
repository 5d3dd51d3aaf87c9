"""The micro-batch planner: WR and WD against brute-force enumeration, execution against the reference, the CLI.

The dynamic programmes are checked on random synthetic cost tables (small batches, few algorithms,
small integer times and workspaces so that ties are common) against an enumeration of every split
of the batch and every algorithm per micro-batch, written here independently of the planner.
Execution is checked on real arrays in float64: a plan that mixes algorithms across micro-batches
(made through ``planner.plan`` with a synthetic ``find``) against the float64 reference algorithm.
"""
import itertools
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import conv
from minidnn.primitives.conv import planner, plans, registry, selection
from minidnn.primitives.conv.selection import AlgoPerf
from tests.helpers import assert_close, to_numpy
from tools import plan as plan_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MiB = 1 << 20
DIRECTIONS = ("forward", "backward_data", "backward_filter")


# ----------------------------------------------------------------------------------------------
# Brute force, independent of the planner
# ----------------------------------------------------------------------------------------------
def splits(batch, sizes):
    """Every multiset of ``sizes`` that sums to ``batch``, as a non-increasing tuple."""
    if batch == 0:
        yield ()
        return
    for size in sorted(sizes, reverse=True):
        if size <= batch:
            for rest in splits(batch - size, [s for s in sizes if s <= size]):
                yield (size,) + rest


def every_plan(costs, batch, limit):
    """(time, micro-batches, workspace) of every split and every algorithm per micro-batch within ``limit``."""
    for split in splits(batch, list(costs)):
        menus = [[p for p in costs[size] if p.workspace_bytes <= limit] for size in split]
        for choice in itertools.product(*menus):
            yield sum(p.time_ms for p in choice), len(choice), max(p.workspace_bytes for p in choice)


def dominated_free(points):
    """The (time, workspace) pairs no other pair beats: brute force over all pairs."""
    pairs = set(points)
    return {(t, w) for t, w in pairs if not any(t2 <= t and w2 <= w and (t2, w2) != (t, w) for t2, w2 in pairs)}


def random_table(rng, sizes, algorithms=3, zero_workspace=True):
    """{size: [AlgoPerf]} with small integer times and workspaces (ties are common); with
    ``zero_workspace`` the first algorithm needs no workspace at any size."""
    return {size: [AlgoPerf(f"a{i}", float(rng.integers(1, 3 * size + 3)),
                            0 if (i == 0 and zero_workspace) else int(rng.integers(0, 6)), True)
                   for i in range(algorithms)]
            for size in sizes}


def check_option(option, costs, batch, limit):
    """The option is a real plan: its segments cover the batch with measured (size, algorithm) pairs
    within the limit, and its time and workspace are theirs."""
    assert sum(images for images, _ in option.segments) == batch
    perfs = [next(p for p in costs[images] if p.algorithm == name) for images, name in option.segments]
    assert all(p.workspace_bytes <= limit for p in perfs)
    assert option.time_ms == pytest.approx(sum(p.time_ms for p in perfs), rel=1e-12)
    assert option.workspace_bytes == max(p.workspace_bytes for p in perfs)
    assert [images for images, _ in option.segments] == sorted((i for i, _ in option.segments), reverse=True)


# ----------------------------------------------------------------------------------------------
# The pure functions
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch, policy, expected", [
    (1, "powers_of_two", [1]), (7, "powers_of_two", [1, 2, 4, 7]), (8, "powers_of_two", [1, 2, 4, 8]),
    (256, "powers_of_two", [1, 2, 4, 8, 16, 32, 64, 128, 256]), (6, "all", [1, 2, 3, 4, 5, 6]),
    (6, "undivided", [6]), (1, "all", [1]),
])
def test_candidate_sizes(batch, policy, expected):
    assert planner.candidate_sizes(batch, policy) == expected


def test_candidate_sizes_refuse_bad_arguments():
    with pytest.raises(ValueError, match="batch_policy"):
        planner.candidate_sizes(8, "powerOfTwo")
    with pytest.raises(ValueError, match="batch must be >= 1"):
        planner.candidate_sizes(0, "all")


def test_pareto_front_keeps_exactly_the_undominated_points():
    rng = np.random.default_rng(1)
    for _ in range(200):
        perfs = [AlgoPerf(f"a{i}", float(rng.integers(1, 6)), int(rng.integers(0, 5)), True)
                 for i in range(int(rng.integers(1, 9)))]
        front = planner.pareto_front(perfs)
        pairs = [(p.time_ms, p.workspace_bytes) for p in front]
        assert sorted(pairs) == sorted(set(pairs)), "identical points are kept once"
        assert set(pairs) == dominated_free((p.time_ms, p.workspace_bytes) for p in perfs)
        assert [p.workspace_bytes for p in front] == sorted(p.workspace_bytes for p in front)


def test_wr_is_optimal_against_brute_force_with_its_tie_breaks():
    """Fastest; on a tie in time, fewest micro-batches; then least workspace. Infeasible: a clear error."""
    rng = np.random.default_rng(2)
    for trial in range(150):
        batch = int(rng.integers(1, 7))
        sizes = sorted({batch} | {int(s) for s in rng.integers(1, batch + 1, size=int(rng.integers(0, 4)))})
        costs = random_table(rng, sizes, zero_workspace=trial % 3 != 0)
        limit = int(rng.integers(0, 6))
        plans = list(every_plan(costs, batch, limit))
        if not plans:
            with pytest.raises(ValueError, match="fits a workspace limit"):
                planner.wr_plan(costs, batch, limit)
            continue
        option = planner.wr_plan(costs, batch, limit)
        check_option(option, costs, batch, limit)
        assert (option.time_ms, len(option.segments), option.workspace_bytes) == min(plans), (costs, batch, limit)


def test_wd_front_equals_the_brute_force_front_of_every_split():
    rng = np.random.default_rng(3)
    for trial in range(120):
        batch = int(rng.integers(1, 7))
        sizes = sorted({batch} | {int(s) for s in rng.integers(1, batch + 1, size=int(rng.integers(0, 4)))})
        costs = random_table(rng, sizes, zero_workspace=trial % 4 != 0)
        budget = int(rng.integers(0, 6))
        front = planner.wd_front(costs, batch, budget)
        for option in front:
            check_option(option, costs, batch, budget)
        expected = dominated_free((t, w) for t, _, w in every_plan(costs, batch, budget))
        assert [(o.time_ms, o.workspace_bytes) for o in front] == sorted(expected, key=lambda p: p[1])


def test_wd_front_reproduces_mu_cudnn_dp_test():
    """spcl/ucudnn test/dp.cpp: B = 256, powers of two, a fast algorithm 0.1·b + 0.01 ms with 1 MiB per
    image and a slow one 10·b + 0.1 ms with 1 byte per image, under 64 MiB (μ-cuDNN keeps a config
    only if its workspace is strictly below the limit, hence 64 MiB − 1 here): its 15 expected lines."""
    costs = {b: [AlgoPerf("fast", 0.1 * b + 0.01, b * MiB, True), AlgoPerf("slow", 10 * b + 0.1, b, True)]
             for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    front = sorted(planner.wd_front(costs, 256, 64 * MiB - 1), key=lambda o: o.time_ms)
    lines = [f"{o.time_ms:.2f} {o.workspace_bytes} {len(o.segments)}" for o in front]
    assert lines == ["25.68 33554432 8", "25.76 16777216 16", "25.92 8388608 32", "26.24 4194304 64",
                     "26.88 2097152 128", "28.16 1048576 256", "2560.10 256 1", "2560.20 128 2", "2560.40 64 4",
                     "2560.80 32 8", "2561.60 16 16", "2563.20 8 32", "2566.40 4 64", "2572.80 2 128",
                     "2585.60 1 256"]


def test_wd_front_runs_wr_about_once_per_front_point(monkeypatch):
    """The walk down the workspace values skips every limit that would return the same plan (a
    guard against running WR at every one of them: |sizes| × |algorithms| runs)."""
    costs = {b: [AlgoPerf(f"a{i}", (1 + 0.3 * i) ** -1 * b + 0.05, i * b * 1000, True) for i in range(6)]
             for b in planner.candidate_sizes(64, "powers_of_two")}
    runs = []
    real = planner._best_split
    monkeypatch.setattr(planner, "_best_split", lambda fastest, batch: runs.append(1) or real(fastest, batch))
    front = planner.wd_front(costs, 64, 10**9)
    assert len(runs) <= len(front) + 1 < 7 * 5


def test_wd_solve_is_optimal_against_brute_force():
    """Σ count·time minimal with Σ count·workspace within the budget (on a tie, less workspace);
    an infeasible budget is a clear error."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        fronts = [[planner.Option(float(rng.integers(1, 8)), int(rng.integers(0, 7)), ((1, f"k{k}o{o}"),))
                   for o in range(int(rng.integers(1, 5)))] for k in range(int(rng.integers(1, 5)))]
        counts = [int(c) for c in rng.integers(1, 4, size=len(fronts))]
        budget = int(rng.integers(0, 25))
        feasible = [(sum(c * o.time_ms for c, o in zip(counts, pick)), sum(c * o.workspace_bytes for c, o in
                                                                           zip(counts, pick)))
                    for pick in itertools.product(*fronts)]
        feasible = [p for p in feasible if p[1] <= budget]
        if not feasible:
            with pytest.raises(ValueError, match="infeasible"):
                planner.wd_solve(fronts, budget, counts)
            continue
        chosen = planner.wd_solve(fronts, budget, counts)
        assert all(option in front for option, front in zip(chosen, fronts))
        got = (sum(c * o.time_ms for c, o in zip(counts, chosen)),
               sum(c * o.workspace_bytes for c, o in zip(counts, chosen)))
        assert got == min(feasible)


def test_wd_solve_refuses_bad_arguments():
    option = planner.Option(1.0, 0, ((1, "a"),))
    with pytest.raises(ValueError, match="one entry per kernel"):
        planner.wd_solve([[option]], 10, [1, 1])
    with pytest.raises(ValueError, match="at least one option"):
        planner.wd_solve([[option], []], 10)
    with pytest.raises(TypeError, match="budget must be an int"):
        planner.wd_solve([[option]], 1.5)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        planner.wd_solve([[option]], -1)


def test_wd_at_the_summed_wr_limits_is_never_slower_than_wr():
    rng = np.random.default_rng(5)
    for _ in range(60):
        kernels = int(rng.integers(1, 5))
        batches = [int(b) for b in rng.integers(1, 17, size=kernels)]
        tables = [{b: [AlgoPerf(f"a{i}", float(rng.uniform(0.2, 2)) * b ** rng.uniform(0.6, 1.0),
                                0 if i == 0 else int(rng.integers(1, 5000)) * b, True) for i in range(4)]
                   for b in planner.candidate_sizes(batch, "powers_of_two")} for batch in batches]
        counts = [int(c) for c in rng.integers(1, 4, size=kernels)]
        limit = int(rng.integers(0, 40000))
        wr = [planner.wr_plan(table, batch, limit) for table, batch in zip(tables, batches)]
        budget = limit * sum(counts)
        wd = planner.wd_solve([planner.wd_front(t, b, budget) for t, b in zip(tables, batches)], budget, counts)
        assert sum(c * o.workspace_bytes for c, o in zip(counts, wd)) <= budget
        assert planner.total_time(wd, counts) <= planner.total_time(wr, counts) * (1 + 1e-12)


def test_a_limit_below_every_algorithm_but_the_zero_workspace_one():
    costs = {b: [AlgoPerf("fast", 1.0 * b, 100 * b, True), AlgoPerf("none", 5.0 * b, 0, True)] for b in (1, 2, 4, 7)}
    for limit in (0, 99):
        option = planner.wr_plan(costs, 7, limit)
        assert option.segments == ((7, "none"),) and option.workspace_bytes == 0
        assert [o.segments for o in planner.wd_front(costs, 7, limit)] == [((7, "none"),)]
    assert planner.wr_plan(costs, 7, 100).segments == ((1, "fast"),) * 7


def test_batch_one_is_one_call():
    costs = {1: [AlgoPerf("a", 2.0, 10, True), AlgoPerf("b", 1.0, 20, True)]}
    assert planner.wr_plan(costs, 1, 20) == planner.Option(1.0, 20, ((1, "b"),))
    assert planner.wr_plan(costs, 1, 19) == planner.Option(2.0, 10, ((1, "a"),))
    assert planner.Option(3.0, 0, ((4, "a"), (4, "a"), (2, "b"))).describe() == "2x4 a + 2 b"


# ----------------------------------------------------------------------------------------------
# Execution: micro-batches with different algorithms give the undivided result
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_plans():
    """No plan, registered kernel or solved network leaks into or out of a test."""
    planner.reset_network()
    yield
    planner.reset_network()
    plans.call_observer = None


def synthetic_find(times):
    """A ``find`` whose times come from ``times`` {(micro-batch size, algorithm): ms}; workspaces are
    the algorithms' own."""
    def find(problem, direction, workspace_limit):
        perfs = []
        for (size, name), ms in times.items():
            algorithm = registry.get(name)
            if size == problem.N and algorithm.supports(problem, direction):
                workspace = algorithm.workspace_bytes(problem, direction)
                if workspace <= workspace_limit:
                    perfs.append(AlgoPerf(name, ms, workspace, algorithm.deterministic))
        return sorted(perfs, key=lambda p: (p.time_ms, p.workspace_bytes))
    return find


# With these times the best split of 7 under powers_of_two is 4 gemm + 2 reference + 1 gemm (7.7 ms;
# 2+2+2+1 takes 8.1, 4+1+1+1 takes 8.5, the whole batch 50).
MIXED = {(7, "gemm"): 50.0, (7, "reference"): 50.0, (4, "gemm"): 4.0, (4, "reference"): 10.0,
         (2, "gemm"): 5.0, (2, "reference"): 2.2, (1, "gemm"): 1.5, (1, "reference"): 3.0}
# x (7, 4, 9, 8), w (6, 2, 3, 2): grouped, strided, unevenly padded.
CONV_ARGS = dict(stride=(2, 1), padding=(1, 0), dilation=1, groups=2)


def run(direction, x, w, dy, **settings):
    """One direction of the test convolution into an output poisoned with NaN (unwritten elements show)."""
    out_shape = {"forward": dy.shape, "backward_data": x.shape, "backward_filter": w.shape}[direction]
    out = backend.get_array_module(x).full(out_shape, np.nan)
    if direction == "forward":
        return conv.conv2d_forward(x, w, **CONV_ARGS, out=out, **settings)
    if direction == "backward_data":
        return conv.conv2d_backward_data(dy, w, x.shape, **CONV_ARGS, out=out, **settings)
    return conv.conv2d_backward_filter(x, dy, w.shape, **CONV_ARGS, out=out, **settings)


def test_micro_batches_with_different_algorithms_equal_the_undivided_convolution(fresh_plans, monkeypatch, xp, rng):
    monkeypatch.setattr(selection, "find", synthetic_find(MIXED))
    x, w = xp.asarray(rng.standard_normal((7, 4, 9, 8))), xp.asarray(rng.standard_normal((6, 2, 3, 2)))
    dy = xp.asarray(rng.standard_normal((7, 6, 5, 7)))
    seen = []
    plans.call_observer = lambda direction, problem, plan: seen.append(plan)
    for direction in DIRECTIONS:
        with conv.settings(algo="auto", microbatch="wr", batch_policy="powers_of_two", workspace_limit=1 << 30):
            got = run(direction, x, w, dy)
        assert [(n, a.name) for n, a in seen[-1].segments] == [(4, "gemm"), (2, "reference"), (1, "gemm")]
        assert_close(got, run(direction, *map(to_numpy, (x, w, dy)), algo="reference"), name=direction)


def test_a_limit_below_every_algorithm_that_needs_workspace_runs_without_one(fresh_plans, xp, rng, tmp_path,
                                                                             monkeypatch):
    """Real find (batch 1, then a prime batch) under a limit of 0 bytes."""
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))
    selection.clear_cache()
    device = "cpu" if xp is np else "cuda"
    w = xp.asarray(rng.standard_normal((6, 2, 3, 2)))
    for batch in (1, 7):
        x = xp.asarray(rng.standard_normal((batch, 4, 9, 8)))
        dy = xp.asarray(rng.standard_normal((batch, 6, 5, 7)))
        for direction in DIRECTIONS:
            problem = conv.ConvProblem(batch, 4, 9, 8, 6, 3, 2, (2, 1), (1, 0), (1, 1), 2, np.dtype(np.float64), device)
            made = planner.plan(problem, direction, 0, "wr", "powers_of_two")
            assert made.workspace_bytes == 0
            assert all(a.workspace_bytes(problem.with_batch(n), direction) == 0 for n, a in made.segments)
            assert sum(n for n, _ in made.segments) == batch
            with conv.settings(algo="auto", microbatch="wr", workspace_limit=0):
                got = run(direction, x, w, dy)
            assert_close(got, run(direction, *map(to_numpy, (x, w, dy)), algo="reference"), name=direction)
    selection.clear_cache()


# ----------------------------------------------------------------------------------------------
# WD across a network: register, solve, one shared arena, new shapes, reset
# ----------------------------------------------------------------------------------------------
def test_wd_registers_solves_and_runs_every_kernel_from_one_arena(fresh_plans, monkeypatch, xp, rng):
    times = dict(MIXED)
    times.update({(6, "gemm"): 30.0, (6, "reference"): 40.0})
    monkeypatch.setattr(selection, "find", synthetic_find(times))
    w = xp.asarray(rng.standard_normal((6, 2, 3, 2)))
    inputs = {batch: tuple(xp.asarray(rng.standard_normal(shape)) for shape in ((batch, 4, 9, 8), (batch, 6, 5, 7)))
              for batch in (7, 6, 4)}
    seen = []
    plans.call_observer = lambda direction, problem, plan: seen.append(((problem, direction), plan))

    def step(batch, limit=1 << 30):
        x, dy = inputs[batch]
        with conv.settings(algo="auto", microbatch="wd", workspace_limit=limit):
            return {direction: run(direction, x, w, dy) for direction in DIRECTIONS}

    step(7)
    step(6)
    assert len(planner._registered) == 6 and all(plan.arena is None for _, plan in seen)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        planner.solve_network(-1)
    gemm_workspace = {kernel: registry.get("gemm").workspace_bytes(kernel[0].with_batch(4), kernel[1])
                      for kernel in planner._registered}
    budget = sum(gemm_workspace.values()) - 1  # not every kernel can have its 4-image gemm
    chosen = planner.solve_network(budget, {kernel: 2 for kernel in planner._registered})
    assert set(chosen) == set(planner._registered)
    assert 2 * sum(option.workspace_bytes for option in chosen.values()) <= budget
    seen.clear()
    results = step(7)
    results6 = step(6)
    arenas = {id(plan.arena) for _, plan in seen if plan.workspace_bytes}
    assert len(arenas) == 1, "one arena for every kernel"
    arena = next(plan.arena for _, plan in seen if plan.workspace_bytes)
    assert backend.get_array_module(arena) is xp and arena.dtype == np.uint8
    assert arena.size == max(plan.workspace_bytes for _, plan in seen)
    for kernel, plan in seen:
        assert tuple((n, a.name) for n, a in plan.segments) == chosen[kernel].segments
    for batch, got in ((7, results), (6, results6)):
        x, dy = inputs[batch]
        for direction in DIRECTIONS:
            assert_close(got[direction], run(direction, *map(to_numpy, (x, w, dy)), algo="reference"), name=direction)

    # A shape that appears after the solve: WR until the next solve, with one warning.
    seen.clear()
    with pytest.warns(RuntimeWarning, match="after solve_network"):
        new = step(4)["forward"]
    assert seen[0][1].arena is None and seen[0][1].segments == ((4, registry.get("gemm")),)
    assert_close(new, run("forward", *map(to_numpy, (inputs[4][0], w, inputs[4][1])), algo="reference"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(4, limit=1 << 29)  # a new plan key: plan() runs again, and stays quiet
    planner.reset_network()
    assert not planner._registered
    with pytest.raises(ValueError, match="no convolution has run"):
        planner.solve_network(budget)


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def find_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))
    selection.clear_cache()
    planner.reset_network()
    yield tmp_path
    selection.clear_cache()
    planner.reset_network()


TINY = ["tiny_cnn", "--batch", "3", "--device", "cpu", "--image-size", "12"]


def test_cli_prints_the_wd_plan_of_a_tiny_model(find_cache, capsys):
    assert plan_cli.main(TINY + ["--workspace-limit", "64KiB", "--microbatch", "wd"]) == 0
    out = capsys.readouterr().out
    for text in ("features.0", "features.4", "features.8", "forward", "backward_data", "backward_filter", "total:",
                 "of the 64.0 KiB budget", "shared arena"):
        assert text in out, text
    assert "features.0  backward_data" not in out  # the input needs no gradient


@pytest.mark.gpu
def test_cli_plans_on_the_gpu(find_cache, capsys):
    args = ["tiny_cnn", "--batch", "6", "--device", "cuda", "--image-size", "20", "--workspace-limit", "256KiB"]
    for mode in ("wd", "wr"):
        assert plan_cli.main(args + ["--microbatch", mode]) == 0
        out = capsys.readouterr().out
        assert ", cuda, float32" in out and "features.8  backward_filter" in out and "total:" in out


def test_cli_wr_plan_and_trade_off_chart(find_cache, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    chart = tmp_path / "layer.png"
    code = plan_cli.main(TINY + ["--workspace-limit", "1MiB", "--microbatch", "wr", "--batch-policy", "all",
                                 "--png", str(chart), "--layer", "features.4"])
    assert code == 0
    assert "per call (limit 1.0 MiB)" in capsys.readouterr().out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_limit_zero_falls_back_to_zero_workspace_algorithms(find_cache, capsys):
    assert plan_cli.main(TINY + ["--workspace-limit", "0", "--microbatch", "wr"]) == 0
    out = capsys.readouterr().out
    assert "no algorithm that needs workspace fits 0 B" in out
    rows = [line for line in out.splitlines() if line.startswith("features.")]
    assert rows and all(" 0 B" in row for row in rows)


@pytest.mark.parametrize("limit", ["8 MB", "-1", "64mb", "1.5MiB"])
def test_cli_refuses_malformed_limits_in_one_line(limit, capsys):
    assert plan_cli.main(TINY + ["--workspace-limit", limit, "--microbatch", "wd"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--workspace-limit" in error and repr(limit) in error


def test_cli_refuses_an_unknown_layer_and_a_lone_png(find_cache, capsys, tmp_path):
    assert plan_cli.main(TINY + ["--workspace-limit", "1MiB", "--microbatch", "wd", "--layer", "features.0"]) == 2
    assert "--png and --layer go together" in capsys.readouterr().err
    pytest.importorskip("matplotlib")  # without it, --png is refused first (its own clear message)
    assert plan_cli.main(TINY + ["--workspace-limit", "1MiB", "--microbatch", "wd", "--png", str(tmp_path / "a.png"),
                                 "--layer", "conv9"]) == 2
    assert "no convolution 'conv9'" in capsys.readouterr().err


def test_cli_exits_non_zero_on_a_bad_limit():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plan.py"), *TINY, "--workspace-limit", "8 MB",
                           "--microbatch", "wd"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("tools/plan.py: error: --workspace-limit") and done.stderr.count("\n") == 1
