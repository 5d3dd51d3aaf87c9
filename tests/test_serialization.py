"""minidnn.save / minidnn.load: torch's call shapes, exact round trips of nested values, and files
that are never unpickled: every damage is a ValueError naming the file."""
import io
import json
import math
import os
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import minidnn
import minidnn.nn as nn

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_]


def random_array(rng, dtype, shape):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def assert_same(loaded, saved):
    """Equal values of the same types, all the way down (a Tensor stays a Tensor, a tuple a tuple)."""
    assert type(loaded) is type(saved) or (isinstance(saved, minidnn.Tensor) and type(loaded) is minidnn.Tensor)
    if isinstance(saved, minidnn.Tensor):
        assert loaded.dtype == saved.dtype and loaded.shape == saved.shape
        assert loaded.requires_grad == saved.requires_grad and loaded.is_leaf and loaded.device.type == "cpu"
        np.testing.assert_array_equal(loaded.numpy(), saved.numpy())
    elif isinstance(saved, (np.ndarray, np.generic)):
        assert loaded.dtype == saved.dtype and loaded.shape == saved.shape
        np.testing.assert_array_equal(loaded, saved)
    elif isinstance(saved, dict):
        assert list(loaded) == list(saved)
        for key in saved:
            assert type(next(k for k in loaded if k == key)) is type(key)
            assert_same(loaded[key], saved[key])
    elif isinstance(saved, (list, tuple)):
        assert len(loaded) == len(saved)
        for a, b in zip(loaded, saved):
            assert_same(a, b)
    elif isinstance(saved, float) and math.isnan(saved):
        assert math.isnan(loaded)
    else:
        assert loaded == saved


@pytest.fixture
def nested(rng):
    """A state-dict-like value of every kind minidnn.save stores, odd shapes and every dtype."""
    tensors = OrderedDict((f"layer{i}.{np.dtype(d).name}", minidnn.Tensor(random_array(rng, d, shape)))
                          for i, (d, shape) in enumerate(zip(DTYPES, [(3, 5), (7,), (2, 1, 3), (), (0, 4), (1,),
                                                                      (5, 3, 2, 1), (9,), (4, 3)])))
    weight = minidnn.tensor(rng.standard_normal((3, 2)).astype(np.float32), requires_grad=True)
    fortran = np.asfortranarray(rng.standard_normal((3, 4)))
    return {
        "model": tensors,
        "param": weight,
        "arrays": [fortran, fortran[:, ::2], np.zeros((0,), np.int64), np.array(7, np.int16)],
        "scalars": (np.float32(1.5), np.int64(-3), np.bool_(True)),
        "numbers": [0, -2**62, 10**30, 1.5, -0.0, math.inf, -math.inf, math.nan, True, False, None],
        "text": ["", "unicode ✓ ümlaut", "a\nb"],
        "keys": {0: "int key", 2.5: "float key", True: "bool key", None: "none key", "": "empty"},
        "deep": {"a": [{"b": ({"c": [minidnn.tensor([1, 2, 3])]},)}]},
        "empty": [{}, [], ()],
    }


def test_round_trip_through_a_path_and_a_file_object(tmp_path, nested):
    for target in (str(tmp_path / "x.npz"), tmp_path / "y.npz"):  # str and os.PathLike
        minidnn.save(nested, target)
        assert_same(minidnn.load(target), nested)
    buffer = io.BytesIO()
    minidnn.save(nested, buffer)
    buffer.seek(0)
    assert_same(minidnn.load(buffer), nested)
    with open(tmp_path / "z.bin", "wb") as file:  # a real file, any name
        minidnn.save(nested, file)
    with open(tmp_path / "z.bin", "rb") as file:
        assert_same(minidnn.load(file), nested)
    loaded = minidnn.load(tmp_path / "x.npz")
    assert type(loaded["model"]) is OrderedDict and type(loaded["keys"]) is dict
    assert sorted(os.listdir(tmp_path)) == ["x.npz", "y.npz", "z.bin"]  # no temporary left


