"""The benchmark on the CPU: a smoke run (not a timing test) and the engines' agreement."""
import json

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import models
from benchmarks import bench


def test_cpu_smoke_run_writes_the_reports(tmp_path):
    report = bench.main(["--device", "cpu", "--quick", "--models", "tiny", "--engines", "minidnn,naive", "--rounds", "1",
                         "--steps", "1", "--warmup", "1", "--layer-repeats", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["results"][0]["model"] == "tiny" and saved == json.loads(json.dumps(report))
    record = report["results"][0]
    assert set(record["engines"]) == {"minidnn/fp32", "naive/fp32"}
    assert record["agreement"]["naive"]["loss_relative_difference"] < 1e-5
    assert record["agreement"]["naive"]["gradient_relative_difference"] < 1e-3
    assert [row["layers"][0] for row in record["layers"]] == ["features.0", "features.4", "features.8"]
    text = (tmp_path / "bench.md").read_text()
    assert "| tiny | 8 | minidnn | fp32 |" in text and "speed-up over naive" in text


def test_bad_arguments():
    with pytest.raises(SystemExit):
        bench.main(["--engines", "cudnn7", "--device", "cpu"])
    with pytest.raises(SystemExit):
        bench.main(["--models", "vgg", "--device", "cpu"])


def test_torch_twin_computes_what_minidnn_computes():
    torch = pytest.importorskip("torch")
    from benchmarks.torch_twins import torch_twin

    minidnn.manual_seed(0)
    model = models.create("resnet20").double()
    twin = torch_twin("resnet20", model).double()
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
