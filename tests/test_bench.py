"""The benchmark on the CPU: a smoke run of the driver and its worker processes, the reports'
arithmetic, the worker's switches and argument errors (not a timing test: the GPU run is the lead's)."""
import json
import os
import subprocess
import sys
import types
from collections import Counter

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import models
from benchmarks import bench, measure, report
from minidnn import backend
from minidnn.primitives import _cuda


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One quick CPU run of every engine, with TF32 switched on in the workers' environment: an fp32
    cell has to turn it off itself."""
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIDNN_TF32", "1")
        result = bench.main(["--device", "cpu", "--quick", "--models", "tiny", "--batch", "3", "--warmup", "1",
                             "--steps", "2", "--layer-repeats", "1", "--out", str(out)])
    return result, out


def engine_records(result):
    return {r["engine"]: r for r in result["records"] if r["kind"] == "engine"}


def test_every_engine_runs_in_its_own_process(smoke):
    result, out = smoke
    expected = {"minidnn", "naive"} | ({"torch"} if bench._available("torch") else set())
    records = engine_records(result)
    assert set(records) == expected
    pids = [r["pid"] for r in result["records"]] + [result["machine"]["pid"]]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    assert all("error" not in r and "skipped" not in r for r in result["records"])
    assert json.loads((out / "bench.json").read_text()) == json.loads(json.dumps(result))
    assert (out / "bench.png").exists() == bench._available("matplotlib")
    assert any("minidnn-graph skipped" in note for note in result["notes"])
    for record in records.values():
        assert record["wall_ms"] > 0 and record["forward_ms"] > 0 and record["steps_timed"] == 2
    # minidnn's record names the plan each convolution of the timed steps ran (tiny: three layers, each in three
    # directions but the first layer's backward-data).
    plans = records["minidnn"]["conv_plans"]
    assert len(plans) == 3 * 3 - 1 and {direction for direction, _, _ in plans} == set(measure.DIRECTIONS)
    assert all(problem.startswith("[3,") and "MiB workspace" in plan for _, problem, plan in plans)
    # minidnn's record names the plan each convolution of the timed steps ran (tiny: three layers, each in three
    # directions but the first layer's backward-data).
    plans = records["minidnn"]["conv_plans"]
    assert len(plans) == 3 * 3 - 1 and {direction for direction, _, _ in plans} == set(measure.DIRECTIONS)
    assert all(problem.startswith("[3,") and "MiB workspace" in plan for _, problem, plan in plans)
    agreement = next(r for r in result["records"] if r["kind"] == "agreement")["agreement"]
    for engine in expected - {"minidnn"}:  # torch through its twin of tiny_cnn, where torch is installed
        assert agreement[engine]["loss_relative_difference"] < 1e-5, engine
        assert agreement[engine]["gradient_relative_difference"] < 1e-3, engine


def test_records_say_the_math_mode_and_engine_in_force_while_measuring(smoke):
    result, _ = smoke
    for name, record in engine_records(result).items():
        assert record["tf32"] is False
        assert record["state"]["allow_tf32"] is False  # the environment asked for TF32; fp32 turned it off
        assert record["state"]["engine"] == ("naive" if name == "naive" else "minidnn")
    assert engine_records(result)["minidnn"]["setting"] == {"workspace_limit": 64 << 20, "microbatch": "off",
                                                             "batch_policy": None}


def test_markdown_has_the_columns(smoke):
    _, out = smoke
    text = (out / "bench.md").read_text()
    assert ("| engine | mode | setting | wall ms | host ms | GPU-busy ms | kernels/step | copies/step | forward ms | "
            "peak MiB | vs naive (wall) | vs naive (GPU-busy) | / PyTorch (wall) |") in text
    assert "| minidnn | fp32 | 64MiB off |" in text and "| naive | fp32 | - |" in text
    assert "| mode | setting | conv GPU ms: minidnn / cuDNN | minidnn / cuDNN (GPU) | conv wall ms:" in text
    assert "| features.4 | [3,8,16,16] -> [3,16,16,16]" in text and "#### Every algorithm of tiny" in text


def test_layer_tables_leave_out_the_first_layers_backward_data(smoke):
    result, _ = smoke
    for name in ("minidnn", "naive"):
        rows = engine_records(result)[name]["layers"]
        assert [row["layers"] for row in rows] == [["features.0"], ["features.4"], ["features.8"]]
        assert rows[0]["runs"] == {"forward": 1, "backward_data": 0, "backward_filter": 1}
        assert "backward_data" not in rows[0]["times"]
        assert all(set(row["times"]) == set(measure.DIRECTIONS) for row in rows[1:])
        by_hand = sum(timing["ms"] for row in rows for timing in row["times"].values())
        assert report.conv_sum(rows) == pytest.approx(by_hand)
    minidnn_rows = engine_records(result)["minidnn"]["layers"]
    ((images, algorithm),) = minidnn_rows[1]["times"]["forward"]["plan"]["segments"]  # one call, the whole batch
    assert images == 3 and algorithm in minidnn.primitives.conv.algorithms()
    assert set(minidnn_rows[1]["menu"]["forward"]) == set(minidnn.primitives.conv.algorithms())
    assert minidnn_rows[1]["menu"]["forward"]["gemm_1x1"] == {"skipped": "unsupported"}


def test_conv_sum_counts_each_direction_by_the_layers_that_run_it():
    # conv1 and conv2 share a shape; conv1 reads the data, so only conv2 runs backward-data.
    shared = {"runs": {"forward": 2, "backward_data": 1, "backward_filter": 2},
              "times": {"forward": {"ms": 1.0}, "backward_data": {"ms": 10.0}, "backward_filter": {"ms": 100.0}}}
    alone = {"runs": {"forward": 1, "backward_data": 0, "backward_filter": 1},
             "times": {"forward": {"ms": 0.5}, "backward_filter": {"ms": 0.25}}}
    assert report.conv_sum([shared, alone]) == 2 * 1.0 + 10.0 + 2 * 100.0 + 0.5 + 0.25


def test_a_merged_report_pairs_minidnn_with_the_torch_records_that_hold_each_figure():
    row = {"shape": "s", "layers": ["conv"], "runs": {"forward": 1, "backward_data": 0, "backward_filter": 0}}
    key = {"kind": "engine", "model": "m", "batch": 2, "tf32": False}
    step_only = {**key, "engine": "torch", "wall_ms": 8.0}  # a whole-step run, no layer table
    layers_only = {**key, "engine": "torch", "layers": [{**row, "times": {"forward": {"ms": 2.0}}}]}
    ours = {**key, "engine": "minidnn", "wall_ms": 10.0, "layers": [{**row, "times": {"forward": {"ms": 3.0}}}]}
    for records in ([step_only, layers_only, ours], [layers_only, step_only, ours]):
        sums = report.conv_comparison(records, ours)
        assert sums["cudnn_ms"] == 2.0 and sums["ratio"] == 1.5 and sums["step_ratio"] == 10.0 / 8.0
        assert sums["torch_outside_wall_ms"] == 8.0 - 2.0


def test_distinct_shapes_count_backward_data_only_where_the_input_needs_a_gradient():
    problem = minidnn.primitives.conv.problem.make_problem((1, 4, 9, 9), (4, 4, 3, 3), 1, 1, 1, 1, np.float32, "cpu")
    layers = [{"name": "conv1", "problem": problem, "input_needs_grad": False},
              {"name": "conv2", "problem": problem, "input_needs_grad": True}]
    (row,) = measure.distinct_shapes(layers, batch=5)
    assert row["layers"] == ["conv1", "conv2"] and row["problem"].N == 5
    assert row["runs"] == {"forward": 2, "backward_data": 1, "backward_filter": 2}


def test_measurement_state_is_restored_after_an_exception(monkeypatch):
    flags = types.SimpleNamespace(allow_tf32=False)
    fake_torch = types.SimpleNamespace(backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=flags),
                                                                      cudnn=types.SimpleNamespace(allow_tf32=True)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    minidnn.set_engine("minidnn")
    _cuda.set_allow_tf32(False)
    with pytest.raises(RuntimeError, match="inside"):
        with measure.measurement_state("naive", "tf32"):
            assert minidnn.get_engine() == "naive" and _cuda.allow_tf32()
            assert flags.allow_tf32 and fake_torch.backends.cudnn.allow_tf32
            raise RuntimeError("inside the measurement")
    assert minidnn.get_engine() == "minidnn" and _cuda.allow_tf32() is False
    assert flags.allow_tf32 is False and fake_torch.backends.cudnn.allow_tf32 is True
    with measure.measurement_state("torch", "fp32"):  # PyTorch's default cuDNN TF32 is on: fp32 turns it off
        assert fake_torch.backends.cudnn.allow_tf32 is False and minidnn.get_engine() == "minidnn"
    assert fake_torch.backends.cudnn.allow_tf32 is True


def test_the_torch_engine_loads_pytorch_before_setting_its_switches(tmp_path, monkeypatch):
    # PyTorch not imported yet: measurement_state must import it, or cuDNN's TF32 default (on) would stay.
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import types\n"
        "backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)),\n"
        "                                 cudnn=types.SimpleNamespace(allow_tf32=True))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with measure.measurement_state("torch", "fp32"):
        assert sys.modules["torch"].backends.cudnn.allow_tf32 is False
    assert sys.modules["torch"].backends.cudnn.allow_tf32 is True
    del sys.modules["torch"]  # the fake; monkeypatch puts back a real one that was loaded before


TINY_CELL = {"kind": "engine", "model": "tiny", "architecture": "tiny_cnn", "image_size": 8, "batch": 2,
             "num_classes": 3, "device": "cpu", "tf32": False, "setting": None, "warmup": 2, "steps": 3,
             "profile_steps": 0, "layer_repeats": 1, "measure_step": True, "layer_table": False}


def test_a_captured_engine_captures_once_after_the_warm_up_and_then_replays(monkeypatch):
    captured, replays = [], []

    class EagerStep:  # what capture returns when a step cannot be captured
        def __init__(self, reason):
            self.reason = reason

        def __call__(self, x, y):
            replays.append((x, y))

    def capture(step_fn, example_batch, plan_memory):
        captured.append(example_batch)
        plans.append(plan_memory)
        return lambda x, y: replays.append((x, y))

    plans = []

    graphs = types.SimpleNamespace(capture=capture, EagerStep=EagerStep)
    monkeypatch.setattr(minidnn.cuda, "graphs", graphs, raising=False)
    record = measure.measure_engine({**TINY_CELL, "engine": "minidnn-graph"})
    assert len(captured) == 1 and len(captured[0]) == 2
    assert len(replays) == 1 + 3  # the warm-up replay, then the timed steps
    assert all(x is captured[0][0] and y is captured[0][1] for x, y in replays)
    assert record["steps_timed"] == 3 and record["state"]["engine"] == "minidnn" and record["captured"] is True
    measure.measure_engine({**TINY_CELL, "engine": "minidnn-graph", "plan_memory": False})
    assert plans == [True, False] and record["memory_plan"] is True  # the memory plan unless --no-memory-plan
    graphs.capture = lambda step_fn, example_batch, plan_memory: EagerStep("a host read in the step")
    record = measure.measure_engine({**TINY_CELL, "engine": "minidnn-graph"})
    assert record["captured"] is False and record["capture_fallback"] == "a host read in the step"


def test_a_wd_cell_solves_the_whole_network_with_the_limit_per_convolution_kernel():
    setting = {"workspace_limit": 1 << 20, "microbatch": "wd", "batch_policy": "powers_of_two"}
    record = measure.measure_engine({**TINY_CELL, "engine": "minidnn", "setting": setting, "warmup": 1, "steps": 1,
                                     "layer_table": True, "menu": False})
    # tiny_cnn: three convolutions, forward and backward-filter each, backward-data for the last two.
    assert record["conv_calls"] == 8 and record["wd_budget_bytes"] == 8 << 20
    assert record["state"]["microbatch"] == "wd"
    assert all("plan" in timing for row in record["layers"] for timing in row["times"].values())


def test_wd_needs_the_planners_solve_network(monkeypatch):
    # As if planner.py were missing: neither imported nor importable.
    monkeypatch.delattr(minidnn.primitives.conv, "planner", raising=False)
    monkeypatch.setitem(sys.modules, "minidnn.primitives.conv.planner", None)
    with pytest.raises(RuntimeError, match="solve_network"):
        measure.solve_whole_network(8 << 20, Counter({("problem", "forward"): 2}))


def test_the_wd_budget_is_the_limit_per_convolution_kernel_of_a_step(monkeypatch):
    from minidnn.primitives.conv import planner

    solved = []
    monkeypatch.setattr(planner, "solve_network", lambda budget, counts: solved.append((budget, counts)))
    calls = Counter({("conv2 shape", "forward"): 3, ("conv2 shape", "backward_data"): 2, ("conv1 shape", "forward"): 1})
    assert measure.solve_whole_network(8 << 20, calls) == 6 * (8 << 20)
    assert solved == [(6 * (8 << 20), dict(calls))]


def test_settings_grid_runs_minidnn_per_setting_and_the_other_engines_once(monkeypatch):
    monkeypatch.setattr(bench, "_available", lambda module: module != "minidnn.cuda.graphs")
    args = bench.parse_args(["--device", "cpu", "--quick", "--models", "tiny", "--engines", "minidnn,naive",
                             "--workspace-limit", "8MiB,1GiB", "--microbatch", "off,wd", "--batch-policy", "all"])
    cells = [c for c in bench.plan_cells(args) if c["kind"] == "engine"]
    settings = [(c["engine"], report.setting_label(c["setting"]), c["menu"]) for c in cells]
    assert settings == [("minidnn", "8MiB off", True), ("minidnn", "8MiB wd all", False),
                        ("minidnn", "1GiB off", False), ("minidnn", "1GiB wd all", False), ("naive", "-", False)]
    assert any("limit times the number of convolution kernels" in note for note in args.notes)
    args = bench.parse_args(["--device", "cpu", "--quick", "--models", "tiny", "--engines", "minidnn", "--no-menu"])
    assert [c["menu"] for c in bench.plan_cells(args) if c["kind"] == "engine"] == [False]
    args = bench.parse_args(["--device", "cpu", "--quick", "--models", "tiny", "--engines", "minidnn,naive"])
    assert [c["kind"] for c in bench.plan_cells(args)] == ["agreement", "engine", "engine"]
    args = bench.parse_args(["--device", "cpu", "--quick", "--models", "tiny", "--engines", "minidnn,naive", "--no-agreement"])
    assert [c["kind"] for c in bench.plan_cells(args)] == ["engine", "engine"]
    monkeypatch.setattr(bench, "_available", lambda module: module != "minidnn.primitives.conv.planner")
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--microbatch", "wr"])


@pytest.mark.parametrize("limit", ["8 MB", "-1", "64mib", "1.5GiB"])
def test_a_malformed_workspace_limit_is_a_clear_error(limit, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--workspace-limit", f"8MiB,{limit}"])
    error = capsys.readouterr().err
    assert "--workspace-limit" in error and repr(limit) in error and "MiB" in error


@pytest.mark.parametrize("arguments", [["--engines", "cudnn7"], ["--models", "vgg"], ["--tf32", "on"],
                                       ["--tf32", "maybe"], ["--microbatch", "sometimes"],
                                       ["--batch-policy", "primes"], ["--no-layers", "--layers-only"],
                                       ["--steps", "0"], ["--budget-seconds", "-1"], ["--precision", "int8"],
                                       ["--precision", "tf32"], ["--precision", "bf16", "--tf32", "off"]])
def test_bad_arguments(arguments, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", *arguments])
    assert "error:" in capsys.readouterr().err


def test_quick_picks_the_cpu_where_no_gpu_is_there(monkeypatch):
    monkeypatch.setattr(bench, "_gpu_present", lambda: False)
    args = bench.parse_args(["--quick"])
    assert args.device == "cpu" and args.modes == ["fp32"] and "No CUDA GPU: --quick ran on the CPU." in args.notes
    assert bench.parse_args([]).device == "cuda"  # the full suite is a GPU run: without one, its first cell says so
    monkeypatch.setattr(bench, "_gpu_present", lambda: True)
    assert bench.parse_args(["--quick"]).device == "cuda"
    monkeypatch.setattr(bench, "_gpu_present", lambda: pytest.fail("a device given need not be asked for"))
    assert bench.parse_args(["--quick", "--device", "cuda"]).device == "cuda"
    assert bench.parse_args(["--quick", "--device", "cpu"]).device == "cpu"


def test_a_quick_run_without_a_device_or_out_writes_under_runs_bench(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --out is relative: runs/bench of the directory the benchmark is started in
    result = bench.main(["--quick", "--models", "tiny", "--engines", "minidnn", "--budget-seconds", "0"])
    assert result["machine"]["device"] == ("cuda" if backend.cuda_is_available() else "cpu")
    assert (tmp_path / "runs" / "bench" / "bench.json").exists() and (tmp_path / "runs" / "bench" / "bench.md").exists()


def test_the_default_out_is_ignored_by_git_and_the_kept_results_are_not():
    assert bench.parse_args(["--device", "cpu"]).out == os.path.join("runs", "bench")
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(bench.__file__)))

    def ignored(path):
        asked = subprocess.run(["git", "check-ignore", "-q", path], cwd=checkout)
        if asked.returncode not in (0, 1):
            pytest.skip("not a git checkout")
        return asked.returncode == 0

    assert ignored(os.path.join("runs", "bench", "bench.json"))
    assert not ignored(os.path.join("benchmarks", "results", "2026-12-01-h200-question", "bench.json"))


def test_a_spent_budget_skips_and_records_every_cell(tmp_path):
    result = bench.main(["--device", "cpu", "--quick", "--models", "tiny", "--engines", "minidnn,naive",
                         "--budget-seconds", "0", "--out", str(tmp_path)])
    assert [r["kind"] for r in result["records"]] == ["agreement", "engine", "engine"]
    assert all("time budget" in r["skipped"] for r in result["records"])
    assert "## Cells not measured" in (tmp_path / "bench.md").read_text()


def test_merge_combines_runs(smoke, tmp_path):
    result, out = smoke
    other = json.loads(json.dumps(result))
    for record in other["records"]:
        record["model"] = "tiny-again"
    (tmp_path / "other.json").write_text(json.dumps(other))
    merged = bench.main(["--merge", str(out / "bench.json"), str(tmp_path / "other.json"), "--out", str(tmp_path),
                         "--name", "both"])
    assert len(merged["records"]) == 2 * len(result["records"])
    text = (tmp_path / "both.md").read_text()
    assert "## tiny, batch 3" in text and "## tiny-again, batch 3" in text
    (tmp_path / "old.json").write_text(json.dumps({"machine": {}, "results": []}))
    with pytest.raises(SystemExit, match="not a report of this benchmark"):
        bench.main(["--merge", str(tmp_path / "old.json"), "--out", str(tmp_path)])


def test_device_trace_summary_counts_kernels_and_copies_per_step():
    # Three kernels (the first two overlap by 5 µs), a copy, two memsets, host events (not device work).
    events = [{"cat": "kernel", "ph": "X", "ts": 100.0, "dur": 10.0, "name": "gemm"},
              {"cat": "kernel", "ph": "X", "ts": 105.0, "dur": 20.5, "name": "conv"},
              {"cat": "kernel", "ph": "X", "ts": 300.0, "dur": 1.5, "name": "gemm"},
              {"cat": "gpu_memcpy", "ph": "X", "ts": 0, "dur": 4.0},
              {"cat": "gpu_memset", "ph": "X", "ts": 5, "dur": 2.0}, {"cat": "gpu_memset", "ph": "X", "ts": 9, "dur": 2.0},
              {"cat": "cuda_runtime", "ph": "X", "ts": 0, "dur": 500.0}, {"cat": "ac2g", "ph": "f"}, {"ph": "M"}]
    summary = measure.summarize_device_trace(events, steps=2)
    # By name, the longest-running first: conv's 20.5 µs, then gemm's two kernels' 11.5 µs, over two steps.
    assert summary.pop("kernel_names") == [["conv", pytest.approx(0.01025), 0.5], ["gemm", pytest.approx(0.00575), 1.0]]
    assert summary == pytest.approx({"gpu_busy_ms": 0.016, "kernels_per_step": 1.5, "gpu_active_ms": 0.0135,
                                     "memcpy_ms": 0.002, "memcpy_per_step": 0.5, "memset_ms": 0.002,
                                     "memset_per_step": 1.0})


def test_step_kernels_are_summed_by_kind_in_the_report():
    """bench.md's "GPU-busy by kind": ours and cuDNN's / PyTorch's names land in one kind each, and the table gives
    each engine's sums and the time beyond the names kept."""
    names = {"bn_backward_dx_last_vector": "batch norm",
             "void cudnn::batchnorm_fwtr_nhwc_semiPersist<float>": "batch norm",
             "transpose_planes_4": "layout changes", "cupy_add__float32_float32_float32": "adds",
             "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": "adds",
             "add_relu_forward_vector": "ReLU", "threshold_kernel_impl": "ReLU",
             "implicit_gemm_wgmma_forward": "convolutions and GEMMs", "winograd_input_and_gradient_transform_4":
             "convolutions and GEMMs", "sm90_xmma_wgrad_indexed_implicit_gemm_tf32": "convolutions and GEMMs",
             "scatter_sampled_16": "convolutions and GEMMs",  # gemm_1x1's strided rows
             "max_pool_forward_taps_last": report.OTHER_KERNELS, "sgd_update_multi": report.OTHER_KERNELS}
    assert {name: report.kernel_kind(name) for name in names} == names
    ours = {"engine": "minidnn-graph", "precision": "tf32", "gpu_busy_ms": 4.0,
            "kernel_names": [["transpose_planes_4", 1.5, 3], ["bn_apply_last_vector", 1.0, 2],
                             ["bn_statistics_last_vector", 0.5, 2]]}
    theirs = {"engine": "torch", "precision": "tf32", "gpu_busy_ms": 2.0,
              "kernel_names": [["void cudnn::batchnorm_bwtr_nhwc", 1.25, 1]]}
    assert report.kernels_by_kind(ours["kernel_names"]) == {"layout changes": (1.5, 3), "batch norm": (1.5, 4)}
    table = "\n".join(report.kind_section([ours, theirs, {"engine": "naive", "precision": "fp32"}]))
    assert "| kind | minidnn-graph tf32 | torch tf32 |" in table
    assert "| batch norm | 1.50 (4) | 1.25 (1) |" in table and "| layout changes | 1.50 (3) | - |" in table
    assert "| names beyond those kept | 1.00 | 0.75 |" in table
    assert report.kind_section([{"engine": "minidnn", "precision": "fp32", "gpu_busy_ms": 1.0}]) == []


