"""Every CUDA source of the package (the primitives' and the naive engine's) compiles with nvcc for sm_90, in float
and in double, without register spills; and the GPU timing helper's logic, with a stand-in CuPy (CPU tests: no GPU
needed)."""
import re
import time

import pytest

from minidnn.primitives import _cuda
from tests import nvcc_builds
from tests.nvcc_builds import Build

# ptxas -v reports each kernel's frame after its name.
FRAME = re.compile(r"Function properties for (\w+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                   r"(\d+) bytes spill loads")
# implicit_gemm_wgmma's TF32 build (HALF 0: float32 values), every tile width (256, the backward-filter's: up to 255
# registers, one CTA an SM)
TF32_BUILDS = [Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 0), ("BLOCK_N", 256))),
               Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 0), ("BLOCK_N", 128), ("Y_LAST", 1))),
               Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 0), ("BLOCK_N", 64)))]
# The placed store (a strided backward-data's phases, strided_dgrad.py): TF32 and a half build, and the phase kernel's
# TMA build (implicit_gemm_wgmma.PHASES_TMA)
PLACED_BUILDS = [Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", half), ("BLOCK_N", block_n), ("Y_LAST", 1),
                                                                ("Y_PLACED", 1)) + tma)
                 for half, block_n, tma in ((0, 128, ()), (2, 64, ()), (2, 128, (("TMA", 1),)))]

# The forward kernel's other builds (implicit_gemm_wgmma.FORWARD_TMA and FORWARD_PRODUCER): the bulk tensor copy's
# barrier pipeline, on by default, in bf16, fp16 and TF32 (the half builds hold the half backward-filter's TMA build
# too, implicit_gemm_wgmma.FILTER_TMA); the PRODUCER pipeline with the gathers, and with the bulk tensor copy and its
# maps prefetched (PREFETCH_TENSOR_MAPS), at the stages the probes run
FORWARD_BUILDS = [Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 2), ("BLOCK_N", 64), ("TMA", 1))),
                  Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 2), ("BLOCK_N", 128), ("TMA", 1),
                                                                 ("Y_LAST", 1))),
                  Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 0), ("BLOCK_N", 128), ("TMA", 1))),
                  Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 1), ("BLOCK_N", 128), ("TMA", 1))),
                  Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 1), ("BLOCK_N", 64), ("STAGES", 4),
                                                                 ("IN_FLIGHT", 1), ("PRODUCER", 1))),
                  Build("conv/implicit_gemm_wgmma.cu", "float", (("HALF", 2), ("BLOCK_N", 128), ("STAGES", 6),
                                                                 ("IN_FLIGHT", 1), ("PRODUCER", 1), ("TMA", 1),
                                                                 ("PREFETCH_TENSOR_MAPS", 1)))]


@pytest.mark.parametrize("nvcc_build", [Build(source, scalar) for source in _cuda.cuda_sources()
                                        for scalar in ("float", "double")]
                         + [Build(source, "float", (("HALF", half),))
                            for source in ("batchnorm.cu", "activation.cu", "pooling.cu", "linear.cu") for half in (1, 2)]
                         + [Build(source, "float", (("HALF", half), ("BLOCK_N", block_n), ("Y_LAST", y_last)))
                            for source in ("conv/implicit_gemm_nhwc.cu", "conv/implicit_gemm_wgmma.cu")
                            for half, block_n, y_last in ((1, 64, 0), (2, 128, 1), (1, 64, 1))]
                         + TF32_BUILDS + PLACED_BUILDS + FORWARD_BUILDS,
                         indirect=True, ids=str)
