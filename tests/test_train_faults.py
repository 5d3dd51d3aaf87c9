"""train.py under faults (issue 9): each test is one way a run used to lose work or report a wrong
number without saying so. Runs go through ``train.main(argv)`` in this process, or through a
subprocess where real signals and ``kill -9`` are needed; models and data are tiny."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import minidnn
import models
import train
from minidnn.checkpoint import temporary_pattern
from tests.test_serialization import DAMAGES, damages, put, with_members, with_metadata

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--model", "tiny_cnn", "--train-size", "160", "--test-size", "60", "--batch-size", "16", "--workers", "0",
        "--log-every", "2", "--image-size", "16"]
TWO_EPOCHS = TINY + ["--epochs", "2"]  # 10 steps per epoch


@pytest.fixture(autouse=True)
def data_cache_and_no_plots(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MINIDNN_DATA", str(tmp_path_factory.getbasetemp() / "data"))
    # Plotting curves.png costs more than training these tiny runs; test_train.py checks the curves.
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def run_once(tmp_path_factory, name, arguments):
    """A folder of its own where ``train.main(arguments)`` ran, as the autouse fixture runs it (for module fixtures)."""
    out = tmp_path_factory.mktemp(name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIDNN_DATA", str(tmp_path_factory.getbasetemp() / "data"))
        patch.setitem(sys.modules, "matplotlib", None)
        train.main(arguments + ["--out", str(out)])
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A two-epoch run that was never stopped: (its folder, its metrics rows)."""
    out = run_once(tmp_path_factory, "straight", TWO_EPOCHS)
    return out, rows(out)


