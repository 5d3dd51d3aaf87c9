"""benchmarks/ab.py: trees alternated round by round, each run a process of its own on its own tree and find cache,
and the medians and ratios of what they measured."""
import json
import os
import textwrap

import pytest

from benchmarks import ab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A stand-in bench.py: records what it was asked and in what environment, and a wall time read from its tree.
FAKE_BENCH = textwrap.dedent("""
    import json, os, sys
    args = sys.argv[1:]
    value = lambda flag: args[args.index(flag) + 1]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    wall = float(open(os.path.join(here, "wall.txt")).read())
    record = {"engine": value("--engines"), "wall_ms": wall, "host_ms": wall - 1, "gpu_busy_ms": None,
              "kernels_per_step": 7, "pid": os.getpid(), "model": value("--models"), "batch": int(value("--batch")),
              "precision": value("--precision"), "pythonpath": os.environ["PYTHONPATH"],
              "cache": os.environ["MINIDNN_CACHE_DIR"], "cwd": os.getcwd(), "extra": args[:2],
              "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    os.makedirs(value("--out"), exist_ok=True)
    json.dump({"records": [record]}, open(os.path.join(value("--out"), "bench.json"), "w"))
""")


def fake_tree(root, name, wall):
    os.makedirs(root / name / "benchmarks")
    (root / name / "benchmarks" / "bench.py").write_text(FAKE_BENCH)
    (root / name / "wall.txt").write_text(str(wall))
    return str(root / name)


def test_the_trees_alternate_round_by_round_with_torch_after_them():
    cells = [("resnet20", 128, "fp32"), ("resnet18", 64, "bf16")]
    order = [(cell[0], name, round_) for cell, name, round_ in ab.schedule(["head", "new"], cells, 3, torch=True)]
    assert order == [("resnet20", "head", 1), ("resnet20", "new", 1), ("resnet20", "torch", 1),
                     ("resnet18", "head", 1), ("resnet18", "new", 1), ("resnet18", "torch", 1),
                     ("resnet20", "new", 2), ("resnet20", "head", 2), ("resnet20", "torch", 2),
                     ("resnet18", "new", 2), ("resnet18", "head", 2), ("resnet18", "torch", 2),
                     ("resnet20", "head", 3), ("resnet20", "new", 3), ("resnet20", "torch", 3),
                     ("resnet18", "head", 3), ("resnet18", "new", 3), ("resnet18", "torch", 3)]


def test_each_run_is_a_process_of_its_own_on_its_tree_and_find_cache(tmp_path, capsys):
    head, new = fake_tree(tmp_path, "head", 10.0), fake_tree(tmp_path, "new", 7.5)
    result = ab.main(["--tree", f"head={head}", "--tree", f"new={new}", "--cells", "resnet20:128:fp32", "--rounds",
                      "2", "--bench-args=--device cuda --steps 20", "--out", str(tmp_path / "out")])
    runs = result["runs"]
    assert [(r["name"], r["round"], r["rc"]) for r in runs] == [("head", 1, 0), ("new", 1, 0), ("new", 2, 0),
                                                                 ("head", 2, 0)]
    assert len({r["pid"] for r in runs}) == 4
    records = {(r["name"], r["round"]): json.loads((tmp_path / "out" / f"resnet20-128-fp32-{r['name']}-{r['round']}"
                                                    / "bench.json").read_text())["records"][0] for r in runs}
    caches = {name: {records[name, n]["cache"] for n in (1, 2)} for name in ("head", "new")}
    assert len(caches["head"]) == 1 and len(caches["new"]) == 1 and caches["head"] != caches["new"]
    for (name, _), record in records.items():
        tree = head if name == "head" else new
        assert record["pythonpath"].split(os.pathsep)[0] == tree and record["cwd"] == tree
        assert (record["model"], record["batch"], record["precision"], record["engine"]) == \
            ("resnet20", 128, "fp32", "minidnn")
        assert record["extra"] == ["--device", "cuda"]
    head_row, new_row = result["summary"]
    assert head_row["wall_ms"] == {"median": 10.0, "least": 10.0, "greatest": 10.0}
    assert new_row["over_first"] == {"wall_ms": 0.75, "host_ms": 6.5 / 9.0}
    table = (tmp_path / "out" / "ab.md").read_text()
    assert "| resnet20-128-fp32 | new | 2 | 7.50 (7.50-7.50) | 6.50 (6.50-6.50) | - | 7 (7-7) | 0.75, 0.72 |" in table
    assert json.loads((tmp_path / "out" / "ab.json").read_text())["summary"] == result["summary"]