def test_a_state_dict_round_trip_loads_into_a_model(tmp_path, rng):
    def model():
        return nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 4 * 4, 7))

    minidnn.manual_seed(1)
    trained = model()
    trained(minidnn.tensor(rng.standard_normal((4, 3, 6, 6)).astype(np.float32)))  # moves the BN statistics
    trained.eval()
    minidnn.save(trained.state_dict(), tmp_path / "weights.pt")
    minidnn.manual_seed(2)
    fresh = model()
    fresh.load_state_dict(minidnn.load(tmp_path / "weights.pt"))  # torch's idiom, word for word
    fresh.eval()
    x = minidnn.tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    np.testing.assert_array_equal(fresh(x).numpy(), trained(x).numpy())
    state = minidnn.load(tmp_path / "weights.pt")
    assert state["1.num_batches_tracked"].dtype == np.int64 and not state["0.weight"].requires_grad


def test_a_path_is_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "state.npz"
    minidnn.save({"a": minidnn.ones(3)}, path)
    before = path.read_bytes()

    def savez_then_fail(file, **members):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(minidnn.serialization.np, "savez", savez_then_fail)
    with pytest.raises(OSError, match="No space left"):
        minidnn.save({"a": minidnn.zeros(3)}, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["state.npz"]


def test_map_location_cpu_and_bad_devices(tmp_path):
    minidnn.save({"w": minidnn.ones(2, 2)}, tmp_path / "w.npz")
    assert minidnn.load(tmp_path / "w.npz", map_location="cpu")["w"].device.type == "cpu"
    with pytest.raises(ValueError, match="device"):
        minidnn.load(tmp_path / "w.npz", map_location="tpu")


@pytest.mark.gpu
def test_map_location_cuda(tmp_path):
    minidnn.save({"w": minidnn.ones(2, 2, requires_grad=True), "a": np.ones(3)}, tmp_path / "w.npz")
    loaded = minidnn.load(tmp_path / "w.npz", map_location="cuda")
    assert loaded["w"].is_cuda and loaded["w"].requires_grad and loaded["w"].is_leaf
    assert isinstance(loaded["a"], np.ndarray)  # arrays stay NumPy arrays, as map_location moves tensors only
    minidnn.save(loaded, tmp_path / "back.npz")  # GPU tensors are saved from host copies
    assert minidnn.load(tmp_path / "back.npz")["w"].device.type == "cpu"


@pytest.mark.parametrize("value, where", [
    (nn.Linear(2, 2), "obj, a Linear"),
    ({"a": [1, {2, 3}]}, r"obj\['a'\]\[1\], a set"),
    ({"f": print}, r"obj\['f'\], a builtin_function_or_method"),
    ({"o": np.array([{"x": 1}], dtype=object)}, r"obj\['o'\]: an array of dtype object needs pickle"),
    ({(1, 2): "tuple key"}, "a dict key of type tuple"),
])
def test_what_needs_pickle_is_refused_naming_where(tmp_path, value, where):
    with pytest.raises(TypeError, match=where):
        minidnn.save(value, tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists() and os.listdir(tmp_path) == []


def test_a_value_that_contains_itself_is_refused(tmp_path):
    loop = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(ValueError, match=r"obj\['a'\]\[0\]: it contains itself"):
        minidnn.save(loop, tmp_path / "x.npz")
    shared = [1, 2]  # the same list twice is not a loop
    minidnn.save({"x": shared, "y": shared}, tmp_path / "ok.npz")
    assert minidnn.load(tmp_path / "ok.npz") == {"x": [1, 2], "y": [1, 2]}


# ------------------------------------------------------------------ damaged files
def rewrite(source, target, change):
    """``target``: the archive ``source`` with its members changed by ``change(dict of arrays)``."""
    with np.load(source, allow_pickle=False) as archive:
        members = {name: archive[name] for name in archive.files}
    change(members)
    np.savez(target, **members)  # may pickle an object array: what a hostile file would hold


def set_metadata(text):
    def change(members):
        members["metadata"] = np.array(text)
    return change


def with_metadata(change):
    """A damage: the file with its (valid JSON) metadata changed by ``change(metadata)``."""
    def apply(good, bad):
        with np.load(good, allow_pickle=False) as archive:
            metadata = json.loads(str(archive["metadata"]))
        change(metadata)
        rewrite(good, bad, set_metadata(json.dumps(metadata)))
    return apply


def with_members(change):
    """A damage: the file with its members changed by ``change(dict of arrays)``."""
    return lambda good, bad: rewrite(good, bad, change)


def put(mapping, key, value):
    mapping[key] = value


class _CreatesMarker:
    """Unpickling this creates the marker file: code run by a pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def damages(marker):
    """(name, function(good path, damaged path)) for each way a file can be damaged or foreign."""
    def bytes_of(function):
        return lambda good, bad: bad.write_bytes(function(good.read_bytes()))

    def garble(data):  # flip bytes in the middle of the first array's data: the zip's CRC no longer fits
        start = data.index(b"NUMPY") + 200
        return data[:start] + bytes(b ^ 0xFF for b in data[start:start + 16]) + data[start + 16:]

    def save_npy(path, array):
        with open(path, "wb") as file:
            np.save(file, array)

    def metadata_change(function):
        def apply(good, bad):
            with np.load(good, allow_pickle=False) as archive:
                text = str(archive["metadata"])
            rewrite(good, bad, set_metadata(function(text)))
        return apply

    return [
        ("truncated", bytes_of(lambda data: data[:len(data) // 2])),
        ("empty", bytes_of(lambda data: b"")),
        ("not a zip", bytes_of(lambda data: b"hello, I am a text file\n" * 10)),
        ("a pickle", bytes_of(lambda data: pickle.dumps(_CreatesMarker(marker)))),
        ("garbled bytes", bytes_of(garble)),
        ("pickled object member", lambda good, bad: rewrite(
            good, bad, lambda m: m.__setitem__(sorted(k for k in m if k != "metadata")[0],
                                               np.array([_CreatesMarker(marker)], dtype=object)))),
        ("pickled metadata", lambda good, bad: rewrite(
            good, bad, lambda m: m.__setitem__("metadata", np.array([_CreatesMarker(marker)], dtype=object)))),
        ("no metadata", lambda good, bad: rewrite(good, bad, lambda m: m.pop("metadata"))),
        ("metadata not text", lambda good, bad: rewrite(good, bad, lambda m: m.__setitem__("metadata",
                                                                                           np.arange(3)))),
        ("bad JSON", metadata_change(lambda text: text[:-7])),
        ("JSON list", metadata_change(lambda text: "[1, 2, 3]")),
        ("wrong member", lambda good, bad: rewrite(good, bad, lambda m: m.__setitem__(
            "model/renamed" if any(k.startswith("model/") for k in m) else "arrays/renamed",
            m.pop(sorted(k for k in m if k != "metadata")[0])))),
        ("wrong shape", lambda good, bad: rewrite(good, bad, lambda m: m.__setitem__(
            sorted(k for k in m if k != "metadata")[-1],
            np.zeros((3, 1, 4), m[sorted(k for k in m if k != "metadata")[-1]].dtype)))),
        ("a .npy file", lambda good, bad: save_npy(bad, np.zeros(3))),
    ]


DAMAGES = [name for name, _ in damages("unused")]
# What the message says of each damage, besides naming the file.
SAID = {"truncated": "not a readable .npz archive", "empty": "not an .npz archive \\(it is empty\\)",
        "not a zip": "does not start as a zip file does", "a pickle": "a pickle, which is never loaded",
        "garbled bytes": "Bad CRC-32", "pickled object member": "a member is a pickled object, which is never loaded",
        "pickled metadata": "a member is a pickled object", "no metadata": "has no metadata member",
        "metadata not text": "its metadata member is int64 of shape \\(3,\\), not text",
        "bad JSON": "its metadata is not JSON", "JSON list": "its metadata is a JSON list, not an object",
        "wrong member": "which the file lacks", "wrong shape": "should be <f4 of shape \\(5,\\), but its member",
        "a .npy file": "a single .npy array"}


@pytest.mark.parametrize("damage", DAMAGES)
def test_every_damage_is_a_value_error_naming_the_file(tmp_path, rng, damage):
    marker = tmp_path / "unpickled-marker"
    good, bad = tmp_path / "good.npz", tmp_path / f"{damage.replace(' ', '-')}.npz"
    minidnn.save({"w": minidnn.tensor(rng.standard_normal((4, 5)).astype(np.float32)), "n": 3,
                  "b": minidnn.tensor(rng.standard_normal(5).astype(np.float32))}, good)
    dict(damages(marker))[damage](good, bad)
    with pytest.raises(ValueError, match=rf"'{bad}'.*{SAID[damage]}"):
        minidnn.load(bad)
    with open(bad, "rb") as file, pytest.raises(ValueError, match=rf"'{bad}'.*{SAID[damage]}"):  # a file object too
        minidnn.load(file)
    assert not marker.exists()  # nothing was ever unpickled


@pytest.mark.parametrize("metadata, message", [
    ('{"format": "minidnn-checkpoint", "version": 1}', "not written by minidnn.save.*read_checkpoint"),
    ('{"format": "minidnn-save", "version": 7, "object": 1}', "version 7"),
    ('{"format": "minidnn-save", "version": 1}', "holds no object"),
    ('{"format": "minidnn-save", "version": 1, "object": {"tensor": "arrays/9", "dtype": "<f4", "shape": [],'
     ' "requires_grad": false}}', "arrays/9, which the file lacks"),
    ('{"format": "minidnn-save", "version": 1, "object": {"pickle": "x"}}', "unknown entry"),
    ('{"format": "minidnn-save", "version": 1, "object": [1, 2]}', "not a value minidnn.save writes"),
    ('{"format": "minidnn-save", "version": 1, "object": {"dict": [[1]]}}', "not a \\(key, value\\) pair"),
    ('{"format": "minidnn-save", "version": 1, "object": {"float": "nan?"}}', "unknown entry"),
    ('{"format": "minidnn-save", "version": 1, "object": 5}', "arrays/0 belong to nothing"),
    ('{"format": "minidnn-save", "version": 1, "object": {"tensor": "arrays/0", "dtype": "<i8", "shape": [2],'
     ' "requires_grad": true}}', "requires_grad=True on a int64 tensor"),
])
def test_metadata_that_does_not_fit_its_members_is_named(tmp_path, metadata, message):
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    minidnn.save(minidnn.tensor([1, 2]), good)
    rewrite(good, bad, set_metadata(metadata))
    with pytest.raises(ValueError, match=rf"'{bad}'.*{message}"):
        minidnn.load(bad)


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        minidnn.load(tmp_path / "missing.npz")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_half_precision_tensors_round_trip_bit_for_bit(tmp_path, rng, device):
    """bfloat16 (which NumPy's format cannot name) goes as its words under the dtype "bfloat16"; float16 as
    itself. Both come back with their dtype and bits, on the device asked for."""
    values = np.concatenate([rng.standard_normal(9), [np.nan, -np.inf, -0.0]]).astype(np.float32)
    halves = {"bf16": minidnn.tensor(values, device=device).bfloat16(),
              "fp16": minidnn.tensor(values, device=device).half()}
    minidnn.save({**halves, "leaf": halves["bf16"].detach().requires_grad_()}, tmp_path / "h.npz")
    loaded = minidnn.load(tmp_path / "h.npz", map_location=device)
    with np.load(tmp_path / "h.npz") as archive:  # plain words on disk, no pickle
        nodes = dict(json.loads(str(archive["metadata"]))["object"]["dict"])
        assert (nodes["bf16"]["dtype"], nodes["fp16"]["dtype"]) == ("bfloat16", "<f2")
        assert archive[nodes["bf16"]["tensor"]].dtype == np.uint16
    for name, tensor in halves.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].device.type == device
        np.testing.assert_array_equal(loaded[name].numpy().view(np.uint16), tensor.numpy().view(np.uint16))
    assert loaded["leaf"].requires_grad and loaded["leaf"].dtype == minidnn.bfloat16
