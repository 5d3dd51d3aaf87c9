"""The whole-step choice of an eager step's convolution algorithms (primitives/conv/step_choice.py).

The pure parts (the sets along the GPU-host trade, which of them are timed, the trial's steps) are checked against
hand-worked cases. The trial inside the convolution calls is checked on the CPU with ``find``'s figures and the
clock both made up: each step advances the clock by max(host, GPU) of what its calls ran, worked out here from the
made-up figures, and the trial must keep the set of least such time. The calls' results are held to a float64
reference all the while. On the GPU a real step is timed and the set kept must be the fastest the trial timed.
"""
import itertools
import time

import numpy as np
import pytest

from minidnn.primitives import conv
from minidnn.primitives.conv import api, plans, registry, selection, step_choice
from tests.helpers import assert_close, to_numpy


def perf(name, gpu_ms, host_ms):
    return selection.AlgoPerf(name, gpu_ms, 0, True, host_ms=host_ms)


def test_the_front_runs_from_the_least_gpu_time_to_the_least_host_time_each_set_once():
    calls = [
        [perf("winograd", 1.0, 3.0), perf("implicit_gemm", 2.0, 1.0)],  # they cross at λ = 1/3
        [perf("fft", 1.0, 9.0), perf("gemm", 1.5, 0.5)],  # at λ = 0.5 / 9 = 0.0556
        [perf("gemm", 1.0, 1.0), perf("fft", 2.0, 2.0), perf("winograd", 0.5, 1.1)],  # at 0.5 / 0.6 = 0.833
    ]
    assert step_choice.front(calls) == [("winograd", "fft", "winograd"), ("winograd", "gemm", "winograd"),
                                        ("implicit_gemm", "gemm", "winograd"), ("implicit_gemm", "gemm", "gemm")]
    assert step_choice.weighted_choice(calls[0], 1 / 3 - 1e-9) == "winograd"
    assert step_choice.weighted_choice(calls[0], 1 / 3 + 1e-9) == "implicit_gemm"
    assert step_choice.front([[perf("gemm", 1.0, 1.0)], [perf("fft", 1.0, 1.0), perf("gemm", 2.0, 2.0)]]) == \
        [("gemm", "fft")]


def test_every_set_of_the_front_is_the_least_weighted_step_of_all_assignments_for_some_weight(rng):
    """Against brute force over every assignment of random calls: each set of the front has the least
    (1 − λ)·ΣGPU + λ·Σhost of all assignments for some λ in [0, 1], and every assignment that alone has the least for
    some λ is on it; the least ΣGPU and the least Σhost are its ends; along it ΣGPU never falls and Σhost never
    rises."""
    for _ in range(20):
        calls = [[perf(f"algorithm{j}", *rng.uniform(0.1, 2.0, 2)) for j in range(3)] for _ in range(4)]
        sums = {}
        for names in itertools.product(*[[p.algorithm for p in call] for call in calls]):
            chosen = [next(p for p in call if p.algorithm == name) for call, name in zip(calls, names)]
            sums[names] = (sum(p.time_ms for p in chosen), sum(p.host_ms for p in chosen))
        sets = step_choice.front(calls)
        weights = np.linspace(0.0, 1.0, 2001)
        for chosen in sets:
            gpu, host = sums[chosen]
            assert any((1 - w) * gpu + w * host <= min((1 - w) * g + w * h for g, h in sums.values()) + 1e-9
                       for w in weights), chosen
        for w in weights:  # and every assignment that is alone the least for some weight is on it
            ranked = sorted(sums, key=lambda names: (1 - w) * sums[names][0] + w * sums[names][1])
            best, second = ((1 - w) * sums[n][0] + w * sums[n][1] for n in ranked[:2])
            if second - best > 1e-9:
                assert ranked[0] in sets, (w, ranked[0])
        assert sums[sets[0]][0] == pytest.approx(min(g for g, _ in sums.values()))
        assert sums[sets[-1]][1] == pytest.approx(min(h for _, h in sums.values()))
        along = [sums[chosen] for chosen in sets]
        assert all(a[0] <= b[0] + 1e-12 and a[1] >= b[1] - 1e-12 for a, b in zip(along, along[1:]))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 30, 100])