def rows(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def parameters(path):
    return minidnn.read_checkpoint(path).model_state


def assert_same_parameters(a, b):
    a, b = parameters(a), parameters(b)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def assert_same_history(ours, theirs):
    assert [row["epoch"] for row in ours] == [row["epoch"] for row in theirs]
    for mine, expected in zip(ours, theirs):
        for key in ("step", "test_accuracy", "test_loss", "lr", "train_accuracy"):
            assert mine[key] == pytest.approx(expected[key], rel=1e-6), key
        assert mine["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-6)


def temporaries(folder):
    return [name for name in os.listdir(folder) if "tmp" in name]


def signal_at_step(monkeypatch, step, *signals):
    """Make the cross-entropy of training step ``step`` send ``signals`` to this process."""
    calls, real = [], train.F.cross_entropy

    def loss(*args, **kwargs):
        if kwargs.get("label_smoothing") is not None:  # training steps pass it, evaluation does not
            calls.append(1)
            if len(calls) == step:
                for number in signals:
                    os.kill(os.getpid(), number)
        return real(*args, **kwargs)

    monkeypatch.setattr(train.F, "cross_entropy", loss)


# ------------------------------------------------------------------ 1. class indices of image folders
def save_png(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


def image_folder(root, train_classes=("ant", "cat", "dog"), val_classes=("cat", "dog"), per_class=4):
    for index, name in enumerate(train_classes):
        for i in range(per_class):
            save_png(root / "train" / name / f"{i}.png", 40 * index + i)
    for index, name in enumerate(val_classes):
        save_png(root / "val" / name / "0.png", 40 * index)
    return root


FOLDER = ["--model", "tiny_cnn", "--format", "imagefolder", "--image-size", "8", "--batch-size", "4", "--workers",
          "0", "--epochs", "1"]


def test_validation_split_uses_the_training_class_indices(tmp_path, capsys):
    # val/ lacks "ant": indexed on its own, a cat would be scored as class 0 while the model learned cat = 1.
    root = image_folder(tmp_path / "images")
    run = train.prepare(train.parse_args(FOLDER + ["--data", str(root), "--out", str(tmp_path / "a")]))
    assert run.test_loader.dataset.targets == [1, 2]
    assert [labels.numpy().tolist() for _, labels in run.test_loader] == [[1, 2]]
    assert "train.py: warning: ImageFolder root" in capsys.readouterr().err
    save_png(root / "val" / "eel" / "0.png", 200)  # a class training does not know: an error naming it
    with pytest.raises(SystemExit, match=r"train.py: error: ImageFolder root .*val' has class directories that are "
                                         r"not among the given classes: eel"):
        train.main(FOLDER + ["--data", str(root), "--out", str(tmp_path / "b")])


def test_a_missing_validation_class_is_a_warning_naming_it(tmp_path, capsys):
    root = image_folder(tmp_path / "images")
    result = train.main(FOLDER + ["--data", str(root), "--out", str(tmp_path / "out")])
    assert result["step"] == 3
    err = capsys.readouterr().err
    assert "train.py: warning: ImageFolder root" in err and "no directory for the classes: ant" in err


# ------------------------------------------------------------------ 2. a run folder is never overwritten
def test_a_new_run_refuses_a_folder_that_holds_one(tmp_path):
    out = tmp_path / "run"
    train.main(TINY + ["--epochs", "1", "--out", str(out)])
    before = {name: (out / name).read_bytes() for name in ("best.npz", "last.npz", "metrics.jsonl")}
    with pytest.raises(SystemExit, match=rf"train.py: error: --out '{out}' already holds a run \(last.npz, best.npz, "
                                         rf"metrics.jsonl.*\); continue it with --resume {out}/last.npz, start a new "
                                         rf"run with another --out, or add --overwrite to replace it"):
        train.main(TINY + ["--epochs", "1", "--lr", "0.001", "--out", str(out)])
    assert {name: (out / name).read_bytes() for name in before} == before
    # Resuming best.npz (an earlier point) into the folder would replace its last.npz and metrics.
    with pytest.raises(SystemExit, match="holds a run .*that resuming .*best.npz' there would replace"):
        train.main(["--resume", str(out / "best.npz")])
    assert {name: (out / name).read_bytes() for name in before} == before
    train.main(TINY + ["--epochs", "2", "--lr", "0.001", "--out", str(out), "--overwrite"])
    assert [row["epoch"] for row in rows(out)] == [1, 2] and not (out / "best.npz").read_bytes() == before["best.npz"]


def test_the_default_out_refuses_a_second_default_run_with_the_way_out(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default --out is runs/<model> under the working directory
    train.main(TINY + ["--epochs", "1"])
    with pytest.raises(SystemExit) as refused:
        train.main(TINY + ["--epochs", "1"])
    assert "--resume runs/tiny_cnn/last.npz" in str(refused.value) and "--overwrite" in str(refused.value)
    assert train.main(["--resume", "runs/tiny_cnn/last.npz"])["step"] == 10  # --out defaults to the checkpoint's


# ------------------------------------------------------------------ 3. a stop on an epoch's last step
def test_max_steps_at_an_epoch_boundary_loses_no_epoch(tmp_path, straight):
    out = tmp_path / "run"
    assert train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "10"]) == {"step": 10, "stopped": True}
    train.main(["--resume", str(out / "last.npz")])
    assert_same_history(rows(out), straight[1])  # epoch 1 evaluated once; epoch 2's loss over its own steps
    assert_same_parameters(out / "best.npz", straight[0] / "best.npz")
    assert_same_parameters(out / "last.npz", straight[0] / "last.npz")


def test_ctrl_c_in_the_last_step_of_an_epoch_loses_no_epoch(tmp_path, monkeypatch, straight):
    out = tmp_path / "run"
    signal_at_step(monkeypatch, 10, signal.SIGINT)
    with pytest.raises(SystemExit, match="130"):
        train.main(TWO_EPOCHS + ["--out", str(out)])
    monkeypatch.undo()
    assert not (out / "metrics.jsonl").exists()  # stopped at once: the evaluation is the resume's job
    train.main(["--resume", str(out / "last.npz")])
    assert_same_history(rows(out), straight[1])
    assert_same_parameters(out / "last.npz", straight[0] / "last.npz")


# ------------------------------------------------------------------ 4. resume with changed settings
@pytest.mark.parametrize("option, value, saved", [
    ("--epochs", "3", "2"), ("--batch-size", "8", "16"), ("--lr", "0.1", "0.05"), ("--schedule", "step", "cosine"),
    ("--seed", "1", "0"), ("--optimizer", "adam", "sgd"),
])
def test_resume_refuses_a_setting_that_changes_the_run(tmp_path, option, value, saved):
    out = tmp_path / "run"
    train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "4"])
    with pytest.raises(SystemExit, match=f"train.py: error: {option} {value} differs from the checkpoint's {option} "
                                         f"{saved}: .*leave {option} out to keep {saved}"):
        train.main(TWO_EPOCHS + ["--resume", str(out / "last.npz"), option, value])
    assert minidnn.read_checkpoint(out / "last.npz").step == 4


