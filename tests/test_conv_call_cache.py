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


def test_plans_in_use_name_each_call_once_with_its_latest_plan(arrays, planned):
    """conv.plans_in_use: one row per direction and problem, in the order first called; repeats add no row, and a
    call under another algorithm replaces the row's plan (as a whole-step choice moving a kernel would)."""
    x, w, dy = arrays
    for _ in range(2):
        run_all(x, w, dy)
    rows = conv.plans_in_use()
    assert [direction for direction, _, _ in rows] == ["forward", "backward_data", "backward_filter"]
    assert all(problem.x_shape == SHAPES["x"] and problem.w_shape == SHAPES["w"] for _, problem, _ in rows)
    assert rows[0][2].algorithms != ["implicit_gemm"]
    conv.conv2d_forward(x, w, 1, 1, algo="implicit_gemm")
    direction, problem, plan = conv.plans_in_use()[0]
    assert len(conv.plans_in_use()) == 3 and direction == "forward" and plan.algorithms == ["implicit_gemm"]
    registry.clear_caches()
    assert conv.plans_in_use() == []


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


def test_the_cpu_keeps_no_ready_launch(arrays):
    """Ready launches are the GPU's (one kernel a call); NumPy calls always take the full path."""
    x, w, dy = arrays
    registry.clear_caches()
    with conv.settings(algo="implicit_gemm"):  # the algorithm with a ready launch on the GPU
        run_all(x, w, dy)
        run_all(x, w, dy)
    assert api._ready == {}


@pytest.mark.gpu
def test_gpu_a_repeated_call_goes_from_its_key_to_its_launch(arrays, monkeypatch):
    """A repeated implicit-GEMM call on the GPU with C-contiguous operands and no out runs its ready launch
    (_run is not reached) and gives the full path's results; a strided operand, an out, TF32 and an observer
    send the call down the full path again."""
    from minidnn.primitives.conv import plans  # noqa: PLC0415
    from tests.helpers import to_numpy  # noqa: PLC0415

    cupy = __import__("cupy")
    reference = conv.conv2d_forward(arrays[0].astype(np.float64), arrays[1].astype(np.float64), 1, 1, algo="reference")
    x, w, dy = (cupy.asarray(a) for a in arrays)
    ran = []
    real = api._run
    monkeypatch.setattr(api, "_run", lambda *args, **kwargs: (ran.append(args[1]), real(*args, **kwargs))[1])
    registry.clear_caches()

    def results():
        return [conv.conv2d_forward(x, w, 1, 1), conv.conv2d_backward_data(dy, w, SHAPES["x"], 1, 1),
                conv.conv2d_backward_filter(x, dy, SHAPES["w"], 1, 1)]

    with conv.settings(algo="implicit_gemm"):
        first = [to_numpy(r) for r in results()]
        assert ran == ["forward", "backward_data", "backward_filter"] and len(api._ready) == 3
        again = results()
        assert len(ran) == 3, ran
        assert all(a.flags.c_contiguous for a in again)
        for a, b in zip(first[:2], again[:2]):  # each output written once: the same bits
            np.testing.assert_array_equal(a, to_numpy(b))
        np.testing.assert_allclose(to_numpy(again[2]), first[2], rtol=1e-5, atol=1e-5)  # split-K's atomics
        np.testing.assert_allclose(to_numpy(again[0]), reference, rtol=1e-4, atol=1e-4)

        strided = cupy.asfortranarray(x)
        np.testing.assert_array_equal(to_numpy(conv.conv2d_forward(strided, w, 1, 1)), first[0])
        conv.conv2d_forward(x, w, 1, 1, out=cupy.empty_like(again[0]))
        assert ran[3:] == ["forward", "forward"]
        with _cuda.tf32(True):
            conv.conv2d_forward(x, w, 1, 1)
            conv.conv2d_forward(x, w, 1, 1)
        assert ran[5:] == ["forward"]  # TF32's own key: the full path once, then its own ready launch
        monkeypatch.setattr(plans, "call_observer", lambda *args: None)
        conv.conv2d_forward(x, w, 1, 1)
        assert ran[6:] == ["forward"]