def test_kernels_are_attributed_to_the_range_that_launched_them():
    # Range "a" launches kernels 1 (runtime API) and 2 (driver API, running after "a" closed);
    # range "b" launches kernels 3 and 5, which overlap by 2 µs; kernel 4 was launched outside every range.
    events = [{"cat": "user_annotation", "ph": "X", "name": "a", "ts": 0.0, "dur": 10.0},
              {"cat": "user_annotation", "ph": "X", "name": "b", "ts": 20.0, "dur": 10.0},
              {"cat": "cuda_runtime", "ph": "X", "ts": 2.0, "dur": 1.0, "args": {"correlation": 1}},
              {"cat": "cuda_driver", "ph": "X", "ts": 9.0, "dur": 1.0, "args": {"correlation": 2}},
              {"cat": "cuda_runtime", "ph": "X", "ts": 21.0, "dur": 1.0, "args": {"correlation": 3}},
              {"cat": "cuda_runtime", "ph": "X", "ts": 15.0, "dur": 1.0, "args": {"correlation": 4}},
              {"cat": "kernel", "ph": "X", "ts": 5.0, "dur": 3.0, "args": {"correlation": 1}},
              {"cat": "kernel", "ph": "X", "ts": 40.0, "dur": 4.0, "args": {"correlation": 2}},
              {"cat": "kernel", "ph": "X", "ts": 44.0, "dur": 7.0, "args": {"correlation": 3}},
              {"cat": "kernel", "ph": "X", "ts": 51.0, "dur": 100.0, "args": {"correlation": 4}},
              {"cat": "cuda_runtime", "ph": "X", "ts": 25.0, "dur": 1.0, "args": {"correlation": 5}},
              {"cat": "kernel", "ph": "X", "ts": 49.0, "dur": 5.0, "args": {"correlation": 5}}]
    assert measure.kernels_by_annotation(events) == {"a": (7.0, 2), "b": (10.0, 2)}


