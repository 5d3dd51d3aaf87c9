"""train.py data-parallel on the CPU (the tcp backend): --gpus 2, resume across world sizes, a rank that dies.

Each run is two rank processes on tiny built-in data. This file is also a rank's script when a test needs to see
inside the ranks (``python tests/test_train_distributed.py MODE OUT train.py-arguments...``): ``weights`` runs
train.py and writes each rank's weights to OUT, ``die`` makes rank 1 fail in its third training step. The GPU tests
(``gpu``) run the one-GPU NCCL path against the plain run.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # as a rank's script, run from tests/

import minidnn  # noqa: E402
import train  # noqa: E402
from minidnn.distributed import run as launcher  # noqa: E402
from tests.test_distributed import _environment, free_port  # noqa: E402

# 96 images, a global batch of 32: 3 steps an epoch; SyncBatchNorm makes two ranks compute what one process does.
TINY = ["--model", "tiny_cnn", "--train-size", "96", "--test-size", "40", "--workers", "0", "--log-every", "2",
        "--epochs", "2", "--sync-batchnorm"]
GLOBAL_BATCH = 32


@pytest.fixture(autouse=True)
def data_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MINIDNN_DATA", str(tmp_path_factory.getbasetemp() / "data"))


def launch_this_file(mode: str, out, arguments: list[str], nproc: int = 2, grace: float = 5.0) -> int:
    """Start ``nproc`` ranks of this file through the launcher (in this process); returns the job's exit code."""
    with _environment({"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}):
        return launcher.main(["--nproc-per-node", str(nproc), "--master-port", str(free_port()), "--grace-period",
                              str(grace), __file__, mode, str(out), *arguments])


def weights(path) -> dict[str, np.ndarray]:
    return dict(minidnn.read_checkpoint(path).model_state)


def history(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_close_runs(ours, theirs, rtol=1e-3, atol=5e-5):
    """Two runs' last.npz weights and metrics, equal within float32 rounding (different summation orders)."""
    mine, reference = weights(ours / "last.npz"), weights(theirs / "last.npz")
    assert mine.keys() == reference.keys()
    for key, value in reference.items():
        np.testing.assert_allclose(mine[key], value, rtol=rtol, atol=atol, err_msg=key)
    for row, expected in zip(history(ours), history(theirs), strict=True):
        assert row["step"] == expected["step"]
        for key in ("train_loss", "test_loss"):
            assert row[key] == pytest.approx(expected[key], rel=1e-5), key
        for key in ("train_accuracy", "test_accuracy"):
            assert row[key] == pytest.approx(expected[key], abs=1e-9), key


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process, the global batch."""
    out = tmp_path_factory.mktemp("one")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIDNN_DATA", str(tmp_path_factory.getbasetemp() / "data"))
        train.main(TINY + ["--batch-size", str(GLOBAL_BATCH), "--out", str(out)])
    return out


def test_gpus_2_on_the_cpu_trains_as_one_process_on_the_global_batch(tmp_path, one_process, capfd):
    out = tmp_path / "two"
    started = time.monotonic()
    result = train.main(TINY + ["--gpus", "2", "--device", "cpu", "--batch-size", str(GLOBAL_BATCH // 2),
                                "--out", str(out)])
    assert result == {"world_size": 2, "exit_code": 0}
    assert time.monotonic() - started < 30
    captured = capfd.readouterr()
    assert captured.out.count("epoch 1: train loss") == 1 and captured.out.count("best test accuracy") == 1
    assert "rank 1" not in captured.err
    expected = {"last.npz", "best.npz", "metrics.jsonl", train.LOCK_FILE} | (
        {"curves.png"} if (one_process / "curves.png").exists() else set())
    assert {path.name for path in out.iterdir()} == expected  # rank 0's files, nothing of rank 1
    assert minidnn.read_checkpoint(out / "last.npz").extra["world_size"] == 2
    assert_close_runs(out, one_process)


def test_ranks_hold_the_same_weights_and_a_two_process_run_resumes_with_one(tmp_path, one_process):
    out = tmp_path / "run"
    arguments = TINY + ["--batch-size", str(GLOBAL_BATCH // 2), "--out", str(out), "--max-steps", "4"]
    assert launch_this_file("weights", tmp_path, arguments) == 0
    ranks = [np.load(tmp_path / f"rank{rank}.npz", allow_pickle=False) for rank in range(2)]
    for key in ranks[0].files:  # bit for bit: the same averaged gradients, the same updates
        np.testing.assert_array_equal(ranks[1][key], ranks[0][key], err_msg=key)
    saved = minidnn.read_checkpoint(out / "last.npz")
    assert saved.step == 4 and saved.extra["world_size"] == 2
    for key, value in saved.model_state.items():
        np.testing.assert_array_equal(value, ranks[0][key], err_msg=key)
    # One process goes on with --batch-size 32, the same global batch: the straight one-process run's end.
    result = train.main(["--resume", str(out / "last.npz"), "--workers", "0"])
    assert result["step"] == 6
    assert_close_runs(out, one_process)


def test_a_one_process_run_resumes_with_two_and_a_global_batch_that_does_not_divide_is_refused(tmp_path,
                                                                                                one_process):
    out = tmp_path / "run"
    stopped = train.main(TINY + ["--batch-size", str(GLOBAL_BATCH), "--out", str(out), "--max-steps", "2"])
    assert stopped == {"step": 2, "stopped": True}
    result = train.main(["--resume", str(out / "last.npz"), "--workers", "0", "--gpus", "2"])
    assert result["exit_code"] == 0
    saved = minidnn.read_checkpoint(out / "last.npz")
    assert saved.step == 6 and saved.extra["world_size"] == 2 and saved.extra["args"]["batch_size"] == 16
    assert_close_runs(out, one_process)
    with pytest.raises(ValueError, match="global batch of 32 .* does not divide among 3 processes"):
        train.resume_settings(train.parse_args(["--resume", str(out / "last.npz")]), saved, world_size=3)


def test_a_rank_that_dies_ends_the_job_with_a_message_naming_it(tmp_path, capfd):
    started = time.monotonic()
    code = launch_this_file("die", tmp_path, TINY + ["--batch-size", "16", "--out", str(tmp_path / "run")],
                            grace=2.0)
    elapsed = time.monotonic() - started
    err = capfd.readouterr().err
    assert code != 0 and elapsed < 30
    assert "injected failure in rank 1" in err and "python -m minidnn.distributed.run: rank " in err
    # The launcher names the first rank it sees end: rank 1, or rank 0 if rank 0's collective failed first, and
    # then rank 0's error names rank 1 as the rank that died.
    assert "rank 1 (local rank 1" in err or "rank 1 closed its connection" in err
    assert not (tmp_path / "run" / "last.npz").exists()  # it died in epoch 1, before anything was saved


def test_a_signal_stops_every_rank_after_the_same_step_and_rank_0_saves_it(tmp_path, one_process, capfd):
    """SIGTERM to the launcher in step 3: the ranks agree where they next meet (step 3, the epoch's last, or step 4
    if the signal reaches a rank after that meeting; --log-every 2), rank 0 saves last.npz while the others wait,
    the job exits 143; resumed by one process, the run ends where one process's does."""
    out = tmp_path / "run"
    code = launch_this_file("signal", tmp_path, TINY + ["--batch-size", "16", "--out", str(out)])
    assert code == 143
    assert "every rank" not in capfd.readouterr().err
    assert minidnn.read_checkpoint(out / "last.npz").step in (3, 4)
    train.main(["--resume", str(out / "last.npz"), "--workers", "0"])
    assert_close_runs(out, one_process)


def test_gpus_is_checked(capsys):
    with pytest.raises(SystemExit):
        train.parse_args(TINY + ["--gpus", "0"])
    assert "--gpus: must be >= 1" in capsys.readouterr().err
    visible = minidnn.cuda.device_count()
    with pytest.raises(SystemExit):
        train.parse_args(TINY + ["--device", "cuda", "--gpus", str(max(visible + 1, 2))])
    assert f"is more than the {visible} CUDA GPU(s)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.parse_args(TINY + ["--device", "cuda:1", "--gpus", "2"])
    assert "give --device cuda" in capsys.readouterr().err


def test_gpus_under_the_launcher_must_match_it(monkeypatch):
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit, match="--gpus 3, but the launcher started 2 process"):
        train.main(TINY + ["--gpus", "3"])


# ----------------------------------------------------------------------------------------------
# GPU: the one-GPU NCCL path
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_one_rank_nccl_under_the_launcher_gives_the_plain_runs_losses(tmp_path):
    """--nproc-per-node 1 with --device cuda: DDP over one NCCL rank, the DistributedSampler and the sharded
    evaluation; deterministic kernels, so the losses and weights are the plain run's (the all-reduce of one rank
    averages by 1)."""
    arguments = TINY + ["--batch-size", "16", "--device", "cuda", "--deterministic", "--no-cuda-graph"]
    train.main(arguments + ["--out", str(tmp_path / "plain")])
    assert launch_this_file("weights", tmp_path, arguments + ["--gpus", "1", "--out", str(tmp_path / "nccl")],
                            nproc=1) == 0
    assert minidnn.read_checkpoint(tmp_path / "nccl" / "last.npz").extra["world_size"] == 1
    for row, expected in zip(history(tmp_path / "nccl"), history(tmp_path / "plain"), strict=True):
        for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
            assert row[key] == pytest.approx(expected[key], rel=1e-6), key
    mine, reference = weights(tmp_path / "nccl" / "last.npz"), weights(tmp_path / "plain" / "last.npz")
    for key, value in reference.items():
        np.testing.assert_array_equal(mine[key], value, err_msg=key)


@pytest.mark.gpu
def test_one_rank_nccl_with_the_captured_step(tmp_path):
    """The default GPU step (one CUDA graph) with DDP on NCCL follows the plain captured run within float32."""
    arguments = TINY + ["--batch-size", "16", "--device", "cuda", "--deterministic"]
    train.main(arguments + ["--out", str(tmp_path / "plain")])
    assert launch_this_file("weights", tmp_path, arguments + ["--out", str(tmp_path / "nccl")], nproc=1) == 0
    assert_close_runs(tmp_path / "nccl", tmp_path / "plain")


# ----------------------------------------------------------------------------------------------
# The ranks' script
# ----------------------------------------------------------------------------------------------
def rank_main(mode: str, out: str, arguments: list[str]) -> None:
    rank = int(os.environ["RANK"])
    runs = []
    prepare = train.prepare

    def keep(*args, **kwargs):
        runs.append(prepare(*args, **kwargs))
        return runs[-1]

    train.prepare = keep
    if mode == "signal" and rank == 0:
        steps = []
        cross_entropy = train.F.cross_entropy

        def signalling(*args, **kwargs):
            steps.append(1)
            if len(steps) == 3:
                os.kill(os.getppid(), signal.SIGTERM)  # the launcher, which forwards it to every rank
            return cross_entropy(*args, **kwargs)

        train.F.cross_entropy = signalling
    if mode == "die":
        calls = []
        cross_entropy = train.F.cross_entropy

        def failing(*args, **kwargs):
            calls.append(1)
            if rank == 1 and len(calls) == 3:
                raise RuntimeError("injected failure in rank 1")
            return cross_entropy(*args, **kwargs)

        train.F.cross_entropy = failing
    try:
        train.main(arguments, own_process=True)
    except SystemExit as stop:
        if mode != "signal":
            raise
        sys.exit(stop.code)
    if mode == "weights":
        state = {key: np.asarray(value.numpy() if hasattr(value, "numpy") else value)
                 for key, value in runs[0].model.state_dict().items()}
        np.savez(os.path.join(out, f"rank{rank}.npz"), **state)


if __name__ == "__main__":
    rank_main(sys.argv[1], sys.argv[2], sys.argv[3:])
