"""nvcc's report on a CUDA source (``-Xptxas -v``: registers, stack frame, spills, shared memory per kernel),
compiled once per (source, SCALAR, defines) per test session and read by every test that needs it: the compile
test of each source and the register and spill tests of the convolution kernels.

Builds take long (all of them together take minutes on 2 cores), so the session hands every build its
tests ask for to one background worker as the tests start (tests/conftest.py), and runs those tests last: the
rest of the suite runs on one core while nvcc uses the other, and a test waits only for the builds before its own.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from minidnn.primitives import _cuda

NVCC = shutil.which("nvcc")
# One build's limit: generous, so that a loaded machine fails a test on its assertions, not on the clock.
TIMEOUT_S = 900


@dataclasses.dataclass(frozen=True)
class Build:
    """One compile for sm_90 (or the source's own architecture, ``_cuda.ARCHITECTURES``): ``source`` as
    ``_cuda.cuda_sources()`` names it, ``-DSCALAR=scalar`` and ``-D`` defines."""

    source: str
    scalar: str = "float"
    defines: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:  # the test id: conv/winograd.cu-float, conv/implicit_gemm.cu-float-CTAS_PER_SM=3
        return "-".join([self.source, self.scalar, *(f"{name}={value}" for name, value in self.defines)])

    def command(self, nvcc: str, cubin: str) -> list[str]:
        architecture = _cuda.ARCHITECTURES.get(self.source, "sm_90")  # sm_90a: nvcc's -arch=sm_90a also runs sm_90
        target = f"-gencode=arch=compute_{architecture[3:]},code={architecture}"
        return [nvcc, "-cubin", target, "--std=c++17", f"-DSCALAR={self.scalar}",
                *(f"-D{name}={value}" for name, value in self.defines), "-Xptxas", "-v,-warn-spills",
                "-o", cubin, _cuda.source_path(self.source)]


@dataclasses.dataclass(frozen=True)
class Report:
    """A build's nvcc exit status and stderr, where ptxas writes its ``-v`` report and its warnings."""

    build: Build
    returncode: int
    stderr: str


class Builds:
    """The session's builds: each compiled once, in the order asked, one nvcc at a time in a background thread, by
    the nvcc found when they were made (a test that stands a script in for NVCC later must not reach the builds
    still running in the background)."""

    def __init__(self) -> None:
        self._nvcc = NVCC
        self._directory = tempfile.TemporaryDirectory(prefix="minidnn-nvcc-")
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvcc")
        self._futures: dict[Build, Future] = {}
        self._lock = threading.Lock()
        self._running: subprocess.Popen | None = None
        self._closed = False

    def start(self, builds: Iterable[Build]) -> None:
        """Queue ``builds`` (those already queued keep their place)."""
        for build in builds:
            self._future(build)

    def report(self, build: Build) -> Report:
        """``build``'s report, compiling it now if nothing queued it; waits for the builds queued before it."""
        return self._future(build).result()

    def close(self) -> None:
        """Drop the queued builds, end a running nvcc (a session stopped early need not wait for it), clean up."""
        with self._lock:
            self._closed = True
            for future in self._futures.values():
                future.cancel()
            if self._running is not None:
                _kill(self._running)
        self._worker.shutdown(wait=True)
        self._directory.cleanup()

    def _future(self, build: Build) -> Future:
        with self._lock:
            if build not in self._futures:
                self._futures[build] = self._worker.submit(self._compile, build, len(self._futures))
            return self._futures[build]

    def _compile(self, build: Build, number: int) -> Report:
        cubin = os.path.join(self._directory.name, f"{number}.cubin")
        with self._lock:
            if self._closed:
                raise RuntimeError("the session's builds were closed")
            # Its own process group: nvcc runs cicc and ptxas as children, and ending nvcc alone would leave them.
            self._running = subprocess.Popen(build.command(self._nvcc, cubin), stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, stderr = self._running.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(self._running)
            _, stderr = self._running.communicate()
            stderr += f"\n(ended after {TIMEOUT_S} s)"
        return Report(build, self._running.returncode, stderr)


def _kill(process: subprocess.Popen) -> None:
    """End ``process`` and its children (its process group), unless it has ended already."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # ended between the poll and the kill
            pass