def test_resume_carries_the_settings_over_and_says_so(tmp_path, capsys, straight):
    out = tmp_path / "run"
    train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "7"])
    capsys.readouterr()
    train.main(["--resume", str(out / "last.npz"), "--workers", "1"])  # --workers does not change the numbers
    said = capsys.readouterr().out
    assert f"resuming {out / 'last.npz'} at step 7 with its settings --model tiny_cnn --epochs 2 " \
           f"--batch-size 16" in said
    assert_same_parameters(out / "last.npz", straight[0] / "last.npz")
    assert rows(out)[-1]["lr"] == 0.0  # the cosine ends at 0 at the last step and never rises again


# ------------------------------------------------------------------ 5. failures found early, or kept small
def test_an_unwritable_out_is_found_before_the_data_is_loaded(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a regular file")
    monkeypatch.setattr(train, "build_datasets", lambda *a: pytest.fail("the data was loaded before --out was checked"))
    with pytest.raises(SystemExit, match=r"train.py: error: --out '.*file/run' is not a writable directory "
                                         r"\(Not a directory\)"):
        train.main(TINY + ["--out", str(tmp_path / "file" / "run")])
    with pytest.raises(SystemExit, match=r"train.py: error: --out '.*file' is a file, not a directory"):
        train.main(TINY + ["--out", str(tmp_path / "file")])


@pytest.mark.parametrize("arguments, message", [
    (["--lr", "nan"], "argument --lr: must be a finite number, got nan"),
    (["--lr", "inf"], "argument --lr: must be a finite number, got inf"),
    (["--momentum", "nan"], "argument --momentum: must be a finite number, got nan"),
    (["--momentum", "1.5"], "argument --momentum: must be >= 0.0 and < 1.0, got 1.5"),
    (["--weight-decay=-inf"], "argument --weight-decay: must be a finite number"),
    (["--warmup", "nan"], "argument --warmup: must be a finite number"),
    (["--label-smoothing", "5"], "argument --label-smoothing: must be >= 0.0 and < 1.0, got 5"),
    (["--eval-only"], "--eval-only needs --resume PATH"),
])
def test_every_flag_range_is_checked_before_anything_runs(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(TINY + arguments)
    assert exit_info.value.code == 2
    assert f"train.py: error: {message}" in capsys.readouterr().err


def test_options_that_contradict_each_other_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match="train.py: error: --warmup 2.0 must be less than --epochs 2"):
        train.main(TWO_EPOCHS + ["--warmup", "2", "--out", str(tmp_path / "a")])
    train.main(TWO_EPOCHS + ["--out", str(tmp_path / "b"), "--max-steps", "5"])
    with pytest.raises(SystemExit, match="--max-steps 5 is not beyond the checkpoint's step 5"):
        train.main(["--resume", str(tmp_path / "b" / "last.npz"), "--max-steps", "5"])


def corrupt_folder(root):
    root = image_folder(root, val_classes=("ant", "cat", "dog"))  # 12 training images, 3 batches of 4
    (root / "train" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a JPEG after all")
    return root


def test_an_unreadable_image_stops_the_run_after_saving_and_skip_corrupt_goes_on(tmp_path, capsys):
    root, out = corrupt_folder(tmp_path / "images"), tmp_path / "run"
    options = FOLDER[:-1] + ["3", "--data", str(root)]
    with pytest.raises(SystemExit) as stopped:
        train.main(options + ["--out", str(out)])
    message = str(stopped.value)
    assert message.startswith("train.py: error: cannot read image ") and "broken.jpg" in message
    assert f"continue with --resume {out / 'last.npz'} --skip-corrupt" in message
    step = minidnn.read_checkpoint(out / "last.npz").step  # the steps before the bad batch are kept
    assert f"at step {step}:" in message and step < 3
    result = train.main(["--resume", str(out / "last.npz"), "--skip-corrupt"])
    assert result["step"] == 9 and [row["epoch"] for row in rows(out)] == [1, 2, 3]
    err = capsys.readouterr().err
    assert "broken.jpg" in err and "skipped 1 unreadable image(s) of the training split" in err
    assert "the training set has 12 images, the checkpoint's run had 13" in err


def test_skip_corrupt_from_the_start_names_and_counts_the_skips(tmp_path, capsys):
    root = corrupt_folder(tmp_path / "images")
    assert train.main(FOLDER + ["--data", str(root), "--out", str(tmp_path / "run"), "--skip-corrupt"])["step"] == 3
    err = capsys.readouterr().err
    assert "train.py: warning: ImageFolder skips" in err and "broken.jpg" in err
    assert "train.py: warning: --skip-corrupt: skipped 1 unreadable image(s) of the training split" in err


# ------------------------------------------------------------------ 6. NaN training
def test_a_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    out, calls, real = tmp_path / "run", [], train.F.cross_entropy

    def nan_at_step_13(*args, **kwargs):
        loss = real(*args, **kwargs)
        if kwargs.get("label_smoothing") is not None:
            calls.append(1)
            if len(calls) == 13:
                return loss * float("nan")
        return loss

    monkeypatch.setattr(train.F, "cross_entropy", nan_at_step_13)
    with pytest.raises(SystemExit) as stopped:
        train.main(TWO_EPOCHS + ["--out", str(out), "--log-every", "5"])
    assert stopped.value.code == (f"train.py: error: the training loss is nan at step 13; stopped without saving, "
                                  f"{out / 'last.npz'} (step 10) is the last good checkpoint; try a lower --lr")
    assert minidnn.read_checkpoint(out / "last.npz").step == 10
    for name in ("last.npz", "best.npz"):
        assert all(np.isfinite(v).all() for v in parameters(out / name).values() if v.dtype.kind == "f")
    assert [row["epoch"] for row in rows(out)] == [1]


def test_weights_that_overflowed_after_a_finite_loss_are_never_saved(tmp_path, monkeypatch):
    out, calls, real_step = tmp_path / "run", [], minidnn.optim.SGD.step

    def step_then_overflow(self):  # the loss of step 5 was finite; the update leaves an infinite weight
        real_step(self)
        calls.append(1)
        if len(calls) == 5:
            self.param_groups[0]["params"][0].data[...] = np.inf

    monkeypatch.setattr(minidnn.optim.SGD, "step", step_then_overflow)
    with pytest.raises(SystemExit, match=r"train.py: error: the model's features.0.weight is not finite after step 5; "
                                         r"stopped without saving, no checkpoint was saved"):
        train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "5"])
    assert not (out / "last.npz").exists() and temporaries(out) == []