@pytest.mark.parametrize("name", ["resnet20", "tiny_cnn", "shapes_cnn"])
def test_torch_twin_computes_what_minidnn_computes(name):
    torch = pytest.importorskip("torch")
    from benchmarks.torch_twins import torch_twin

    minidnn.manual_seed(0)
    model = models.create(name).double()
    twin = torch_twin(name, model).double()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3, 32, 32)), rng.integers(0, 10, 4)
    loss = F.cross_entropy(model(minidnn.tensor(x)), minidnn.tensor(y))
    loss.backward()
    their_loss = torch.nn.functional.cross_entropy(twin(torch.tensor(x)), torch.tensor(y))
    their_loss.backward()
    assert loss.item() == pytest.approx(their_loss.item(), rel=1e-12)
    theirs = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), theirs[name].grad.numpy(), rtol=1e-8, atol=1e-12, err_msg=name)


def test_the_menu_chart_draws_each_algorithm_beside_cudnn(tmp_path):
    pytest.importorskip("matplotlib")
    key = {"kind": "engine", "model": "m", "batch": 2, "tf32": False}
    row = {"shape": "s", "layers": ["conv"], "runs": {"forward": 1, "backward_data": 0, "backward_filter": 0},
           "times": {"forward": {"ms": 1.0, "gpu_ms": 0.9}}}
    menu = {"forward": {"gemm": {"ms": 1.0, "gpu_ms": 0.9}, "fft": {"skipped": "unsupported"}}}
    torch_record = {**key, "engine": "torch", "layers": [row]}
    without = {"records": [{**key, "engine": "minidnn", "layers": [row]}, torch_record]}
    assert not report.menu_chart(without, "m", 2, False, str(tmp_path / "none.png"))
    with_menu = {"records": [{**key, "engine": "minidnn", "layers": [{**row, "menu": menu}]}, torch_record]}
    report.main([_write(tmp_path / "r.json", with_menu), "m", "2", "fp32", str(tmp_path / "menu.png")])
    assert (tmp_path / "menu.png").read_bytes()[:4] == b"\x89PNG" and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "r.json"), "m", "2", "tf32", str(tmp_path / "tf32.png")])


