"""train.py end to end on tiny built-in data: outputs, exact resume, evaluation, argument errors."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import minidnn
import models
import train
from minidnn.data import transforms as T

ROOT = Path(__file__).resolve().parent.parent

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


@pytest.mark.parametrize("reused", [False, True])
def test_the_meter_reads_the_float64_sums_of_its_batches_whenever_it_is_read(reused, monkeypatch):
    """Batches of random logits and labels (odd sizes, the last one short), read after some of them and at the end:
    each read gives the float64 means of every batch added so far, and a meter rebuilt from a saved state goes on
    to the same figures. ``reused``: every batch's logits come in one array, written again for the next batch, as a
    replayed CUDA graph's output is; the meter reads each batch's own all the same. It gathers by itself after
    GATHER_AFTER unread batches (here 3)."""
    monkeypatch.setattr(train.Meter, "GATHER_AFTER", 3)
    rng = np.random.default_rng()
    sizes = [int(n) for n in rng.integers(3, 40, 7)] + [1]
    meter, losses, hits, count = train.Meter(), 0.0, 0, 0
    replayed = minidnn.tensor(np.zeros((max(sizes), 11), np.float32))
    for position, size in enumerate(sizes):
        logits = rng.standard_normal((size, 11)).astype(np.float32)
        labels = rng.integers(0, 11, size)
        loss = np.float32(rng.random() * 3)
        if reused:
            replayed.data[:size] = logits
            meter.add(replayed[:size], minidnn.tensor(labels), minidnn.tensor(loss), copy=True)
        else:
            meter.add(minidnn.tensor(logits), minidnn.tensor(labels), minidnn.tensor(loss))
        losses, hits, count = losses + float(loss) * size, hits + int((logits.argmax(1) == labels).sum()), count + size
        assert len(meter._logits) < train.Meter.GATHER_AFTER  # held on the device: a few batches' at most
        if position in (2, 5):
            assert meter.read() == pytest.approx((losses / count, hits / count), rel=1e-12)
            meter = train.Meter.from_state(meter.state())
    assert meter.count == count
    assert meter.read() == pytest.approx((losses / count, hits / count), rel=1e-12)


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


def test_the_captured_step_is_the_gpus_default_only(tmp_path, monkeypatch):
    seen = {}
    real = train.Run.__init__

    def recording(self, args, *rest, **kwargs):
        seen["cuda_graph"] = args.cuda_graph
        real(self, args, *rest, **kwargs)

    monkeypatch.setattr(train.Run, "__init__", recording)
    train.main(TINY + ["--epochs", "1", "--max-steps", "1", "--out", str(tmp_path / "cpu")])
    assert seen["cuda_graph"] is False  # on the CPU no capture is asked for, and none is refused
    assert "--no-cuda-graph" in " ".join(train.build_parser().format_help().split())


@pytest.mark.gpu
def test_the_captured_step_is_laid_out_from_a_steady_warm_up(tmp_path, monkeypatch):
    """train.py runs its first step eagerly (it makes the optimizer's state) and captures at the second, whose
    warm-up the memory plan records: the capture then follows the recording, no request falling back."""
    from minidnn.cuda import graphs  # noqa: PLC0415

    made, capture = [], graphs.capture
    monkeypatch.setattr(graphs, "capture", lambda *args, **kwargs: made.append(capture(*args, **kwargs)) or made[-1])
    train.main(TINY + ["--device", "cuda", "--epochs", "1", "--out", str(tmp_path)])
    assert len(made) == 1 and isinstance(made[0], graphs.CapturedStep)
    assert made[0].planned is not None and made[0].planned.fallbacks == 0


@pytest.mark.gpu
def test_on_the_gpu_the_step_is_captured_unless_told_not_to(tmp_path, capsys):
    train.main(TINY + ["--device", "cuda", "--epochs", "1", "--out", str(tmp_path / "captured")])
    assert "the training step runs as one CUDA graph" in capsys.readouterr().out
    train.main(TINY + ["--device", "cuda", "--epochs", "1", "--no-cuda-graph", "--out", str(tmp_path / "eager")])
    assert "CUDA graph" not in capsys.readouterr().out
    captured = parameters(tmp_path / "captured" / "last.npz")
    eager = parameters(tmp_path / "eager" / "last.npz")
    for name, value in eager.items():  # the same training, replayed or run step by step
        np.testing.assert_allclose(captured[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["tiny_cnn", "resnet20"])
def test_captured_training_goes_on_past_the_first_epoch_like_eager(tmp_path, model):
    """Three captured epochs, evaluation and checkpoints between them, with the test batch the same shape as
    the training batch (as train.py's default of 128 makes it): the run ends and follows the eager run. A
    captured ResNet-20 run on shapes10 at batch 128 exited with status 1 in its second epoch on the H200
    (benchmarks/results/2026-12-02-h200-train-throughput-resnet20/NOTE.md); this is that run, smaller."""
    arguments = ["--model", model, "--train-size", "512", "--test-size", "256", "--batch-size", "128", "--workers",
                 "0", "--epochs", "3", "--device", "cuda", "--deterministic"]
    captured = train.main(arguments + ["--out", str(tmp_path / "captured")])
    eager = train.main(arguments + ["--no-cuda-graph", "--out", str(tmp_path / "eager")])
    assert captured["step"] == eager["step"] == 12
    rows = [json.loads(line) for line in (tmp_path / "captured" / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2, 3] and all(np.isfinite(row["train_loss"]) for row in rows)
    eager_rows = [json.loads(line) for line in (tmp_path / "eager" / "metrics.jsonl").read_text().splitlines()]
    for row, eager_row in zip(rows, eager_rows, strict=True):  # the meter read each replay's own loss and logits
        assert row["train_loss"] == pytest.approx(eager_row["train_loss"], rel=1e-2)
        assert row["train_accuracy"] == pytest.approx(eager_row["train_accuracy"], abs=0.03)
    ours, theirs = parameters(tmp_path / "captured" / "last.npz"), parameters(tmp_path / "eager" / "last.npz")
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-3, atol=1e-4, err_msg=name)


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: None)" not in text and "(default: False)" not in text  # nothing to show: nothing shown
    assert "--epochs EPOCHS passes over the training set (default: 3)" in text
    assert "--batch-size BATCH_SIZE images per training step (default: 64)" in text
    for action in train.build_parser()._actions:
        if action.option_strings and action.default not in (None, False, "==SUPPRESS=="):
            assert f"(default: {action.default})" in text or "default" in action.help, action.dest


# ------------------------------------------------------------------ reusing a trained model
@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory):
    """A finished tiny run on shapes10: (its folder, its Run, the test images it was evaluated on)."""
    out = tmp_path_factory.mktemp("shapes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIDNN_DATA", str(tmp_path_factory.getbasetemp() / "data"))
        args = train.parse_args(TINY + ["--epochs", "1", "--out", str(out)])
        run = train.prepare(args)
        train.train(args, run)
        run.lock.release()
    return out, run


def logits_of(model, images):
    model.eval()
    with minidnn.no_grad():
        return model(minidnn.tensor(np.stack(images))).numpy()


def image_folder(root, sizes, classes=("ant", "bee", "cat")):
    """root/{train,val}/<class>/<i>.png, images of the given (height, width) sizes, one colour per class."""
    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        for index, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i, (height, width) in enumerate(sizes):
                pixels = rng.integers(0, 60, (height, width, 3)) + 60 * index
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


NEW_PROCESS = """
import sys
import numpy as np
from PIL import Image
import minidnn, models
out = sys.argv[1]
for checkpoint, *images in (part.split(",") for part in sys.argv[2:]):
    pretrained = models.load_pretrained(checkpoint)
    batch = minidnn.tensor(np.stack([pretrained.transform(Image.open(path)) for path in images]))
    with minidnn.no_grad():
        np.save(f"{out}/{len(images)}-{checkpoint.split('/')[-2]}.npy", pretrained.model(batch).numpy())
"""


def test_a_checkpoint_rebuilds_its_model_and_preprocessing_in_a_new_process(tmp_path, shapes_run):
    import subprocess
    import sys

    # shapes10: the normalisation is the training images' own mean and std, which only the checkpoint knows.
    out, run = shapes_run
    dataset = run.test_loader.dataset
    shape_files = []
    for index in range(8):
        path = tmp_path / f"shape{index}.png"
        Image.fromarray(dataset.images[index]).save(path)
        shape_files.append(str(path))
    larger = np.kron(dataset.images[8], np.ones((2, 1, 1), np.uint8))[:, :, :]  # 64 x 32: train.py squashes it
    Image.fromarray(larger).save(tmp_path / "larger.png")
    shape_files.append(str(tmp_path / "larger.png"))
    pipeline = train.sample_pipeline(dataset)  # shapes10's batch transform, image by image
    inputs = [pipeline(dataset.images[index], None) for index in range(8)] + [pipeline(T.Resize((32, 32))(larger), None)]
    expected_shapes = logits_of(run.model, inputs)
    # An image folder: Resize (shorter side) and CenterCrop on images of other sizes and aspects.
    root = image_folder(tmp_path / "images", [(20, 12), (9, 30), (16, 16)])
    args = train.parse_args(["--model", "tiny_cnn", "--data", str(root), "--image-size", "10", "--batch-size", "3",
                             "--workers", "0", "--epochs", "1", "--out", str(tmp_path / "folder")])
    folder_run = train.prepare(args)
    train.train(args, folder_run)
    folder_run.lock.release()
    folder_files = [path for path, _ in folder_run.test_loader.dataset.samples]
    folder_pipeline = train.sample_pipeline(folder_run.test_loader.dataset)
    expected_folder = logits_of(folder_run.model, [folder_pipeline(Image.open(path), None) for path in folder_files])

    done = subprocess.run([sys.executable, "-c", NEW_PROCESS, str(tmp_path),
                           ",".join([str(out / "last.npz")] + shape_files),
                           ",".join([str(tmp_path / "folder" / "last.npz")] + folder_files)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / f"9-{out.name}.npy"), expected_shapes)
    np.testing.assert_array_equal(np.load(tmp_path / f"{len(folder_files)}-folder.npy"), expected_folder)

    state = minidnn.manual_seed(11).get_state()
    pretrained = models.load_pretrained(out / "last.npz")
    assert minidnn.get_rng_state() == state  # building the model drew from the generator; it is put back
    assert pretrained.classes == minidnn.data.SHAPES_CLASSES and pretrained.input_size == 32
    normalize = pipeline.transforms[-1]
    assert pretrained.mean == tuple(normalize.mean.ravel().tolist()) and pretrained.name == "tiny_cnn"
    assert not pretrained.model.training
    assert models.load_pretrained(tmp_path / "folder" / "best.npz").classes == ("ant", "bee", "cat")


def test_predict_prints_the_top_classes_with_their_probabilities(tmp_path, shapes_run):
    import subprocess
    import sys

    out, run = shapes_run
    dataset = run.test_loader.dataset
    files = []
    for index in range(3):
        files.append(str(tmp_path / f"{index}.png"))
        Image.fromarray(dataset.images[index]).save(files[-1])
    pipeline = train.sample_pipeline(dataset)
    logits = logits_of(run.model, [pipeline(dataset.images[index], None) for index in range(3)]).astype(np.float64)
    probabilities = np.exp(logits - logits.max(1, keepdims=True))
    probabilities /= probabilities.sum(1, keepdims=True)
    done = subprocess.run([sys.executable, "examples/predict.py", *files, "--checkpoint", str(out / "best.npz"),
                           "--top-k", "3"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3
    for line, path, row in zip(lines, files, probabilities):
        best = np.argsort(-row)[:3]
        assert line == f"{path}: " + ", ".join(f"{minidnn.data.SHAPES_CLASSES[i]} {row[i]:.4f}" for i in best)
    missing = subprocess.run([sys.executable, "examples/predict.py", "x.png", "--checkpoint", str(tmp_path / "no.npz")],
                             cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.startswith("predict.py: error:") and "Traceback" not in missing.stderr


def test_init_from_starts_a_new_run_from_the_weights(tmp_path, shapes_run, capsys):
    out, _ = shapes_run
    pretrained = models.load_pretrained(out / "last.npz")
    args = train.parse_args(TINY[2:] + ["--epochs", "2", "--init-from", str(out / "last.npz"), "--out",
                                        str(tmp_path / "tuned")])
    run = train.prepare(args)
    assert args.model == "tiny_cnn"  # taken from the checkpoint
    assert "--init-from" in capsys.readouterr().out
    assert run.step == 0 and run.history == [] and run.optimizer.state == {} and run.scheduler.last_epoch == 0
    x = minidnn.tensor(np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32))
    np.testing.assert_array_equal(logits_of(run.model, [x.numpy()[i] for i in range(4)]),
                                  logits_of(pretrained.model, [x.numpy()[i] for i in range(4)]))
    run.model.train()
    assert train.train(args, run)["step"] == 20  # a whole new schedule of 2 epochs
    run.lock.release()
    # The same from a state dict written by minidnn.save, a torch user's way of keeping weights.
    minidnn.save(pretrained.model.state_dict(), tmp_path / "weights.npz")
    run = train.prepare(train.parse_args(TINY + ["--epochs", "1", "--init-from", str(tmp_path / "weights.npz"),
                                                 "--out", str(tmp_path / "from-state-dict")]))
    for name, value in pretrained.model.state_dict().items():
        np.testing.assert_array_equal(run.model.state_dict()[name].numpy(), value.numpy(), err_msg=name)
    run.lock.release()


def test_init_from_with_other_classes_gives_a_new_head_and_keeps_the_body(tmp_path, shapes_run, capsys):
    out, _ = shapes_run
    saved = minidnn.read_checkpoint(out / "last.npz").model_state
    root = image_folder(tmp_path / "images", [(8, 8), (8, 8)])
    options = ["--data", str(root), "--image-size", "32", "--batch-size", "3", "--workers", "0", "--epochs", "1",
               "--init-from", str(out / "last.npz")]
    run = train.prepare(train.parse_args(options + ["--out", str(tmp_path / "tuned")]))
    said = capsys.readouterr().out
    assert f"--init-from {out / 'last.npz'}: loaded its weights except the classifier, re-initialised (fc.weight, " \
           f"fc.bias: 10 classes there, 3 here)" in said and said.count("re-initialised") == 1
    state = run.model.state_dict()
    assert state["fc.weight"].shape == (3, 32) and state["fc.bias"].shape == (3,)
    for name, value in saved.items():
        if not name.startswith("fc."):
            np.testing.assert_array_equal(state[name].numpy(), value, err_msg=name)
    minidnn.manual_seed(0)  # the new head is the fresh initialisation of --seed 0
    np.testing.assert_array_equal(state["fc.weight"].numpy(), models.create("tiny_cnn", 3).fc.weight.numpy())
    run.lock.release()
    with pytest.raises(SystemExit, match=r"^train.py: error: cannot start from '.*last.npz': error loading state "
                                         r"dict into SmallCNN: shape mismatch for features.0.weight: checkpoint "
                                         r"\(8, 3, 3, 3\), model \(16, 3, 3, 3\); shape mismatch"):
        train.main(options + ["--model", "shapes_cnn", "--out", str(tmp_path / "other")])
    with pytest.raises(SystemExit) as both:
        train.main(options + ["--resume", str(out / "last.npz")])
    assert both.value.code == 2


def test_a_description_holds_deterministic_pipelines_only():
    pipeline = T.Compose([train._GrayToRGB(), T.Compose([T.Resize(12), T.CenterCrop(10), T.ToTensor(),
                                                         T.Normalize((0.5, 0.4, 0.3), (0.2, 0.2, 0.1))])])
    description = models.describe("tiny_cnn", {"num_classes": 2}, ["a", "b"], pipeline, 10,
                                  rgb_steps=(train._GrayToRGB,))
    assert description["input"] == {"size": 10, "mean": pytest.approx([0.5, 0.4, 0.3]),
                                    "std": pytest.approx([0.2, 0.2, 0.1]),
                                    "transform": [["Resize", 12], ["CenterCrop", [10, 10]], ["ToTensor"],
                                                  ["Normalize"]]}
    assert description["model"] == {"name": "tiny_cnn", "arguments": {"num_classes": 2}}
    with pytest.raises(ValueError, match="RandomCrop.*which a description cannot hold"):
        models.describe("tiny_cnn", {}, [], T.Compose([T.RandomCrop(3), T.ToTensor()]), 10)
    with pytest.raises(ValueError, match="holds no ToTensor"):
        models.describe("tiny_cnn", {}, [], T.Compose([T.Resize(3)]), 10)
    with pytest.raises(ValueError, match="_GrayToRGB"):
        models.describe("tiny_cnn", {}, [], pipeline, 10)  # an RGB step not named as one is not guessed at


def test_channels_last_lays_out_the_weights_and_each_batch_and_trains_as_the_contiguous_run(tmp_path):
    """--channels-last: the convolution weights are channels-last, the step's batch is laid out so before the
    network sees it, and the run computes what the C-contiguous run computes (float32 sums in other orders)."""
    run = train.prepare(train.parse_args(TINY + ["--channels-last", "--out", str(tmp_path / "look")]))
    try:
        four_dimensional = [p for p in run.model.parameters() if p.ndim == 4]
        assert four_dimensional and all(p.is_contiguous(memory_format=minidnn.channels_last) and not p.is_contiguous()
                                        for p in four_dimensional)
        seen = []
        network = run.network
        run.network = lambda images: seen.append(images.is_contiguous(memory_format=minidnn.channels_last)) or \
            network(images)
        images, labels = next(iter(run.train_loader))
        run.eager_step(images, labels)
        assert not images.is_contiguous(memory_format=minidnn.channels_last) and seen == [True]
    finally:
        run.lock.release()
    results = {name: train.main(TINY + ["--epochs", "1", "--out", str(tmp_path / name)] + extra)
               for name, extra in (("plain", []), ("last", ["--channels-last"]))}
    assert results["last"]["history"][-1]["test_loss"] == pytest.approx(results["plain"]["history"][-1]["test_loss"],
                                                                         rel=1e-5)
    plain, last = parameters(tmp_path / "plain" / "last.npz"), parameters(tmp_path / "last" / "last.npz")
    for name, value in plain.items():
        np.testing.assert_allclose(last[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.gpu
def test_on_the_gpu_a_channels_last_bf16_step_is_captured(tmp_path, capsys):
    """--channels-last with --amp bf16 on the GPU: the step, with the batch's transpose, runs as one CUDA graph and
    ends its epoch near the C-contiguous run (the algorithms chosen differ by layout, and with them the roundings)."""
    options = TINY + ["--device", "cuda", "--epochs", "1", "--amp", "bf16"]
    last = train.main(options + ["--channels-last", "--out", str(tmp_path / "last")])
    assert "the training step runs as one CUDA graph" in capsys.readouterr().out
    plain = train.main(options + ["--out", str(tmp_path / "plain")])
    assert np.isfinite(last["history"][-1]["test_loss"])
    assert last["history"][-1]["test_loss"] == pytest.approx(plain["history"][-1]["test_loss"], rel=0.05)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_trains_and_resumes_with_its_loss_scale(tmp_path, amp):
    """--amp runs the forward under autocast (the parameters stay float32); an fp16 run's loss scale goes into
    its checkpoints and a resumed run goes on bit for bit as the run that never stopped."""
    options = TINY + ["--epochs", "2", "--amp", amp]
    straight = train.main(options + ["--out", str(tmp_path / "straight")])
    assert straight["history"][-1]["train_loss"] < straight["history"][0]["train_loss"] * 1.05
    checkpoint = minidnn.read_checkpoint(str(tmp_path / "straight" / "last.npz"))
    assert ("grad_scaler" in checkpoint.extra) == (amp == "fp16")
    if amp == "fp16":
        assert checkpoint.extra["grad_scaler"]["_growth_tracker"] == straight["step"]  # no overflow at 2^16
    assert all(value.dtype == np.float32 for value in parameters(tmp_path / "straight" / "last.npz").values()
               if value.dtype.kind == "f")
    train.main(options + ["--out", str(tmp_path / "resumed"), "--max-steps", "7"])
    # --amp is carried over from the checkpoint, as the other settings are
    train.main(TINY + ["--epochs", "2", "--out", str(tmp_path / "resumed"), "--resume",
                       str(tmp_path / "resumed" / "last.npz")])
    straight_weights, resumed = parameters(tmp_path / "straight" / "last.npz"), parameters(tmp_path / "resumed" / "last.npz")
    for name in straight_weights:
        np.testing.assert_array_equal(straight_weights[name], resumed[name], err_msg=name)
    if amp == "fp16":
        assert minidnn.read_checkpoint(str(tmp_path / "resumed" / "last.npz")).extra["grad_scaler"] == \
            checkpoint.extra["grad_scaler"]


def test_a_run_without_amp_never_imports_ml_dtypes(tmp_path):
    """ml_dtypes' import takes a second on a small machine, which every start of a run that asks for no bfloat16
    would pay (a resumed run, each rank, each benchmark engine): train.py looks the half type up only for --amp."""
    code = """
import runpy, sys
sys.modules["matplotlib"] = None
sys.argv = ["train.py"] + sys.argv[1:]
try:
    runpy.run_path("train.py", run_name="__main__")
finally:
    print("ml_dtypes imported:", "ml_dtypes" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code, *TINY, "--max-steps", "1", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ml_dtypes imported: False"


@pytest.mark.gpu
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_on_the_gpu_a_mixed_precision_step_is_captured(tmp_path, capsys, amp):
    """bf16 and fp16 (its loss scaler deciding on the device) run as one CUDA graph, and train as the eager run.
    Both runs convolve with one algorithm: left to choose, an eager step weighs the host's time and a graph does
    not (selection.fastest), and two algorithms' half roundings part further than this bound within an epoch."""
    from minidnn.primitives import conv  # noqa: PLC0415

    with conv.settings(algo="implicit_gemm"):
        train.main(TINY + ["--device", "cuda", "--epochs", "1", "--amp", amp, "--out", str(tmp_path / "captured")])
        assert "the training step runs as one CUDA graph" in capsys.readouterr().out
        train.main(TINY + ["--device", "cuda", "--epochs", "1", "--amp", amp, "--no-cuda-graph",
                           "--out", str(tmp_path / "eager")])
    captured, eager = parameters(tmp_path / "captured" / "last.npz"), parameters(tmp_path / "eager" / "last.npz")
    for name, value in eager.items():
        np.testing.assert_allclose(captured[name], value, rtol=1e-3, atol=1e-4, err_msg=name)
    if amp == "fp16":
        scales = [minidnn.read_checkpoint(str(tmp_path / run / "last.npz")).extra["grad_scaler"]
                  for run in ("captured", "eager")]
        assert scales[0] == scales[1]