def full_path_runs(monkeypatch):
    """The list that every GPU call of conv api's full path (``_run``) or recording path (``_run_recorded``) adds
    its (name, direction) to from now on: a call that replays a kept recording adds nothing."""
    from minidnn import backend  # noqa: PLC0415

    full = []
    for name in ("_run", "_run_recorded"):
        def counted(*arguments, real=getattr(api, name), name=name, **keywords):
            if backend.is_cuda_array(arguments[2]):
                full.append((name, arguments[1]))
            return real(*arguments, **keywords)
        monkeypatch.setattr(api, name, counted)
    return full


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["winograd_2x2", "winograd_4x4", "winograd_4x4_chunked"])
def test_gpu_a_repeated_winograd_call_replays_its_recording(algo, rng, monkeypatch):
    """Winograd's three directions, called again with new values of the same shapes, replay the first call's recorded
    transforms and GEMMs on the new operands, output and workspace: neither _run nor a recording runs again, and every
    call matches the float64 reference, also once the shared workspace was let go (a new buffer at another address)
    and with a workspace of its own per call (as in a capture). The chunked variant takes the batch in several chunks
    (views into x, dy and the output)."""
    import contextlib  # noqa: PLC0415

    from minidnn import backend  # noqa: PLC0415
    from minidnn.primitives.conv import winograd, workspace  # noqa: PLC0415
    from tests.helpers import to_numpy  # noqa: PLC0415

    cupy = backend.cupy()
    monkeypatch.setattr(winograd, "CHUNKED_WORKSPACE", 80_000)  # one to four images a chunk on these shapes
    x_shape, w_shape, dy_shape = (5, 6, 11, 9), (7, 6, 3, 3), (5, 7, 11, 9)
    full = full_path_runs(monkeypatch)
    registry.clear_caches()
    old_buffer = None
    with conv.settings(algo=algo):
        for repeat in range(4):
            if repeat == 2:  # held, so that the next shared buffer lies elsewhere
                old_buffer = workspace.workspace(1)
                workspace.release()
            x, w, dy = (rng.standard_normal(shape) for shape in (x_shape, w_shape, dy_shape))
            expected = [conv.conv2d_forward(x, w, 1, 1, algo="reference"),
                        conv.conv2d_backward_data(dy, w, x_shape, 1, 1, algo="reference"),
                        conv.conv2d_backward_filter(x, dy, w_shape, 1, 1, algo="reference")]
            x, w, dy = (cupy.asarray(a, dtype=np.float32) for a in (x, w, dy))
            with workspace.per_call() if repeat == 3 else contextlib.nullcontext():
                got = [conv.conv2d_forward(x, w, 1, 1), conv.conv2d_backward_data(dy, w, x_shape, 1, 1),
                       conv.conv2d_backward_filter(x, dy, w_shape, 1, 1)]
            for direction, result, reference in zip(("forward", "backward_data", "backward_filter"), got, expected):
                np.testing.assert_allclose(to_numpy(result), reference, rtol=1e-4,
                                           atol=1e-4 * np.abs(reference).max(), err_msg=f"{direction}, call {repeat}")
            directions = ("forward", "backward_data", "backward_filter")
            assert full == [("_run_recorded", direction) for direction in directions], (repeat, full)
    assert old_buffer is not None and sum(ready is not None for _, ready in api._ready.values()) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("N, groups, dtype", [(5, 1, np.float32), (3, 2, np.float32), (1, 1, np.float32),
                                              (4, 1, np.float16)])
def test_gpu_a_repeated_gemm_1x1_call_replays_its_recording(N, groups, dtype, rng, monkeypatch):
    """gemm_1x1's three directions, called again with new values of the same shapes, replay the first call's recorded
    GEMMs (and backward-filter's row of ones) on the new operands: _run never runs again, and every call matches the
    float64 reference, although the shared workspace, where the ones lie, is overwritten with NaNs before every call."""
    from minidnn import backend  # noqa: PLC0415
    from minidnn.primitives.conv import workspace  # noqa: PLC0415
    from tests.helpers import to_numpy  # noqa: PLC0415

    cupy = backend.cupy()
    x_shape, w_shape, dy_shape = (N, 6, 7, 9), (10, 6 // groups, 1, 1), (N, 10, 7, 9)
    full = full_path_runs(monkeypatch)
    registry.clear_caches()
    tolerance = 1e-4 if dtype == np.float32 else 3e-3
    with conv.settings(algo="gemm_1x1"):
        for repeat in range(3):
            x, w, dy = (rng.standard_normal(shape).astype(dtype) for shape in (x_shape, w_shape, dy_shape))
            expected = [conv.conv2d_forward(*(a.astype(np.float64) for a in (x, w)), groups=groups, algo="reference"),
                        conv.conv2d_backward_data(dy.astype(np.float64), w.astype(np.float64), x_shape, groups=groups,
                                                  algo="reference"),
                        conv.conv2d_backward_filter(x.astype(np.float64), dy.astype(np.float64), w_shape,
                                                    groups=groups, algo="reference")]
            x, w, dy = (cupy.asarray(a) for a in (x, w, dy))
            got = []
            for function, arguments in ((conv.conv2d_forward, (x, w)), (conv.conv2d_backward_data, (dy, w, x_shape)),
                                        (conv.conv2d_backward_filter, (x, dy, w_shape))):
                workspace.workspace(1).fill(255)  # every byte 0xFF: NaNs wherever a replay would read stale values
                got.append(function(*arguments, groups=groups))
            for direction, result, reference in zip(("forward", "backward_data", "backward_filter"), got, expected):
                assert result.dtype == dtype
                np.testing.assert_allclose(to_numpy(result).astype(np.float64), reference, rtol=tolerance,
                                           atol=tolerance * np.abs(reference).max(), err_msg=f"{direction}, {repeat}")
            directions = ("forward", "backward_data", "backward_filter")
            assert full == [("_run_recorded", direction) for direction in directions], (repeat, full)
    assert sum(ready is not None for _, ready in api._ready.values()) == 3


@pytest.mark.gpu
def test_gpu_find_times_the_ready_form_that_a_steps_repeats_run(monkeypatch):
    """find's host time is what an eager step's repeats cost: Winograd's recorded call replayed (its full path runs
    once, for the recording), implicit GEMM's ready launch (never its full path); an algorithm without a ready form
    (im2col + GEMM) is timed on its full path, every call."""
    from minidnn.primitives.conv import selection  # noqa: PLC0415
    from minidnn.primitives.conv.problem import make_problem  # noqa: PLC0415

    problem = make_problem((3, 8, 13, 11), (6, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, np.float32, "cuda")
    names = ("winograd_4x4_chunked", "implicit_gemm", "gemm")
    full = {name: 0 for name in names}
    for name in names:
        algorithm = registry.get(name)
        real = algorithm.run_in_layout

        def counted(*arguments, real=real, name=name, **keywords):
            full[name] += 1
            return real(*arguments, **keywords)

        monkeypatch.setattr(algorithm, "run_in_layout", counted)
    measured = selection._measure([registry.get(name) for name in names], problem, "forward", repeats=3)
    assert set(measured) == set(names)
    assert full["winograd_4x4_chunked"] == 1 and full["implicit_gemm"] == 0 and full["gemm"] >= 4, full