def test_golden_section_finds_the_least_of_values_that_fall_then_rise_asking_for_few(count):
    for least in range(count):
        values = [abs(i - least) + 0.01 * (i % 3) for i in range(count)]  # a valley with a ripple-free bottom
        search, asked = step_choice.golden_section(count), []
        try:
            index = next(search)
            while True:
                asked.append(index)
                index = search.send(values[index])
        except StopIteration as done:
            found = done.value
        assert found == least, (count, least, asked)
        assert len(asked) == len(set(asked)) <= max(3, 2 * np.log(count) / np.log(1.618) + 3), asked


def test_a_trial_times_each_set_after_a_warm_up_step_and_keeps_the_fastest():
    figures = {("a", "f"): [perf("slow_host", 1.0, 5.0), perf("lean", 3.0, 1.0)],
               ("b", "f"): [perf("slow_host", 1.0, 5.0), perf("lean", 3.0, 1.0)]}
    now, waits = [0.0], []
    trial = step_choice.StepTrial(lambda kernel, limit: figures[kernel], lambda: waits.append(now[0]),
                                  lambda: now[0])
    step_ms = {("slow_host", "slow_host"): 10.0, ("lean", "lean"): 6.0}
    anchor, other = ("a", "f"), ("b", "f")

    def step():  # the anchor, then the other call; the step takes its set's time
        ran = []
        for kernel in (anchor, other):
            trial.saw(kernel)
            ran.append(trial.offer(kernel, 64, "slow_host"))
        now[0] += step_ms[tuple(ran)] / 1000

    step()
    assert trial.anchor == anchor and trial.running and trial.holds(anchor) and not trial.holds(other)
    for _ in range(1 + 1 + step_choice.TIMED_STEPS):  # the sets are made; one warm-up step; the timed steps
        step()
    assert trial.sets == [("slow_host", "slow_host"), ("lean", "lean")]
    assert trial.step_ms == pytest.approx([10.0])
    assert trial.offer(anchor, 64, "slow_host") == "lean"  # the next set, being tried
    assert trial.offer(anchor, 32, "slow_host") == "slow_host"  # another limit: not the trial's call
    for _ in range(1 + step_choice.TIMED_STEPS):
        step()
    assert trial.step_ms == pytest.approx([10.0, 6.0]) and trial.chosen == 1
    assert not trial.running and not trial.holds(anchor)
    assert trial.offer(other, 64, "slow_host") == "lean"
    assert trial.saw(anchor) == set()  # settled: no more steps counted
    assert len(waits) == 4  # each timed window between two waits for the device


# ------------------------------------------------------------------------------------------------------------------
# The trial inside the convolution calls (CPU, made-up figures and clock)
# ------------------------------------------------------------------------------------------------------------------
# (direction, output channels K) -> {algorithm: (GPU ms, host ms)}: gemm takes less GPU time and longer to issue
# everywhere; each call trades at its own weight, so that the front has sets between its ends.
FIGURES = {(direction, channels): {"gemm": (1.0, 0.2 + 0.1 * i + 0.05 * channels), "implicit_gemm": (1.6, 0.1)}
           for i, direction in enumerate(("forward", "backward_data", "backward_filter")) for channels in (4, 5, 6)}
LAYERS = [((4, 3, 3, 3), 1), ((5, 4, 3, 3), 1), ((6, 5, 3, 3), 1)]


def made_up_measure(algorithms, problem, direction, repeats):
    figures = FIGURES[direction, problem.w_shape[0]]
    return {a.name: perf(a.name, *figures.get(a.name, (50.0, 50.0))) for a in algorithms}


