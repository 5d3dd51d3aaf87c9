"""train.py end to end on tiny built-in data: outputs, exact resume, evaluation, argument errors."""
import json

import numpy as np
import pytest

import minidnn
import train

TINY = ["--model", "tiny_cnn", "--train-size", "160", "--test-size", "60", "--batch-size", "16", "--workers", "0",
        "--log-every", "2"]


@pytest.fixture(autouse=True)
def data_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MINIDNN_DATA", str(tmp_path_factory.getbasetemp() / "data"))


def parameters(path):
    return {k: v for k, v in minidnn.read_checkpoint(path).model_state.items()}


def test_a_run_writes_metrics_curves_and_checkpoints(tmp_path):
    result = train.main(TINY + ["--epochs", "2", "--out", str(tmp_path)])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    assert {"train_loss", "test_accuracy", "lr", "images_per_second"} <= set(json.loads(lines[0]))
    assert (tmp_path / "last.npz").exists() and (tmp_path / "best.npz").exists()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert result["step"] == 20


def test_stopping_and_resuming_gives_bitwise_the_same_parameters(tmp_path):
    options = TINY + ["--epochs", "2", "--optimizer", "sgd", "--warmup", "0.5"]
    train.main(options + ["--out", str(tmp_path / "straight")])
    stopped = train.main(options + ["--out", str(tmp_path / "resumed"), "--max-steps", "7"])
    assert stopped == {"step": 7, "stopped": True}
    train.main(options + ["--out", str(tmp_path / "resumed"), "--resume", str(tmp_path / "resumed" / "last.npz")])
    straight, resumed = parameters(tmp_path / "straight" / "last.npz"), parameters(tmp_path / "resumed" / "last.npz")
    for name in straight:
        np.testing.assert_array_equal(straight[name], resumed[name], err_msg=name)
    history = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    for ours, theirs in zip(history, expected):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-6)
        assert ours["test_accuracy"] == theirs["test_accuracy"]


def test_eval_only(tmp_path, capsys):
    train.main(TINY + ["--epochs", "1", "--out", str(tmp_path)])
    result = train.main(TINY + ["--eval-only", "--resume", str(tmp_path / "best.npz")])
    assert 0 <= result["test_accuracy"] <= 1
    assert "test accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("arguments, message", [
    (["--lr", "-0.1"], "must be > 0.0"),
    (["--model", "vgg99"], "invalid choice"),
    (["--epochs", "0"], "must be >= 1"),
    (["--workspace-limit", "8 MB"], "workspace size must be a whole number"),
    (["--workspace-limit", "-1"], "workspace size must be a whole number"),
    (["--microbatch", "greedy"], "invalid choice"),
])
def test_bad_arguments_are_one_line_errors(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(TINY + arguments)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_setup_errors_are_one_line_messages(tmp_path):
    with pytest.raises(SystemExit, match="train.py: error: --data '/no/such/dir' is neither"):
        train.main(TINY + ["--data", "/no/such/dir", "--out", str(tmp_path / "x")])
    train.main(TINY + ["--epochs", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="train.py: error: --model shapes_cnn differs from the checkpoint's --model "
                                         "tiny_cnn"):
        train.main(TINY + ["--model", "shapes_cnn", "--resume", str(tmp_path / "last.npz"), "--out", str(tmp_path)])
    other = tmp_path / "other.npz"
    minidnn.save_checkpoint(other, minidnn.nn.Linear(2, 2))
    with pytest.raises(SystemExit, match="train.py: error: .*other.npz' is a minidnn checkpoint, but not one of train.py"):
        train.main(TINY + ["--resume", str(other), "--out", str(tmp_path / "y")])
    with pytest.raises(SystemExit, match="CUDA is not available") if not minidnn.cuda.is_available() else \
            pytest.raises(SystemExit, match="device must be"):
        train.main(TINY + ["--device", "cuda" if not minidnn.cuda.is_available() else "tpu", "--out", str(tmp_path / "z")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()  # cheap checks come before --out is made


def test_help_reads_well(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = capsys.readouterr().out
    for option in ("--model", "--data", "--resume", "--eval-only", "--device", "--warmup", "--schedule"):
        assert option in text


def test_ctrl_c_saves_a_resumable_checkpoint_and_exits_130(tmp_path, monkeypatch):
    import os
    import signal

    options = TINY + ["--epochs", "3", "--out", str(tmp_path)]
    calls = []
    real_loss = train.F.cross_entropy

    def loss_then_ctrl_c(*args, **kwargs):  # Ctrl-C arrives in the middle of step 5
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(train.F, "cross_entropy", loss_then_ctrl_c)
    with pytest.raises(SystemExit) as stopped:
        train.main(options)
    monkeypatch.undo()
    assert stopped.value.code == 130  # 128 + SIGINT, as a shell reports a Ctrl-C'd program
    assert minidnn.read_checkpoint(tmp_path / "last.npz").step == 5  # the step in flight finished, then the run stopped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are put back
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finished = train.main(options + ["--resume", str(tmp_path / "last.npz")])
    assert finished["step"] == 30


def test_convolution_settings_reach_the_primitives(tmp_path, capsys):
    from minidnn.primitives.conv import planner, registry
    before = dict(registry._defaults)
    try:
        train.main(TINY + ["--epochs", "1", "--max-steps", "2", "--workspace-limit", "1MiB", "--microbatch", "wr",
                           "--batch-policy", "all", "--out", str(tmp_path)])
        assert registry.workspace_limit() == 1 << 20
        assert (registry.microbatch_mode(), registry.batch_policy()) == ("wr", "all")
    finally:
        registry._defaults.clear()
        registry._defaults.update(before)
    planner.reset_network()
    try:
        train.main(TINY + ["--epochs", "1", "--max-steps", "2", "--microbatch", "wd", "--workspace-limit", "1MiB",
                           "--out", str(tmp_path / "wd")])
        assert planner._solved  # one plan per convolution kernel of the step, from one shared budget
    finally:
        registry._defaults.clear()
        registry._defaults.update(before)
        planner.reset_network()
    assert "--microbatch wd: one plan for the network's convolutions" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--cuda-graph needs --device cuda"):
        train.main(TINY + ["--cuda-graph", "--out", str(tmp_path / "graph")])