def test_a_failed_write_is_a_message_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "4"])
    before = (out / "last.npz").read_bytes()

    def disk_full(file, **arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(minidnn.checkpoint.np, "savez", disk_full)
    with pytest.raises(SystemExit, match=r"train.py: error: cannot write .*last.npz \(No space left on device\); "
                                         r"the previous one, if any, is intact"):
        train.main(["--resume", str(out / "last.npz"), "--max-steps", "6"])
    assert (out / "last.npz").read_bytes() == before and temporaries(out) == []


def test_the_optimizer_refuses_nan_hyperparameters_passed_around_the_cli():
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got nan"):
        minidnn.optim.SGD([minidnn.tensor([1.0], requires_grad=True)], lr=float("nan"))


# ------------------------------------------------------------------ 7. signals
@pytest.mark.parametrize("number, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_a_resumable_checkpoint_and_exits_128_plus_its_number(tmp_path, monkeypatch, straight,
                                                                            number, code):
    out = tmp_path / "run"
    signal_at_step(monkeypatch, 13, number)
    with pytest.raises(SystemExit) as stopped:
        train.main(TWO_EPOCHS + ["--out", str(out)])
    monkeypatch.undo()
    assert stopped.value.code == code
    assert minidnn.read_checkpoint(out / "last.npz").step == 13
    train.main(["--resume", str(out / "last.npz")])
    assert_same_parameters(out / "last.npz", straight[0] / "last.npz")


def test_a_second_signal_during_the_save_stops_at_once_without_a_torn_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "10"])
    before = (out / "last.npz").read_bytes()
    signal_at_step(monkeypatch, 3, signal.SIGTERM)  # the first: stop after this step and save
    real_savez = np.savez

    def savez_interrupted(file, **arrays):  # the second arrives while last.npz is being written
        real_savez(file, **arrays)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(minidnn.checkpoint.np, "savez", savez_interrupted)
    with pytest.raises(SystemExit) as stopped:
        train.main(["--resume", str(out / "last.npz")])
    assert stopped.value.code == 143
    assert (out / "last.npz").read_bytes() == before and temporaries(out) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def run_script(arguments, **options):
    return subprocess.Popen([sys.executable, "train.py", *arguments], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **options)


