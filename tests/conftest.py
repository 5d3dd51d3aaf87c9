"""Shared fixtures: the array-module fixture runs a test on NumPy and, where a GPU is present, CuPy; the nvcc
builds, each compiled once per session in the background."""
from __future__ import annotations

import os

# The suite runs on one core while nvcc compiles on the other (tests/nvcc_builds.py). A BLAS or OpenMP pool of two
# threads (NumPy's OpenBLAS, PyTorch's) then spins against nvcc for that core, and a product-heavy test runs
# several times slower. One thread each, set before NumPy loads its BLAS; a value given in the environment is kept.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import zlib  # noqa: E402 - after the thread settings, as is everything below
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from minidnn import backend  # noqa: E402
from tests import nvcc_builds  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # Tests of nvcc builds run last, so that the rest of the suite runs while the builds compile.
    items.sort(key=lambda item: _build_of(item) is not None)
    if backend.cuda_is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """How many tests skipped, for which reason, most first; a skipped PyTorch comparison stands out, as it
    means the independent oracle did not run."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = Counter(_skip_reason(report) for report in skipped)
    terminalreporter.section(f"{len(skipped)} skipped, by reason")
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count:6d}  {reason}")
    oracle = sum(count for reason, count in reasons.items() if reason.startswith("could not import 'torch'"))
    if oracle:
        terminalreporter.line(f"the PyTorch oracle did not run: {oracle} comparisons with torch skipped "
                              '(pip install -e ".[dev,oracle]" brings torch)', red=True, bold=True)


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def _build_of(item) -> nvcc_builds.Build | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("nvcc_build") if callspec is not None else None


@pytest.fixture(scope="session", autouse=True)
def session_builds(request):
    """The session's nvcc builds, every one its selected tests need queued as the first test starts."""
    builds = nvcc_builds.Builds()
    if nvcc_builds.NVCC is not None:
        builds.start(build for build in map(_build_of, request.session.items) if build is not None)
    yield builds
    builds.close()


@pytest.fixture
def nvcc_build(request, session_builds) -> nvcc_builds.Report:
    """The report of the build a test is parametrized with (``indirect=True``), compiled once per session."""
    if nvcc_builds.NVCC is None:
        pytest.skip("nvcc is not installed")
    return session_builds.report(request.param)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module under test: ``numpy`` always, ``cupy`` on a machine with a GPU."""
    return np if request.param == "numpy" else backend.cupy()


@pytest.fixture
def rng(request):
    """A fresh random generator per test, seeded from the test's name so failures reproduce."""
    # zlib.crc32, not hash(): Python salts string hashes per process, so hash() would draw new inputs
    # on every run and a failure would not reproduce.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def poisoned(xp, monkeypatch):
    """``xp``; on CuPy, ``empty`` and ``empty_like`` then return arrays filled with NaN (signed integers -77,
    unsigned ones all bits set), so that an element a kernel leaves unwritten fails the comparison with a
    reference."""
    if xp is not np:
        def filled(array):
            kind = array.dtype.kind  # unsigned words (half storage, uint8 records): all bits set, a NaN as half
            array.fill(np.nan if kind in "fc" else np.iinfo(array.dtype).max if kind == "u" else -77)
            return array

        empty, empty_like = xp.empty, xp.empty_like
        monkeypatch.setattr(xp, "empty", lambda *args, **kwargs: filled(empty(*args, **kwargs)))
        monkeypatch.setattr(xp, "empty_like", lambda *args, **kwargs: filled(empty_like(*args, **kwargs)))
    return xp


@pytest.fixture
def naive_launches(monkeypatch):
    """The names of the naive engine's CUDA kernels launched during the test, in order."""
    from minidnn.naive import kernels  # noqa: PLC0415

    names, launch = [], kernels.launch

    def record(name, *args):
        names.append(name)
        return launch(name, *args)

    monkeypatch.setattr(kernels, "launch", record)
    return names
