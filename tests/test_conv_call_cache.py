"""The convolution call cache: a call seen before goes straight to its plan, and every change of a setting
that could change the plan (algorithm, workspace limit, micro-batching, find, TF32, a new algorithm, the
engine) sends the next call back through the checks and the choice."""
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
from minidnn.primitives import _cuda, conv
from minidnn.primitives.conv import api, registry

SHAPES = dict(x=(3, 4, 9, 7), w=(5, 4, 3, 3))


@pytest.fixture
def arrays(rng):
    return (rng.standard_normal(SHAPES["x"]).astype(np.float32), rng.standard_normal(SHAPES["w"]).astype(np.float32),
            rng.standard_normal((3, 5, 9, 7)).astype(np.float32))


@pytest.fixture
def planned(monkeypatch):
    """The directions for which a plan was made (the checking and choosing path ran)."""
    made = []
    real = api._plan

    def recording(problem, direction, algo, workspace_limit):
        made.append(direction)
        return real(problem, direction, algo, workspace_limit)

    monkeypatch.setattr(api, "_plan", recording)
    registry.clear_caches()
    return made


def run_all(x, w, dy):
    conv.conv2d_forward(x, w, 1, 1)
    conv.conv2d_backward_data(dy, w, SHAPES["x"], 1, 1)
    conv.conv2d_backward_filter(x, dy, SHAPES["w"], 1, 1)


def test_a_repeated_call_neither_checks_nor_chooses_again(arrays, planned, monkeypatch):
    x, w, dy = arrays
    expected = conv.conv2d_forward(x.astype(np.float64), w.astype(np.float64), 1, 1, algo="reference")
    del planned[:]
    run_all(x, w, dy)
    assert planned == ["forward", "backward_data", "backward_filter"]
    for name in ("forward_problem", "make_problem", "check_output_grad"):
        monkeypatch.setattr(api, name, lambda *args, **kwargs: pytest.fail("checked again"))
    np.testing.assert_allclose(conv.conv2d_forward(x, w, 1, 1), expected, rtol=1e-4, atol=1e-4)
    run_all(x, w, dy)
    assert planned == ["forward", "backward_data", "backward_filter"]


@pytest.mark.parametrize("change", [
    lambda: conv.settings(algo="gemm"),
    lambda: conv.settings(workspace_limit=0),
    lambda: conv.settings(microbatch="wr"),
    lambda: conv.settings(benchmark=True),
    lambda: _cuda.tf32(True),
])
def test_a_changed_setting_plans_again(arrays, planned, change, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))  # find, if it runs, keeps its times here
    x, w, dy = arrays
    run_all(x, w, dy)
    with change():
        run_all(x, w, dy)
    assert planned.count("forward") == 2


def test_setters_outside_a_block_plan_again_too(arrays, planned):
    x, w, dy = arrays
    before = registry.workspace_limit()
    try:
        run_all(x, w, dy)
        conv.set_workspace_limit(1 << 10)
        run_all(x, w, dy)
        conv.set_microbatch("off")
        run_all(x, w, dy)
    finally:
        conv.set_workspace_limit(before)
    assert planned.count("backward_filter") == 3


def test_a_new_algorithm_plans_again(arrays, planned, monkeypatch):
    x, w, dy = arrays
    run_all(x, w, dy)
    monkeypatch.setattr(registry, "_algorithms", dict(registry._algorithms))  # registered for this test only
    registry.register(type("Copy", (type(registry.get("gemm")),), {"name": "gemm_copy"})())
    run_all(x, w, dy)
    assert planned.count("forward") == 2


def test_the_naive_engine_never_reaches_the_cache(arrays, monkeypatch):
    x, w, _ = arrays
    F.conv2d(minidnn.tensor(x), minidnn.tensor(w), padding=1)
    monkeypatch.setattr(api, "_run", lambda *args, **kwargs: pytest.fail("the primitives ran under naive"))
    with minidnn.use_engine("naive"):
        F.conv2d(minidnn.tensor(x), minidnn.tensor(w), padding=1)


def test_bad_arguments_are_refused_after_a_cached_call(arrays):
    x, w, dy = arrays
    conv.conv2d_forward(x, w, 1, 1)
    with pytest.raises(TypeError, match="stride"):
        conv.conv2d_forward(x, w, 1.0, 1)  # 1.0 == 1: it must not pass as the cached int
    with pytest.raises(TypeError, match="padding"):
        conv.conv2d_forward(x, w, 1, (1.0, 1))
    with pytest.raises(TypeError, match="same dtype"):
        conv.conv2d_forward(x, w.astype(np.float64), 1, 1)
    with pytest.raises(ValueError, match="grad_output"):
        conv.conv2d_backward_data(dy[:, :, :8], w, SHAPES["x"], 1, 1)
    with pytest.raises(ValueError, match="out must be"):
        conv.conv2d_forward(x, w, 1, 1, out=np.empty((3, 5, 9, 6), np.float32))