def test_sigterm_to_the_process_exits_143_after_saving(tmp_path):
    out = tmp_path / "run"
    process = run_script(TINY + ["--epochs", "50", "--out", str(out)])
    deadline = time.monotonic() + 30
    while not (out / "metrics.jsonl").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # wait until it trains: one epoch is done
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 143, err
    assert "train.py: stopped by SIGTERM after step" in err and "Traceback" not in err
    step = minidnn.read_checkpoint(out / "last.npz").step
    assert 10 <= step < 500 and temporaries(out) == []


# ------------------------------------------------------------------ 8. temporaries of a killed save
def test_orphaned_temporaries_are_removed_on_the_next_start_and_nothing_else(tmp_path, capsys):
    out = tmp_path / "run"
    train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "3"])
    orphans = ["last.npz.minidnn-0123abcd.tmp", "best.npz.minidnn-deadbeef.tmp", "metrics.jsonl.minidnn-00000000.tmp"]
    keep = ["notes.tmp", "last.npz.tmp", "mine.npz.minidnn-0123abcd.tmp", "last.npz.minidnn-0123abcd.tmp.bak"]
    for name in orphans + keep:
        (out / name).write_bytes(b"x" * 100)
    assert all(temporary_pattern(n.split(".minidnn")[0]).fullmatch(n) for n in orphans)
    train.main(["--resume", str(out / "last.npz")])
    assert sorted(temporaries(out)) == sorted(keep)
    assert "removed 3 temporary file(s) an interrupted save left" in capsys.readouterr().out


KILLED_RUN = ["--model", "tiny_cnn", "--train-size", "10", "--test-size", "10", "--batch-size", "10", "--workers", "0",
              "--image-size", "8", "--epochs", "30", "--log-every", "1"]  # one step per epoch: saves all the time