def _write(path, content) -> str:
    path.write_text(json.dumps(content))
    return str(path)


def test_half_precisions_plan_no_naive_engine_and_no_menu(monkeypatch):
    monkeypatch.setattr(bench, "_gpu_present", lambda: True)
    args = bench.parse_args(["--models", "resnet20", "--precision", "fp32,bf16,fp16", "--engines", "minidnn,naive,torch"])
    cells = [cell for cell in bench.plan_cells(args) if cell["kind"] == "engine"]
    half = [cell for cell in cells if cell["precision"] in ("bf16", "fp16")]
    assert {(c["precision"], c["engine"]) for c in half} == {(p, e) for p in ("bf16", "fp16") for e in ("minidnn", "torch")}
    assert all(c["layer_table"] and not c.get("menu") and not c["tf32"] for c in half)
    assert [c["engine"] for c in cells if c["precision"] == "fp32"] == ["minidnn", "naive", "torch"]
    assert bench.parse_args(["--models", "resnet20", "--tf32", "off,on"]).modes == ["fp32", "tf32"]
    layers_only = bench.parse_args(["--models", "resnet20", "--precision", "bf16", "--engines", "minidnn,torch",
                                    "--layers-only"])
    assert [(c["engine"], c["layer_table"], c["measure_step"]) for c in bench.plan_cells(layers_only)] == \
        [("minidnn", True, False), ("torch", True, False)]


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_half_layer_table_times_the_operands_as_the_autocast_step_holds_them(channels_last):
    """bf16 x, w and dy (channels-last in a channels-last cell) and a float32 weight gradient, as a step under
    autocast makes its convolutions; each row names the plan that ran."""
    cell = {**TINY_CELL, "engine": "minidnn", "precision": "bf16", "channels_last": channels_last}
    engine = measure.MinidnnEngine(cell)
    operand = engine.layer_operand(np.ones((2, 3, 5, 4), np.float32))
    assert operand.dtype == minidnn.bfloat16
    assert minidnn.primitives.layout.is_channels_last(operand) == channels_last
    record = measure.measure_engine({**cell, "measure_step": False, "layer_table": True, "menu": False})
    rows = record["layers"]
    assert len(rows) == 3 and all(set(row["times"]) <= set(measure.DIRECTIONS) for row in rows)
    assert all("plan" in timing and timing["ms"] > 0 for row in rows for timing in row["times"].values())
    problem = measure.conv_layers(engine.model, TINY_CELL["image_size"], "cpu")[0]["problem"].with_batch(2)
    x, w, dy = (engine.layer_operand(np.ones(s, np.float32)) for s in (problem.x_shape, problem.w_shape,
                                                                     problem.y_shape))
    calls = engine.conv_calls(problem, (x, w, dy))
    assert calls["forward"]().dtype == x.dtype and calls["backward_filter"]().dtype == np.float32


