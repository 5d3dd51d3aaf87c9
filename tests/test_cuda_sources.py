"""Every CUDA source of the package (the primitives' and the naive engine's) compiles with nvcc for sm_90, in float
and in double, without register spills; and the GPU timing helper's logic, with a stand-in CuPy (CPU tests: no GPU
needed)."""
import os
import shutil
import subprocess

import pytest

from minidnn.primitives import _cuda

NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("scalar", ["float", "double"])
@pytest.mark.parametrize("source", _cuda.cuda_sources())
def test_cuda_source_compiles(source, scalar, tmp_path):
    result = subprocess.run(
        [NVCC, "-cubin", "-arch=sm_90", "--std=c++17", f"-DSCALAR={scalar}", "-Xptxas", "-warn-spills",
         "-o", os.fspath(tmp_path / "out.cubin"), _cuda.source_path(source)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"nvcc failed on {source}:\n{result.stderr}"
    assert "spill" not in result.stderr, f"{source} spills registers:\n{result.stderr}"


def test_sources_are_found():
    # the primitives' kernels, and the naive engine's beside minidnn/naive's Python, compiled by function() too
    assert {"conv/im2col.cu", "../naive/caffe_layers.cu"} <= set(_cuda.cuda_sources())
    assert _cuda.package_source("naive/caffe_layers.cu") == "../naive/caffe_layers.cu"


class _StandInCupy:
    """Just enough of CuPy for _cuda.queued_milliseconds: events whose `done` says whether the hold in
    front of them had already ended when the host recorded them (the host queued too slowly)."""

    def __init__(self, queuing_ms):
        self.queuing_ms, self.holds = queuing_ms, []
        stand_in = self

        class Event:
            def record(self):
                self.done = stand_in.holds[-1] <= stand_in.queuing_ms  # the GPU ran past the hold already

            def synchronize(self):
                pass

        self.cuda = type("cuda", (), {"Event": Event, "get_elapsed_time": staticmethod(lambda a, b: 0.5)})


@pytest.mark.parametrize("queuing_ms, holds", [(0.3, [1.0]), (3.0, [1.0, 4.0]), (100.0, [1.0, 4.0, 16.0, 64.0])])
def test_queued_timing_lengthens_a_hold_that_ended_before_the_call_was_queued(monkeypatch, queuing_ms, holds):
    cupy = _StandInCupy(queuing_ms)
    monkeypatch.setattr(_cuda.backend, "cupy", lambda: cupy)
    monkeypatch.setattr(_cuda, "hold_stream", cupy.holds.append)
    calls = []
    assert _cuda.queued_milliseconds(lambda: calls.append(1), 1.0, 64.0) == 0.5
    assert cupy.holds == holds and len(calls) == len(holds)  # one more sample per hold too short, up to the longest
    cupy.holds.clear()
    _cuda.queued_milliseconds(lambda: None, 5.0, 5.0)  # the probes' fixed hold: one sample whatever happened
    assert cupy.holds == [5.0]


def test_find_times_the_gpu_through_the_queued_timing_helper(monkeypatch):
    from minidnn.primitives.conv import selection

    seen = []
    monkeypatch.setattr(_cuda, "queued_milliseconds", lambda call, hold, longest: seen.append((hold, longest)) or 2.0)
    assert selection._time(lambda: None, xp=object(), repeats=3) == [2.0, 2.0, 2.0]  # xp not NumPy: the GPU path
    assert seen == [(selection.HOLD_MS, selection.MAX_HOLD_MS)] * 3