# train.py without matplotlib (importing it costs 0.7 s per start, and every save is tested on
# metrics.jsonl anyway); SLOW_DISK also makes each rename wait 15 ms, so that most of the run's time
# is spent in saves, with a temporary file written and not yet renamed, and most kills land there.
NO_PLOTS = """
import runpy, sys
sys.modules["matplotlib"] = None
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""
SLOW_DISK = """
import os, time
replace = os.replace
os.replace = lambda *args: (time.sleep(0.015), replace(*args))[1]
""" + NO_PLOTS


def test_kill_9_during_saves_never_loses_a_checkpoint_or_leaves_temporaries(tmp_path):
    out, last, rng, kills, torn = tmp_path / "run", tmp_path / "run" / "last.npz", random.Random(9), 0, 0
    while kills < 16:
        start = ["--resume", str(last)] if last.exists() else KILLED_RUN + ["--out", str(out), "--overwrite"]
        orphans = set(temporaries(out)) if out.exists() else set()  # left by the last kill
        with open(tmp_path / "stderr", "w") as err:
            process = subprocess.Popen([sys.executable, "-c", SLOW_DISK, *start], cwd=ROOT, stdout=subprocess.DEVNULL,
                                       stderr=err)
        while process.poll() is None and not (out.exists() and set(temporaries(out)) - orphans):
            time.sleep(0.001)  # until this process's first save begins (so it resumed)
        time.sleep(rng.uniform(0.0, 0.12))  # then somewhere in the next few saves
        if process.poll() is not None:  # it finished before the kill, or could not resume
            assert process.returncode == 0, (tmp_path / "stderr").read_text()
            break
        process.kill()
        process.wait()
        kills += 1
        torn += bool(set(temporaries(out)) - orphans)  # the kill cut a save short
        if last.exists():  # whatever the kill interrupted, last.npz is whole and holds a position
            checkpoint = minidnn.read_checkpoint(last)
            assert 0 < checkpoint.step <= 30
            assert len(checkpoint.extra["history"]) in (checkpoint.step - 1, checkpoint.step)
    assert kills >= 12, f"the run ended after {kills} kills; give it more epochs"
    assert torn >= kills // 3, f"only {torn} of {kills} kills landed in a save: the test proves little"
    finished = subprocess.run([sys.executable, "-c", NO_PLOTS, "--resume", str(last)], cwd=ROOT,
                              capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    assert temporaries(out) == []  # the next start removed what the kills left
    assert [row["epoch"] for row in rows(out)] == list(range(1, 31))  # every epoch recorded, once
    train.main(KILLED_RUN + ["--out", str(tmp_path / "never-killed")])
    assert_same_parameters(last, tmp_path / "never-killed" / "last.npz")  # bit for bit
    assert_same_parameters(out / "best.npz", tmp_path / "never-killed" / "best.npz")


# ------------------------------------------------------------------ 9. one run per --out (issue 23)
def test_a_folder_in_use_is_refused_and_free_again_when_its_run_ends(tmp_path):
    out = tmp_path / "run"
    run = train.prepare(train.parse_args(TWO_EPOCHS + ["--out", str(out)]))  # holds --out until released
    before = sorted(os.listdir(out))
    with pytest.raises(SystemExit) as refused:
        train.main(TWO_EPOCHS + ["--out", str(out), "--overwrite"])
    assert refused.value.code == (f"train.py: error: --out '{out}' is in use by another train.py run (process "
                                  f"{os.getpid()}); wait for it to end, or choose another --out")
    assert sorted(os.listdir(out)) == before == ["train.lock"]
    run.lock.release()
    assert train.main(TWO_EPOCHS + ["--out", str(out), "--max-steps", "2"])["step"] == 2


def test_two_runs_started_together_into_one_empty_folder(tmp_path):
    out = tmp_path / "run"
    arguments = TINY + ["--epochs", "40", "--out", str(out)]
    runs = [subprocess.Popen([sys.executable, "-c", NO_PLOTS, *arguments], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    deadline = time.monotonic() + 60
    while all(run.poll() is None for run in runs) and time.monotonic() < deadline:
        time.sleep(0.02)
    finished = [run for run in runs if run.poll() is not None]
    assert len(finished) == 1, "neither run was refused"
    loser, winner = finished[0], next(run for run in runs if run is not finished[0])
    err = loser.communicate()[1]
    assert loser.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"train.py: error: --out '{out}' is in use by another train.py run "
                                            f"(process {winner.pid}); wait for it to end, or choose another --out")
    winner.kill()  # kill -9: the kernel releases the lock with the process
    winner.communicate()
    assert train.main(TINY + ["--epochs", "1", "--out", str(out), "--overwrite", "--max-steps", "2"])["step"] == 2


# ------------------------------------------------------------------ 10. a reader that never returns
STUCK_READER = """
import itertools, runpy, sys
fifo, marker, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
del sys.argv[1:4]
sys.modules["matplotlib"] = None
import minidnn.data.folder as folder
calls, read_image = itertools.count(), folder.read_image
def stuck_at_one_read(path):
    if next(calls) == at:
        open(marker, "w").close()
        open(fifo, "rb")  # blocks in the kernel until someone writes to the pipe: no one ever does
    return read_image(path)