def test_the_summary_takes_medians_and_divides_by_the_first_tree():
    runs = [{"cell": "c", "name": name, "wall_ms": wall, "host_ms": host, "gpu_busy_ms": 4.0, "kernels_per_step": 9}
            for name, wall, host in (("head", 10.0, 9.0), ("head", 20.0, 19.0), ("head", 12.0, 11.0),
                                     ("new", 8.0, 7.0), ("new", 9.0, 8.0), ("new", 30.0, 29.0),
                                     ("torch", 6.0, 5.0))]
    runs.append({"cell": "c", "name": "new", "rc": None, "skipped": "out of time"})
    head, new, torch = ab.summarise(runs, ["head", "new", "torch"])
    assert head["runs"] == 3 and new["runs"] == 3 and torch["runs"] == 1
    assert head["wall_ms"] == {"median": 12.0, "least": 10.0, "greatest": 20.0}
    assert new["host_ms"] == {"median": 8.0, "least": 7.0, "greatest": 29.0}
    assert new["over_first"] == {"wall_ms": 9.0 / 12.0, "host_ms": 8.0 / 11.0}
    assert "over_first" not in torch and "over_torch" not in torch
    assert head["over_torch"] == {"wall_ms": 12.0 / 6.0, "host_ms": 11.0 / 5.0}
    assert new["over_torch"] == {"wall_ms": 9.0 / 6.0, "host_ms": 8.0 / 5.0}
    table = ab.markdown([head, new, torch], ["head", "new", "torch"])
    assert table.splitlines()[0].endswith("| wall, host median / head's | wall, host median / PyTorch's |")
    assert "| 0.75, 0.73 | 1.50, 1.60 |" in table and table.splitlines()[-1].endswith("| - | - |")
    assert "over_torch" not in ab.summarise([r for r in runs if r["name"] != "torch"], ["head", "new"])[1]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_cpus_pin_every_run_and_are_recorded(tmp_path):
    tree = fake_tree(tmp_path, "only", 3.0)
    cpu = min(os.sched_getaffinity(0))
    result = ab.main(["--tree", f"only={tree}", "--cells", "tiny:3:fp32", "--rounds", "1", "--torch", "--cpus",
                      str(cpu), "--out", str(tmp_path / "out")])
    assert result["cpus"] == [cpu]
    for name in ("only", "torch"):
        record = json.loads((tmp_path / "out" / f"tiny-3-fp32-{name}-1" / "bench.json").read_text())["records"][0]
        assert record["cpus"] == [cpu]
    assert ab.parse_cpus("0-2,5") == {0, 1, 2, 5}


def test_a_budget_spent_skips_and_records_the_runs_left(tmp_path):
    tree = fake_tree(tmp_path, "only", 3.0)
    result = ab.main(["--tree", f"only={tree}", "--cells", "tiny:3:fp32", "--rounds", "2", "--budget-seconds", "0",
                      "--out", str(tmp_path / "out")])
    assert [r.get("skipped") for r in result["runs"]] == ["out of time", "out of time"]
    assert result["summary"] == [{"cell": "tiny-3-fp32", "name": "only", "runs": 0, "wall_ms": None, "host_ms": None,
                                  "gpu_busy_ms": None, "kernels_per_step": None, "over_first": {}}]


@pytest.mark.parametrize("arguments, message", [
    (["--tree", "a=.", "--cells", "resnet20:0:fp32"], "model:batch:precision"),
    (["--tree", "a=.", "--cells", "resnet20:128"], "model:batch:precision"),
    (["--tree", "a b=.", "--cells", "tiny:3:fp32"], "NAME=PATH"),
    (["--tree", "torch=.", "--cells", "tiny:3:fp32"], "NAME=PATH"),
    (["--tree", "a=/nonexistent", "--cells", "tiny:3:fp32"], "no benchmarks/bench.py"),
    (["--tree", "a=.", "--tree", "a=.", "--cells", "tiny:3:fp32"], "names must differ"),
    (["--tree", "a=.", "--cells", "tiny:3:fp32", "--rounds", "0"], "--rounds must be >= 1"),
    (["--tree", "a=.", "--cells", "tiny:3:fp32", "--bench-args=--steps 'two"], "--bench-args"),
    (["--tree", "a=.", "--cells", "tiny:3:fp32", "--cpus", "3-1"], "--cpus must be"),
    (["--tree", "a=.", "--cells", "tiny:3:fp32", "--cpus", "a"], "--cpus must be"),
    (["--tree", "a=.", "--cells", "tiny:3:fp32", "--cpus", "100000"], "not all among"),
])
def test_bad_arguments(arguments, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stopped:
        ab.parse_args(arguments + ["--out", "unused"])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_the_real_bench_alternates_on_the_cpu(tmp_path):
    """End to end with the checkout's own bench on the CPU: its records are read back."""
    result = ab.main(["--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--cells", "tiny:3:fp32", "--rounds", "1",
                      ("--bench-args=--device cpu --quick --warmup 1 --steps 1 --profile-steps 0 --no-layers "
                       "--no-agreement"), "--out", str(tmp_path / "out")])
    assert [r["rc"] for r in result["runs"]] == [0, 0], [(tmp_path / "out" / f"tiny-3-fp32-{n}-1" / "run.log").read_text()
                                                       for n in "ab"]
    assert all(r["wall_ms"] > 0 and r["host_ms"] > 0 for r in result["runs"])