@pytest.mark.parametrize("channels_last", [False, True])
def test_pytorchs_layer_gradients_are_autograds_on_the_steps_own_operands(channels_last):
    """The cuDNN rows time what autograd runs: one aten.convolution_backward on the real x, w and dy (not
    torch.nn.grad's stand-in of stride 0, which cuDNN's algorithm choice sees), with autograd's gradients."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415

    from minidnn.primitives.conv.problem import ConvProblem  # noqa: PLC0415

    engine = measure.TorchEngine({**TINY_CELL, "engine": "torch", "precision": "fp32",
                                  "torch_channels_last": channels_last})
    engine.channels_last = channels_last
    rng = np.random.default_rng(7)
    problem = ConvProblem(N=3, C=5, H=9, W=7, K=6, R=3, S=3, stride=(2, 1), padding=(1, 0), dilation=(1, 1), groups=1,
                          dtype=np.dtype(np.float32), device="cpu")
    x, w, dy = (engine.layer_operand(rng.standard_normal(s).astype(np.float32))
                for s in (problem.x_shape, problem.w_shape, problem.y_shape))
    calls = engine.conv_calls(problem, (x, w, dy))

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, function, types, args=(), kwargs=None):
            if function is torch.ops.aten.convolution_backward.default:
                seen.append(args)
            return function(*args, **(kwargs or {}))

    seen: list = []
    with Record():
        dx, dw = calls["backward_data"](), calls["backward_filter"]()
    assert len(seen) == 2 and all(a[1] is x and a[2] is w and a[0] is dy for a in seen)
    x_, w_ = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.nn.functional.conv2d(x_, w_, None, problem.stride, problem.padding).backward(dy)
    torch.testing.assert_close(dx, x_.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, w_.grad, rtol=1e-5, atol=1e-5)


def test_minidnns_layer_rows_run_the_plans_a_captured_step_chooses(monkeypatch):
    """Every minidnn call of the layer table, the kernel-time pass included, runs planned for a graph's replays
    (least GPU time, as cuDNN's benchmark mode), not by the eager rule that weighs the host's time to issue."""
    from minidnn.primitives.conv import registry  # noqa: PLC0415

    engine = measure.MinidnnEngine({**TINY_CELL, "engine": "minidnn"})
    conv_calls, seen = engine.conv_calls, []

    def recording(problem, arrays, **options):
        def recorded(call):
            def run():
                seen.append(registry.planning_for_graph())
                return call()
            return run
        return {direction: recorded(call) for direction, call in conv_calls(problem, arrays, **options).items()}

    monkeypatch.setattr(engine, "conv_calls", recording)
    rows = measure.layer_table(engine, {"layer_repeats": 1, "image_size": TINY_CELL["image_size"], "batch": 2})
    assert rows and len(seen) >= 3 * len(rows) and all(seen)
    assert not registry.planning_for_graph()


def test_pytorchs_half_layer_operands_are_channels_last_in_the_half_type():
    torch = pytest.importorskip("torch")
    engine = measure.TorchEngine({**TINY_CELL, "engine": "torch", "precision": "bf16"})
    operand = engine.layer_operand(np.ones((2, 3, 5, 4), np.float32))
    assert operand.dtype == torch.bfloat16 and operand.is_contiguous(memory_format=torch.channels_last)
    assert not operand.is_contiguous()


@pytest.mark.parametrize("channels_last", [False, True])
def test_torch_channels_last_puts_pytorchs_float_cells_in_that_layout(monkeypatch, channels_last):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(bench, "_gpu_present", lambda: True)
    argv = ["--models", "resnet20", "--precision", "tf32", "--engines", "torch"]
    args = bench.parse_args(argv + (["--torch-channels-last"] if channels_last else []))
    cell = next(cell for cell in bench.plan_cells(args) if cell["kind"] == "engine")
    assert cell["torch_channels_last"] is channels_last
    engine = measure.TorchEngine({**TINY_CELL, "engine": "torch", "precision": "fp32",
                                  "torch_channels_last": cell["torch_channels_last"]})
    assert engine.x.is_contiguous(memory_format=torch.channels_last) == channels_last
    weight = next(p for p in engine.model.parameters() if p.ndim == 4)
    assert weight.is_contiguous(memory_format=torch.channels_last) == channels_last


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_half_precision_cell_trains_under_autocast(monkeypatch, precision):
    """The engine's step runs its forward under autocast (fp16 with a GradScaler), as train.py's --amp does."""
    regions = []
    real = minidnn.autocast

    def recording(device_type, dtype=None, enabled=True):
        regions.append((device_type, dtype))
        return real(device_type, dtype=dtype, enabled=enabled)

    monkeypatch.setattr(minidnn, "autocast", recording)
    engine = measure.MinidnnEngine({**TINY_CELL, "engine": "minidnn", "precision": precision})
    loss = engine.train_step(engine.x, engine.y)
    assert loss.dtype == np.float32 and np.isfinite(loss.item())
    assert regions == [("cpu", minidnn.bfloat16 if precision == "bf16" else minidnn.float16)]
    assert (engine.scaler is not None) == (precision == "fp16")
    assert all(p.grad.dtype == np.float32 for p in engine.model.parameters())


def test_the_eager_engine_settles_its_whole_step_choice_before_it_is_timed(monkeypatch, tmp_path):
    """With find on and its figures made up so that the whole-step trial has two sets to time, prepare() runs steps
    until the trial is over and records how many and the trial's outcome."""
    from minidnn.primitives.conv import registry, selection, step_choice  # noqa: PLC0415

    figures = {"gemm": (1.0, 2.0), "implicit_gemm": (1.6, 0.1)}  # (GPU ms, host ms); any other algorithm is slow

    def measure_made_up(algorithms, problem, direction, repeats):
        return {a.name: selection.AlgoPerf(a.name, figures.get(a.name, (50.0, 50.0))[0], 0, True,
                                           host_ms=figures.get(a.name, (50.0, 50.0))[1]) for a in algorithms}

    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(selection, "_measure", measure_made_up)
    monkeypatch.setitem(registry._defaults, "benchmark", True)
    selection.clear_cache()  # the disk cache of the new directory too
    registry.clear_caches()
    try:
        engine = measure.MinidnnEngine({**TINY_CELL, "engine": "minidnn", "precision": "fp32"})
        engine.step()
        assert step_choice.running()
        engine.prepare()
        assert not step_choice.running()
        assert engine.settling_steps >= 1 + 2 * (1 + step_choice.TIMED_STEPS)  # the first set built, two sets timed
        record = engine.prepared()
        assert record["settling_steps"] == engine.settling_steps
        assert record["step_choice"]["sets"] == 2 and record["step_choice"]["chosen"] in (0, 1)
        assert record["step_choice"]["algorithms"][0] == {"implicit_gemm": record["step_choice"]["calls"]}
    finally:
        selection.clear_cache()
        registry.clear_caches()


def test_a_captured_fp16_cell_is_captured_with_its_loss_scaler(monkeypatch):
    captured = []

    class Step:  # what graphs.capture returns: a callable replaying the step
        def __init__(self, step_fn, batch, plan_memory):
            captured.append(step_fn)
            self.step_fn, self.batch = step_fn, batch

        def __call__(self, *batch):
            return self.step_fn(*batch)

    monkeypatch.setattr(minidnn.cuda, "graphs", types.SimpleNamespace(capture=Step, EagerStep=type("EagerStep", (), {})),
                        raising=False)
    engine = measure.CapturedMinidnnEngine({**TINY_CELL, "engine": "minidnn-graph", "precision": "fp16"})
    engine.prepare()
    assert engine.prepared() == {"channels_last": False, "captured": True, "memory_plan": True} \
        and captured == [engine.train_step]
    engine.step()  # the replay runs the step with the scaler (the stand-in runs it eagerly)
    assert engine.scaler.get_scale() == 2.0 ** 16


@pytest.mark.parametrize("no_plan", [False, True])
def test_no_memory_plan_reaches_the_cells(no_plan):
    args = bench.parse_args(["--models", "resnet20", "--device", "cpu"] + (["--no-memory-plan"] if no_plan else []))
    cells = [cell for cell in bench.plan_cells(args) if cell["kind"] == "engine"]
    assert cells and all(cell["plan_memory"] is (not no_plan) for cell in cells)