folder.read_image = stuck_at_one_read
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.parametrize("read, workers", [(15, 2), (13, 0)])
def test_the_first_sigterm_ends_a_run_whose_reader_is_stuck(tmp_path, read, workers):
    # 12 training images (3 steps of 4) and 3 test images: reads 0-11 train epoch 1, 12-14 evaluate it, 15-18
    # are epoch 2's first batch (read by a pool of 2 threads), 13 is in epoch 1's evaluation. Either way the
    # main thread has nothing left to do but wait for that batch. A file on a hung network mount blocks the
    # same way a named pipe does (the walk skips pipes).
    step = 3
    root, out = image_folder(tmp_path / "images", val_classes=("ant", "cat", "dog")), tmp_path / "run"
    os.mkfifo(tmp_path / "fifo")
    process = subprocess.Popen([sys.executable, "-c", STUCK_READER, str(tmp_path / "fifo"), str(tmp_path / "marker"),
                                str(read), *FOLDER[:-1], "5", "--workers", str(workers), "--data", str(root),
                                "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "marker").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the reader is inside open() now, and the main thread waits for its batch
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 143, err
    assert "no step is in flight" in err and f"train.py: stopped by SIGTERM after step {step};" in err, err
    assert "Traceback" not in err
    assert minidnn.read_checkpoint(out / "last.npz").step == step and temporaries(out) == []


# ------------------------------------------------------------------ 11. write errors are one line
try:  # imported once, here: imported again after the fixture's None, it would not find its own submodules
    import matplotlib as MATPLOTLIB
except ImportError:
    MATPLOTLIB = None


def fail_writes_to(monkeypatch, name, error):
    """Make atomic_write of --out/``name`` (in train.py) fail with ``error``."""
    real = train.atomic_write

    def atomic_write(path, write):
        if os.path.basename(path) == name:
            raise error
        return real(path, write)

    monkeypatch.setattr(train, "atomic_write", atomic_write)


@pytest.mark.parametrize("name, error, said", [
    ("metrics.jsonl", OSError(28, "No space left on device"), "No space left on device"),
    ("metrics.jsonl", PermissionError(13, "Permission denied"), "Permission denied"),
    ("curves.png", OSError(28, "No space left on device"), "No space left on device"),
    ("curves.png", PermissionError(13, "Permission denied"), "Permission denied"),
])
def test_a_failed_write_of_the_metrics_or_curves_is_one_line_naming_the_file(tmp_path, monkeypatch, name, error,
                                                                               said):
    if name == "curves.png":  # plots, this time: the real module back in place of the fixture's None
        monkeypatch.setitem(sys.modules, "matplotlib", MATPLOTLIB or pytest.skip("needs matplotlib"))
    out = tmp_path / "run"
    fail_writes_to(monkeypatch, name, error)
    with pytest.raises(SystemExit) as stopped:
        train.main(TINY + ["--epochs", "1", "--out", str(out)])
    assert stopped.value.code == (f"train.py: error: cannot write {out / name} ({said}); the previous one, if any, "
                                  f"is intact")
    assert minidnn.read_checkpoint(out / "last.npz").step == 10 and temporaries(out) == []


def read_only_after_the_start(monkeypatch):
    """--out becomes read-only once train.py has checked it (a remount, a quota, a chmod by someone)."""
    real = train.check_out

    def check_out(args):
        result = real(args)
        os.chmod(args.out, 0o555)
        return result

    monkeypatch.setattr(train, "check_out", check_out)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories: chmod does not bite")
def test_a_read_only_out_is_one_line_naming_the_file(tmp_path, monkeypatch):
    out = tmp_path / "run"
    read_only_after_the_start(monkeypatch)
    try:
        with pytest.raises(SystemExit) as stopped:
            train.main(TINY + ["--epochs", "1", "--out", str(out)])
    finally:
        os.chmod(out, 0o755)
    assert stopped.value.code == (f"train.py: error: cannot write {out / 'best.npz'} (Permission denied); the "
                                  f"previous one, if any, is intact")


def test_a_read_only_out_is_one_line_naming_the_file_simulated(tmp_path, monkeypatch):
    out, real_open = tmp_path / "run", os.open

    def read_only(path, flags, *args):  # what open(2) says in a read-only directory, also to root
        if str(path).startswith(str(out)) and flags & os.O_CREAT and "train.lock" not in str(path):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(minidnn.checkpoint.os, "open", read_only)
    with pytest.raises(SystemExit) as stopped:
        train.main(TINY + ["--epochs", "1", "--out", str(out)])
    assert stopped.value.code == (f"train.py: error: cannot write {out / 'best.npz'} (Permission denied); the "
                                  f"previous one, if any, is intact")


def test_a_write_error_is_one_line_without_a_traceback_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    full_disk = NO_PLOTS.replace("import runpy, sys", "import runpy, sys\nimport minidnn.checkpoint as c\n"
                                 "def full(file, **arrays):\n    raise OSError(28, 'No space left on device')\n"
                                 "c.np.savez = full")
    done = subprocess.run([sys.executable, "-c", full_disk, *TINY, "--epochs", "1", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"train.py: error: cannot write {out / 'best.npz'} (No space "
                                                    f"left on device); the previous one, if any, is intact")


# ------------------------------------------------------------------ 12. damaged checkpoints, every reader
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    return run_once(tmp_path_factory, "saved", TINY + ["--epochs", "1", "--max-steps", "2"]) / "last.npz"


def change_extra(change):
    return with_metadata(lambda metadata: change(metadata["extra"]))


# Damages of what train.py's readers need, beyond the archive's (tests/test_serialization.py): (name, damage,
# the readers it concerns).
TRAIN_DAMAGES = [
    ("weights of another shape", with_members(lambda m: put(m, "model/fc.weight", np.zeros((3, 5), np.float32))),
     ("resume", "init_from", "load_pretrained")),
    ("a setting of nonsense", change_extra(lambda e: put(e["args"], "epochs", "many")), ("resume",)),
    ("a negative setting", change_extra(lambda e: put(e["args"], "lr", -1.0)), ("resume",)),
    ("run state of nonsense", change_extra(lambda e: put(e, "meter", {"count": "x"})), ("resume",)),
    ("history of nonsense", change_extra(lambda e: put(e, "history", [3])), ("resume",)),
    ("unknown architecture", change_extra(lambda e: put(e["model"], "name", "vgg99")), ("load_pretrained",)),
    ("normalisation of nonsense", change_extra(lambda e: put(e["input"], "std", [0.0, 1.0, 1.0])),
     ("load_pretrained",)),
    ("unknown transform", change_extra(lambda e: e["input"]["transform"].insert(0, ["RandomCrop", 3])),
     ("load_pretrained",)),
    ("classes of nonsense", change_extra(lambda e: put(e, "classes", ["a", "b"])), ("load_pretrained",)),
    ("no description", change_extra(lambda e: e.pop("input")), ("load_pretrained",)),
]
READERS = ("resume", "init_from", "load_pretrained")
ARCHIVE_DAMAGES = [name for name in DAMAGES if name != "wrong shape"]  # that one may hit an optimizer buffer
CASES = [(damage, reader) for damage in ARCHIVE_DAMAGES for reader in READERS] + \
    [(name, reader) for name, _, readers in TRAIN_DAMAGES for reader in readers]


@pytest.mark.parametrize("damage, reader", CASES)
def test_every_reader_of_a_damaged_checkpoint_says_which_file_in_one_line(tmp_path, saved_run, damage, reader):
    marker = tmp_path / "unpickled-marker"
    bad = tmp_path / "damaged.npz"
    ({name: function for name, function, _ in TRAIN_DAMAGES} | dict(damages(marker)))[damage](saved_run, bad)
    if reader == "load_pretrained":
        with pytest.raises(ValueError, match=f"'{bad}'"):
            models.load_pretrained(bad)
    else:
        option = ["--resume"] if reader == "resume" else TINY + ["--init-from"]
        with pytest.raises(SystemExit) as refused:
            train.main(option + [str(bad), "--out", str(tmp_path / "out")])
        message = str(refused.value.code)
        assert message.startswith("train.py: error: ") and f"'{bad}'" in message and "\n" not in message, message
    assert not marker.exists()


# ------------------------------------------------------------------ 13. model and image size, at start
class _Zeros:
    """Initial weights of zeros: a shape check does not look at them, and drawing AlexNet's 61 M takes seconds."""

    numpy = type("ZerosGenerator", (), {"uniform": lambda self, low, high, size: np.zeros(size),
                                        "normal": lambda self, mean, std, size: np.zeros(size)})()


def test_a_model_that_cannot_take_the_image_size_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(minidnn.nn.init, "default_generator", _Zeros())
    monkeypatch.setattr(train.Run, "train_step", lambda *a: pytest.fail("training started"))
    monkeypatch.setattr(train.Run, "first_step", lambda *a: pytest.fail("training started"))
    with pytest.raises(SystemExit) as refused:
        train.main(["--model", "alexnet", "--image-size", "8", "--train-size", "10", "--test-size", "10",
                    "--batch-size", "2", "--workers", "0", "--out", str(tmp_path / "run")])
    assert refused.value.code == ("train.py: error: --model alexnet does not take --image-size 8 (it is designed for "
                                  "224): kernel_size (3, 3) with padding (0, 0) is too large for input of size (1, "
                                  "1): the output size would be (0, 0)")


def test_the_size_check_changes_no_weight_and_no_random_state(tmp_path):
    run = train.prepare(train.parse_args(TINY + ["--epochs", "1", "--out", str(tmp_path / "run")]))
    run.lock.release()
    minidnn.manual_seed(0)
    fresh = models.create("tiny_cnn", num_classes=10)
    after_creation = minidnn.get_rng_state()
    for name, value in fresh.state_dict().items():
        np.testing.assert_array_equal(run.model.state_dict()[name].numpy(), value.numpy(), err_msg=name)
    assert run.model.training
    minidnn.manual_seed(0)
    models.create("tiny_cnn", num_classes=10)
    train.check_input_size(fresh, run.args, 16)
    assert minidnn.get_rng_state() == after_creation