def modelled_step_ms(ran, host_outside, gpu_outside):
    """A step's time: the longer of the host's path and the GPU's (ran: (direction, K, algorithm) per call)."""
    host = host_outside + sum(FIGURES[direction, channels][name][1] for direction, channels, name in ran)
    gpu = gpu_outside + sum(FIGURES[direction, channels][name][0] for direction, channels, name in ran)
    return max(host, gpu)


@pytest.fixture
def made_up(tmp_path, monkeypatch):
    """find's figures made up and on (on the CPU too), the trial's clock a number each step advances."""
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(selection, "_measure", made_up_measure)
    monkeypatch.setitem(registry._defaults, "benchmark", True)
    now = [0.0]
    monkeypatch.setattr(step_choice, "_clock", lambda: now[0])
    selection.clear_cache()  # the disk cache of the new directory too
    registry.clear_caches()
    yield now
    plans.call_observer = None
    selection.clear_cache()
    registry.clear_caches()


def run_steps(steps, rng, now=None, host_outside=0.0, gpu_outside=0.0, xp=np, observe=True):
    """``steps`` steps of three 3x3 layers (forward, then backward-filter and backward-data from the last layer back),
    each call held to the float64 reference; the (direction, K, algorithm) of each step's calls (with ``observe``: an
    observer sends every call down the full path). With ``now``, each step advances it by its modelled time."""
    x = xp.asarray(rng.standard_normal((2, 3, 9, 9)).astype(np.float32))
    weights = [xp.asarray(rng.standard_normal(shape).astype(np.float32)) for shape, _ in LAYERS]
    ran_per_step, ran = [], []

    def watch(direction, problem, plan):
        if problem.dtype == np.float32:  # not the reference's float64 calls
            ran.append((direction, problem.w_shape[0], plan.segments[0][1].name))

    for _ in range(steps):
        ran.clear()
        inputs, y = [], x
        plans.call_observer = watch if observe else None
        try:
            for w in weights:
                inputs.append(y)
                y = conv.conv2d_forward(y, w, 1, 1)
                want = conv.conv2d_forward(inputs[-1].astype(np.float64), w.astype(np.float64), 1, 1, algo="reference")
                assert_close(to_numpy(y), to_numpy(want), rtol=1e-4, atol=1e-4)
            dy = xp.ones_like(y)
            for w, x_in in zip(reversed(weights), reversed(inputs)):
                dw = conv.conv2d_backward_filter(x_in, dy, w.shape, 1, 1)
                want = conv.conv2d_backward_filter(x_in.astype(np.float64), dy.astype(np.float64), w.shape, 1, 1,
                                                   algo="reference")
                assert_close(to_numpy(dw), to_numpy(want), rtol=1e-4, atol=1e-3)
                dy = conv.conv2d_backward_data(dy, w, x_in.shape, 1, 1)
        finally:
            plans.call_observer = None
        ran_per_step.append(list(ran))
        if now is not None:
            now[0] += modelled_step_ms(ran, host_outside, gpu_outside) / 1000
    return ran_per_step


def test_a_host_bound_step_keeps_the_set_of_least_step_time_not_the_per_call_rules(made_up, rng):
    """The host's path outside the convolutions is long: every call's own rule (gemm, the least max(GPU, host))
    makes the host's path the longer, and a set that issues faster wins the step."""
    ran = run_steps(30, rng, made_up, host_outside=8.0, gpu_outside=2.0)
    summary = step_choice.summary()
    assert summary["chosen"] is not None and summary["sets"] >= 3, summary  # the front had sets between its ends
    assert {name for _, _, name in ran[1]} == {"gemm"}  # the per-call rule ran first
    times = [modelled_step_ms(step, 8.0, 2.0) for step in ran]
    kept = times[-1]
    assert kept == pytest.approx(min(summary["step_ms"])) and kept < times[1]  # faster than the per-call rule
    assert ran[-1] == ran[-2]  # settled
    # The best any assignment of the two algorithms to the nine calls can do, by brute force: here a set on the front.
    best = min(max(8.0 + sum(FIGURES[call][name][1] for call, name in zip(FIGURES, names)),
                   2.0 + sum(FIGURES[call][name][0] for call, name in zip(FIGURES, names)))
               for names in itertools.product(("gemm", "implicit_gemm"), repeat=len(FIGURES)))
    assert kept == pytest.approx(best)