def test_cuda_source_compiles(nvcc_build):
    build = nvcc_build.build
    assert nvcc_build.returncode == 0, f"nvcc failed on {build.source}:\n{nvcc_build.stderr}"
    frames = FRAME.findall(nvcc_build.stderr)
    assert frames, f"no ptxas report for {build.source}:\n{nvcc_build.stderr}"
    spills = {name: int(stores) for name, _, stores, loads in frames if int(stores) or int(loads)}
    assert not spills, f"{build} spills registers ({spills}):\n{nvcc_build.stderr}"


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

    seen, calls = [], []

    def queued_milliseconds(call, hold, longest):  # the helper issues the call it times
        call()
        seen.append((hold, longest))
        return 2.0

    monkeypatch.setattr(_cuda, "queued_milliseconds", queued_milliseconds)
    times, host_times = selection._time(lambda: calls.append(1), xp=object(), repeats=3)  # xp not NumPy: the GPU path
    assert times == [2.0, 2.0, 2.0]
    assert seen == [(selection.HOLD_MS, selection.MAX_HOLD_MS)] * 3
    assert len(calls) == 4 and len(host_times) == 3 and all(t >= 0 for t in host_times)  # a warm-up, then 3 issues


def _stand_in_nvcc(tmp_path, monkeypatch, body: str):
    """A shell script in nvcc's place that logs its arguments, then runs ``body``; returns the log's path."""
    log, script = tmp_path / "calls", tmp_path / "nvcc"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setattr(nvcc_builds, "NVCC", str(script))
    return log


def test_each_build_compiles_once_per_session(tmp_path, monkeypatch):
    log = _stand_in_nvcc(tmp_path, monkeypatch, 'echo "ptxas info    : report of $4" >&2')
    builds = nvcc_builds.Builds()
    float_build, double_build = Build("lrn.cu", "float"), Build("lrn.cu", "double")
    three_ctas = Build("conv/implicit_gemm.cu", "float", (("CTAS_PER_SM", 3),))
    try:
        builds.start([float_build, double_build, float_build])
        assert builds.report(float_build) is builds.report(float_build)
        assert builds.report(double_build) == nvcc_builds.Report(double_build, 0,
                                                                  "ptxas info    : report of -DSCALAR=double\n")
        assert builds.report(three_ctas).returncode == 0  # not queued before: compiled when asked
        assert builds.report(float_build).stderr == "ptxas info    : report of -DSCALAR=float\n"
    finally:
        builds.close()
    calls = log.read_text().splitlines()
    assert len(calls) == 3, calls
    assert "-DSCALAR=float" in calls[0] and "-DSCALAR=double" in calls[1] and "-DCTAS_PER_SM=3" in calls[2]
    assert all(call.endswith(_cuda.source_path(build.source)) for call, build in
               zip(calls, [float_build, double_build, three_ctas]))


def test_builds_keep_the_nvcc_they_were_made_with(tmp_path, monkeypatch):
    # The session's builds run in the background while other tests stand scripts in for NVCC: a build queued before
    # must still run the nvcc its session found (else a real source's report comes from a stand-in).
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    first = _stand_in_nvcc(tmp_path / "first", monkeypatch, 'echo "ptxas info    : first" >&2')
    builds = nvcc_builds.Builds()
    second = _stand_in_nvcc(tmp_path / "second", monkeypatch, 'echo "ptxas info    : second" >&2')
    try:
        assert builds.report(Build("lrn.cu")).stderr == "ptxas info    : first\n"
    finally:
        builds.close()
    assert first.exists() and not second.exists()


def test_closing_the_session_ends_a_running_build_and_its_children(tmp_path, monkeypatch):
    log = _stand_in_nvcc(tmp_path, monkeypatch, "sleep 60")  # sh waits for its child sleep, as nvcc for ptxas
    builds = nvcc_builds.Builds()
    builds.start([Build("lrn.cu"), Build("pooling.cu")])
    deadline = time.monotonic() + 30
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    builds.close()  # would wait the 60 s if the sleeping child survived and held nvcc's stderr open
    assert time.monotonic() - started < 20
    assert len(log.read_text().splitlines()) == 1  # the queued second build never started
