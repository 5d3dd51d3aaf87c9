"""The eager convolutions' shared workspace (minidnn/primitives/conv/workspace.py): one buffer per device and
stream, grown and never shrunk, a fresh one under graph capture, and the views carved from it kept with it.
The bookkeeping is checked with a stand-in CuPy on every machine; on the GPU, a Winograd call after its
first allocates nothing, gives the float64 reference's answer, and stays right after the buffer grows."""
import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda, conv
from minidnn.primitives.conv import registry, workspace


class StandInStream:
    def __init__(self, ptr):
        self.ptr, self.capturing = ptr, False

    def is_capturing(self):
        return self.capturing


class StandInCupy:
    """What workspace.py asks of CuPy: the current stream and device, and empty()."""

    def __init__(self):
        self.stream, self.device, self.allocations = StandInStream(1), 0, []
        outer = self

        class Cuda:
            class runtime:
                @staticmethod
                def getDevice():
                    return outer.device

            @staticmethod
            def get_current_stream():
                return outer.stream

        self.cuda = Cuda

    def empty(self, nbytes, dtype):
        self.allocations.append(nbytes)
        return np.empty(nbytes, dtype)


@pytest.fixture
def cupy(monkeypatch):
    stand_in = StandInCupy()
    monkeypatch.setattr(backend, "cupy", lambda: stand_in)
    workspace.release()
    yield stand_in
    workspace.release()


def test_one_buffer_per_stream_grows_and_is_kept(cupy):
    first = workspace.workspace(100)
    assert workspace.workspace(100) is first and workspace.workspace(60) is first
    grown = workspace.workspace(300)
    assert grown.size == 300 and workspace.workspace(200) is grown  # it never shrinks back
    cupy.stream = StandInStream(2)
    other = workspace.workspace(50)
    assert other is not grown and other.size == 50
    cupy.device = 1
    assert workspace.workspace(50) is not other  # another device: another buffer
    assert cupy.allocations == [100, 300, 50, 50]


def test_a_captured_call_gets_a_buffer_of_its_own_every_time(cupy):
    shared = workspace.workspace(100)
    cupy.stream.capturing = True
    during = [workspace.workspace(100) for _ in range(2)]
    assert during[0] is not shared and during[1] is not during[0]
    cupy.stream.capturing = False
    assert workspace.workspace(100) is shared  # capture left the shared buffer as it was


def test_views_are_carved_once_per_key_and_dropped_with_their_buffer(cupy):
    carvings = []

    def carve(buffer):
        carvings.append(buffer)
        return buffer[:10]

    shared = workspace.workspace(100)
    view = workspace.carved(shared, ("a",), lambda: carve(shared))
    assert workspace.carved(shared, ("a",), lambda: carve(shared)) is view
    workspace.carved(shared, ("b",), lambda: carve(shared))
    assert len(carvings) == 2
    grown = workspace.workspace(200)
    assert list(workspace._views) == [id(grown)]  # the old buffer's views went with it (they held its memory)
    again = workspace.carved(grown, ("a",), lambda: carve(grown))
    assert again.base is grown and len(carvings) == 3
    private = np.empty(100, np.uint8)  # not a shared buffer (the CPU's, a graph's): carved every call
    for _ in range(2):
        workspace.carved(private, ("a",), lambda: carve(private))
    assert len(carvings) == 5


# ----------------------------------------------------------------------------------------------
# On the GPU
# ----------------------------------------------------------------------------------------------
def _winograd_problem_arrays(rng, cupy, N):
    x = rng.standard_normal((N, 6, 17, 19))
    w = rng.standard_normal((5, 6, 3, 3))
    return x, w, cupy.asarray(x.astype(np.float32)), cupy.asarray(w.astype(np.float32))


@pytest.mark.gpu
def test_an_eager_winograd_call_after_its_first_allocates_nothing(rng):
    cupy = backend.cupy()
    workspace.release()
    registry.clear_caches()
    x, w, x_gpu, w_gpu = _winograd_problem_arrays(rng, cupy, 7)
    out = cupy.empty((7, 5, 17, 19), dtype=np.float32)
    conv.conv2d_forward(x_gpu, w_gpu, 1, 1, algo="winograd_4x4", out=out)
    backend.synchronize()
    _cuda.reset_peak_memory_stats()
    before = _cuda.memory_allocated()
    out[...] = np.nan
    conv.conv2d_forward(x_gpu, w_gpu, 1, 1, algo="winograd_4x4", out=out)
    assert _cuda.max_memory_allocated() == before  # no workspace allocated, none carved
    want = conv.conv2d_forward(x, w, 1, 1, algo="reference")
    np.testing.assert_allclose(out.get(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_winograd_stays_right_when_the_shared_buffer_grows_under_its_kept_views(rng):
    cupy = backend.cupy()
    workspace.release()
    registry.clear_caches()
    small, large = (_winograd_problem_arrays(rng, cupy, N) for N in (2, 9))
    for x, w, x_gpu, w_gpu in (small, large, small, large):  # the small call's views were of the old buffer
        got = conv.conv2d_forward(x_gpu, w_gpu, 1, 1, algo="winograd_4x4")
        np.testing.assert_allclose(got.get(), conv.conv2d_forward(x, w, 1, 1, algo="reference"), rtol=1e-4,
                                   atol=1e-4)
    assert len(workspace._buffers) == 1