def test_a_gpu_bound_step_keeps_the_per_call_rules_set(made_up, rng):
    ran = run_steps(30, rng, made_up, host_outside=0.5, gpu_outside=20.0)
    summary = step_choice.summary()
    assert summary["chosen"] == 0 and len(summary["step_ms"]) == summary["sets"] >= 2
    assert {name for _, _, name in ran[-1]} == {"gemm"}


def test_a_settings_change_starts_a_new_trial_and_a_graphs_plans_take_no_part(made_up, rng):
    run_steps(3, rng, made_up, host_outside=8.0, gpu_outside=2.0)
    first = step_choice.trial
    assert first is not None and first.running and first.sets
    with registry.for_graph():  # a CUDA graph's planning: find's least GPU time, no trial
        assert {name for _, _, name in run_steps(2, rng)[-1]} == {"gemm"}
    assert step_choice.trial is first
    with conv.settings(workspace_limit=1 << 20):
        ran = run_steps(30, rng, made_up, host_outside=8.0, gpu_outside=2.0)
    assert step_choice.trial is not first and step_choice.trial.chosen is not None
    assert ran[-1] != ran[1]


def test_a_graph_recorded_outside_graphs_capture_ends_the_trial_on_the_per_call_choices(made_up, monkeypatch, rng):
    """A trial that would wait for the stream while a CUDA graph is being recorded (a capture not made through
    graphs.capture) stops: every call goes back to its per-call choice and the anchor is no longer held."""
    run_steps(5 + step_choice.TIMED_STEPS, rng, made_up, host_outside=8.0, gpu_outside=2.0)
    trial = step_choice.trial
    assert trial.running and len(trial.step_ms) == 1 and trial._assigned  # the second set is being tried

    def capturing():
        raise step_choice._Capturing

    monkeypatch.setattr(step_choice, "_synchronize", capturing)
    ran = run_steps(1 + step_choice.TIMED_STEPS, rng, made_up, host_outside=8.0, gpu_outside=2.0)
    assert not trial.running and not step_choice.running() and trial.chosen is None
    assert not trial.holds(trial.anchor)
    assert {name for _, _, name in ran[-1]} == {"gemm"}  # the per-call rule's choice on every call


@pytest.mark.gpu
def test_gpu_an_eager_step_keeps_the_fastest_set_its_trial_timed_and_stays_right(made_up, monkeypatch, rng):
    """The same step on the GPU with its ready forms (no observer), find's figures made up so that the trial has sets
    to time, the clock real: the trial counts its steps though every other call goes from its key to its ready form,
    keeps the fastest set it timed, and every call is right before, during and after it. Once the trial is over the
    anchor's call is kept as a ready form like any other."""
    cupy = pytest.importorskip("cupy")
    monkeypatch.setattr(step_choice, "_clock", time.perf_counter)
    steps = 0
    while steps == 0 or step_choice.running():
        run_steps(1, rng, xp=cupy, observe=False)
        steps += 1
        assert steps < 60, step_choice.summary()
    summary = step_choice.summary()
    assert summary["chosen"] is not None and len(summary["step_ms"]) == summary["sets"] >= 3, summary
    assert summary["step_ms"][summary["chosen"]] == min(summary["step_ms"])
    assert len(set(step_choice.trial.sets)) == summary["sets"]
    run_steps(2, rng, xp=cupy, observe=False)
    anchor = step_choice.trial.anchor
    assert [key for key, (problem, _) in api._calls.items() if (problem, key[0]) == anchor and key in api._ready]
    assert {name for _, _, name in run_steps(1, rng, xp=cupy)[0]} <= {"gemm", "implicit_gemm"}
