"""Shared fixtures: the array-module fixture runs a test on NumPy and, where a GPU is present, CuPy."""
from __future__ import annotations

import numpy as np
import pytest

from minidnn import backend


def pytest_collection_modifyitems(config, items):
    if backend.cuda_is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module under test: ``numpy`` always, ``cupy`` on a machine with a GPU."""
    return np if request.param == "numpy" else backend.cupy()


@pytest.fixture
def rng(request):
    """A fresh random generator per test, seeded from the test's name so failures reproduce."""
    return np.random.default_rng(abs(hash(request.node.nodeid)) % (2**32))
