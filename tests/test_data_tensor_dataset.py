"""TensorDataset indexes its tensors together, as PyTorch's does, and batches through the DataLoader."""
import numpy as np
import pytest

import minidnn
from minidnn.data import DataLoader, TensorDataset


def test_samples_are_the_tensors_indexed_together_as_in_torch(rng):
    torch = pytest.importorskip("torch")
    features, labels, weights = rng.standard_normal((7, 3, 2)), rng.integers(0, 4, 7), rng.random(7)
    ours = TensorDataset(minidnn.tensor(features), minidnn.tensor(labels), minidnn.tensor(weights))
    theirs = torch.utils.data.TensorDataset(torch.tensor(features), torch.tensor(labels), torch.tensor(weights))
    assert len(ours) == len(theirs) == 7
    for index in (0, 4, -1, slice(1, 5, 2)):
        mine, their = ours[index], theirs[index]
        assert len(mine) == len(their) == 3
        for a, b in zip(mine, their):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            assert a.dtype == b.numpy().dtype
    with pytest.raises(IndexError):
        theirs[7]
    with pytest.raises(IndexError):
        ours[7]


def test_batches_through_the_loader_in_order(rng):
    features, labels = rng.standard_normal((10, 4)).astype(np.float32), np.arange(10)
    loader = DataLoader(TensorDataset(minidnn.tensor(features), minidnn.tensor(labels)), batch_size=4)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(4, 4), (4, 4), (2, 4)]
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in batches]), features)
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches]), labels)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="size mismatch between tensors: first dimensions \\[3, 4\\]"):
        TensorDataset(minidnn.zeros(3, 2), minidnn.zeros(4))
    with pytest.raises(TypeError, match="argument 1 must be a minidnn Tensor, got ndarray"):
        TensorDataset(minidnn.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="at least one tensor"):
        TensorDataset()
    with pytest.raises(ValueError, match="0-d"):
        TensorDataset(minidnn.tensor(1.0))
