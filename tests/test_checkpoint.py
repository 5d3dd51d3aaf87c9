"""Checkpoints: round trip, atomic writes, bad files, and resuming equal to never stopping."""
import os

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import minidnn.nn as nn
from minidnn import optim
from tests.test_serialization import DAMAGES, damages, put, with_members, with_metadata


def tiny_model():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Dropout(0.3), nn.Linear(4 * 4 * 4, 5))


def batches(count):
    rng = np.random.default_rng(42)
    return [(minidnn.tensor(rng.standard_normal((8, 3, 8, 8)).astype(np.float32)),
             minidnn.tensor(rng.integers(0, 5, 8))) for _ in range(count)]


def train(model, optimizer, scheduler, data):
    losses = []
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def fresh(seed=0):
    minidnn.manual_seed(seed)
    model = tiny_model()
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    return model, optimizer, optim.lr_scheduler.StepLR(optimizer, 3, gamma=0.5)


def test_a_tiny_training_run_lowers_the_loss():
    model, optimizer, scheduler = fresh()
    data = batches(2) * 15
    losses = train(model, optimizer, scheduler, data)
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])


def test_resuming_gives_bitwise_the_same_parameters_as_not_stopping(tmp_path):
    data = batches(8)
    straight = fresh()
    train(*straight, data)

    first = fresh()
    train(*first, data[:3])
    path = tmp_path / "run" / "checkpoint.npz"
    minidnn.save_checkpoint(path, *first, step=3, extra={"epoch": 0, "note": "halfway"})
    minidnn.manual_seed(999)  # disturb the global RNG: the checkpoint must restore it
    resumed = fresh(seed=7)   # different initial weights: the checkpoint must overwrite them
    checkpoint = minidnn.load_checkpoint(path, *resumed)
    assert checkpoint.step == 3 and checkpoint.extra == {"epoch": 0, "note": "halfway"}
    train(*resumed, data[3:])
    for (name, a), b in zip(straight[0].state_dict().items(), resumed[0].state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    assert os.listdir(tmp_path / "run") == ["checkpoint.npz"]  # no temporary file left behind


# ------------------------------------------------------------------ damaged checkpoints
# Damages of a checkpoint's structure (the archive-level ones, shared with minidnn.load, are in
# tests/test_serialization.py): each is (name, damage, what the message says).
STRUCTURE = [
    ("step is text", with_metadata(lambda m: put(m, "step", "three")), "its step is not a whole number"),
    ("no random state", with_metadata(lambda m: m.pop("rng")), "no random-number state"),
    ("random state garbage", with_metadata(lambda m: put(m["rng"], "numpy", {"state": 5})),
     "random-number state does not parse"),
    ("extra not an object", with_metadata(lambda m: put(m, "extra", [1])), "extra is not a JSON object"),
    ("optimizer groups garbage", with_metadata(lambda m: put(m["optimizer"], "param_groups", "all")),
     "optimizer entry lacks"),
    ("optimizer lr is text", with_metadata(lambda m: put(m["optimizer"]["param_groups"][0], "lr", "fast")),
     r"optimizer parameter group 0\['lr'\] is a str where a number belongs"),
    ("scheduler state of another form", with_metadata(lambda m: put(m["scheduler"]["state"], "last_epoch", [3])),
     r"scheduler state\['last_epoch'\] is a list"),
    ("scheduler state lacks an entry", with_metadata(lambda m: m["scheduler"]["state"].pop("base_lrs")),
     "the scheduler state has the entries"),
    ("a foreign member", with_members(lambda m: put(m, "junk/x", np.zeros(2))), "junk/x is none of"),
    ("weights of text", with_members(lambda m: put(m, "model/6.bias", np.array(["a"] * 5))),
     "holds <U1, not numbers"),
    ("no weights", with_members(lambda m: [m.pop(k) for k in list(m) if k.startswith("model/")]),
     "no model weights"),
    ("momentum of another shape", with_members(lambda m: put(m, "optimizer/state/0/momentum_buffer",
                                                                 np.zeros((2, 2), np.float32))),
     "optimizer state 0/momentum_buffer of shape"),
    ("weights of another shape", with_members(lambda m: put(m, "model/6.weight", np.zeros((5, 3), np.float32))),
     "shape mismatch for 6.weight"),
    ("a renamed weight", with_members(lambda m: put(m, "model/6.weights", m.pop("model/6.weight"))),
     "missing keys: 6.weight"),
]


@pytest.fixture
def trained_checkpoint(tmp_path):
    model, optimizer, scheduler = fresh()
    train(model, optimizer, scheduler, batches(2))  # momentum buffers exist
    good = tmp_path / "good.npz"
    minidnn.save_checkpoint(good, model, optimizer, scheduler, step=2)
    return good


@pytest.mark.parametrize("damage", DAMAGES + [name for name, _, _ in STRUCTURE])
def test_every_damaged_checkpoint_is_a_value_error_naming_it_and_changes_nothing(tmp_path, damage, trained_checkpoint):
    marker = tmp_path / "unpickled-marker"
    archive_damages, structure = dict(damages(marker)), {name: (d, said) for name, d, said in STRUCTURE}
    bad = tmp_path / f"{damage.replace(' ', '-')}.npz"
    if damage in archive_damages:
        archive_damages[damage](trained_checkpoint, bad)
        said = ""
    else:
        structure[damage][0](trained_checkpoint, bad)
        said = structure[damage][1]
    model, optimizer, scheduler = fresh(seed=5)
    before = {name: value.numpy().copy() for name, value in model.state_dict().items()}
    minidnn.manual_seed(123)
    with pytest.raises(ValueError, match=rf"(?s)'{bad}'.*{said}"):
        minidnn.load_checkpoint(bad, model, optimizer, scheduler)
    for name, value in model.state_dict().items():  # checked before anything was loaded
        np.testing.assert_array_equal(value.numpy(), before[name], err_msg=name)
    assert optimizer.state == {} and scheduler.last_epoch == 0
    assert minidnn.get_rng_state() == minidnn.manual_seed(123).get_state()
    assert not marker.exists()


def test_a_missing_checkpoint_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        minidnn.read_checkpoint(tmp_path / "missing.npz")
    minidnn.save({"a": minidnn.ones(2)}, tmp_path / "saved.npz")
    with pytest.raises(ValueError, match="saved.npz.*not a minidnn checkpoint.*read it with minidnn.load"):
        minidnn.read_checkpoint(tmp_path / "saved.npz")


def test_checkpoint_of_another_model_is_refused(tmp_path):
    path = tmp_path / "other.npz"
    minidnn.save_checkpoint(path, nn.Sequential(nn.Linear(3, 2)))
    model, optimizer, _ = fresh()
    with pytest.raises(ValueError, match="(?s)cannot load checkpoint .*other.npz.*missing keys"):
        minidnn.load_checkpoint(path, model)
    minidnn.save_checkpoint(path, model, optim.Adam(model.parameters()))
    with pytest.raises(ValueError, match="holds Adam state, not SGD"):
        minidnn.load_checkpoint(path, model, optimizer)


def test_extras_must_be_json(tmp_path):
    with pytest.raises(TypeError, match="JSON"):
        minidnn.save_checkpoint(tmp_path / "x.npz", nn.Linear(1, 1), extra={"object": object()})
    assert not any(tmp_path.iterdir())


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "last.npz"
    minidnn.save_checkpoint(path, nn.Linear(2, 2), step=1)
    before = path.read_bytes()

    def half_then_interrupted(file):
        file.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # a signal in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        minidnn.checkpoint.atomic_write(path, half_then_interrupted)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["last.npz"]


def test_temporaries_have_a_recognisable_name_and_only_orphans_are_removed(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(minidnn.checkpoint.os, "replace", lambda a, b: (seen.append(os.path.basename(a)),
                                                                          real_replace(a, b))[1])
    minidnn.save_checkpoint(tmp_path / "last.npz", nn.Linear(2, 2))
    assert len(seen) == 1 and minidnn.checkpoint.temporary_pattern("last.npz").fullmatch(seen[0])
    monkeypatch.undo()
    # What a kill -9 in the middle of saves leaves behind, and files that merely look alike.
    orphans = ["last.npz.minidnn-0a1b2c3d.tmp", "best.npz.minidnn-ffffffff.tmp"]
    others = ["last.npz", "last.npz.tmp", "other.npz.minidnn-0a1b2c3d.tmp", "last.npz.minidnn-0a1b2c3d.tmp.keep",
              "last.npz.minidnn-XYZ.tmp"]
    for name in orphans + others[1:]:
        (tmp_path / name).write_bytes(b"partial")
    (tmp_path / "best.npz.minidnn-12345678.tmp").mkdir()  # not a file: left alone
    removed = minidnn.checkpoint.remove_orphans(tmp_path, ["last.npz", "best.npz"])
    assert sorted(os.path.basename(p) for p in removed) == sorted(orphans)
    assert sorted(os.listdir(tmp_path)) == sorted(others + ["best.npz.minidnn-12345678.tmp"])


def test_a_damaged_archive_leaves_no_file_open(tmp_path):
    """Reading a truncated archive by path is a ValueError, and its file is closed by then (NumPy's np.load left it
    open until collected)."""
    import gc  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    from minidnn.checkpoint import read_archive  # noqa: PLC0415

    good = tmp_path / "good.npz"
    minidnn.save_checkpoint(good, nn.Linear(3, 2))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(good.read_bytes()[:200])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(ValueError, match="not a readable .npz archive"):
            read_archive(bad, str(bad))
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
