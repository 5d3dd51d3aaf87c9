"""_cuda.PackedLaunch: a kept launch's arguments packed once, the per-call arrays' addresses rewritten, the driver
called with the slots' addresses. On the CPU with a stand-in for CuPy's driver (the bytes each parameter pointer
points at are read back); on the GPU against the same kernel launched through CuPy."""
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda, blas
from tests.helpers import StandInArray, stand_in_driver

driver = pytest.fixture(name="driver")(stand_in_driver)

STRUCT = np.dtype([(f"f{i}", np.int32) for i in range(16)])


def test_the_slots_hold_each_argument_and_each_call_rewrites_only_its_arrays(driver):
    rng = np.random.default_rng()
    struct = np.array([tuple(int(v) for v in rng.integers(-2**31, 2**31, 16))], dtype=STRUCT)[0]
    fixed = StandInArray(0x7F00_0000_1230)
    kernel = SimpleNamespace(kernel=SimpleNamespace(ptr=0xABC))  # a RawKernel: its function per device
    d = float(rng.standard_normal())
    P = _cuda.PER_CALL
    packed = _cuda.PackedLaunch(kernel, (5, 3), (256,), (P, fixed, _cuda.i32(-17), _cuda.f64(d), struct, None, P, P),
                                shared_bytes=96)
    driver.sizes = [8, 8, 4, 8, 64, 8, 8, 8]
    first, second = StandInArray(0x7F00_0000_4000), StandInArray(0x7F00_0000_8010)
    packed(first, None, second)
    packed(second, first, None)
    (function, grid, block, shared, stream, one, extra), (_, _, _, _, _, two, _) = driver.launches

    assert (function, grid, block, shared, stream, extra) == (0xABC, (5, 3, 1), (256, 1, 1), 96, 4242, 0)
    address = [int.from_bytes(value, "little") for value in one[:2]]
    assert address == [first.data.ptr, fixed.data.ptr]
    assert np.frombuffer(one[2], np.int32)[0] == -17
    assert np.frombuffer(one[3], np.float64)[0] == d  # the bits of the double
    assert one[4] == struct.tobytes()
    assert [int.from_bytes(value, "little") for value in one[5:]] == [0, 0, second.data.ptr]  # None: a null pointer
    assert [int.from_bytes(value, "little") for value in two[5:]] == [0, first.data.ptr, 0]
    assert two[:5] == [second.data.ptr.to_bytes(8, "little"), *one[1:5]]  # the rest kept as packed


def test_another_context_launches_through_cupy_and_bad_arguments_are_refused(driver):
    calls = []

    def kernel(grid, block, arguments, shared_mem=0):  # a kernel without .kernel: its pointer is its own
        calls.append((grid, block, arguments, shared_mem))

    kernel.ptr = 1
    P, first = _cuda.PER_CALL, StandInArray(64)
    packed = _cuda.PackedLaunch(kernel, (2,), (32,), (_cuda.i32(3), P))
    driver.context = 8  # another GPU, or a thread with no context
    packed(first)
    assert calls == [((2, 1, 1), (32, 1, 1), (_cuda.i32(3), first), 0)] and driver.launches == []
    with pytest.raises(TypeError, match="takes 1 arrays, got 2"):
        packed(first, first)
    with pytest.raises(TypeError, match="use i32 and f64"):
        _cuda.PackedLaunch(kernel, (1,), (32,), (3,))  # a Python int: CuPy would pass 64 bits


def test_a_scalar_or_struct_rewritten_through_its_view_is_what_the_next_calls_pass(driver):
    """A multi-tensor update writes each call's table of addresses and hyper-parameters into its packed arguments:
    the driver then reads the new bytes, and so does a call from another context, which goes through CuPy."""
    rng = np.random.default_rng()
    calls = []

    def kernel(grid, block, arguments, shared_mem=0):
        calls.append(arguments)

    kernel.ptr = 5
    struct = np.zeros(1, dtype=STRUCT)[0]
    P = _cuda.PER_CALL
    packed = _cuda.PackedLaunch(kernel, (1,), (32,), (struct, _cuda.f64(0.5), P, _cuda.i32(1)))
    driver.sizes = [64, 8, 8, 4]
    values = rng.integers(-2**31, 2**31, 16)
    table = packed.argument_view(0)
    table[0] = tuple(int(v) for v in values)
    d = float(rng.standard_normal())
    packed.argument_view(1)[0] = d
    packed(StandInArray(0x1000))
    (*_, parameters, _), = driver.launches
    np.testing.assert_array_equal(np.frombuffer(parameters[0], np.int32), values)
    assert np.frombuffer(parameters[1], np.float64)[0] == d
    assert np.frombuffer(parameters[3], np.int32)[0] == 1  # untouched: as packed
    driver.context = 8
    table["f2"] = 77
    packed(None)
    (passed_struct, passed_double, array, passed_int), = calls
    assert passed_struct["f2"] == 77 and passed_struct["f3"] == values[3] and passed_double == d and array is None
    assert passed_int == _cuda.i32(1)
    with pytest.raises(TypeError, match="argument 2 is not a scalar or struct"):
        packed.argument_view(2)


ECHO = r"""
struct Shape { int values[16]; };
extern "C" __global__ void echo(const float* x, double* out, int n, double d, Shape shape, const float* absent,
                                float* y) {
    out[0] = x[0]; out[1] = n; out[2] = d; out[3] = absent == nullptr;
    for (int i = 0; i < 16; ++i) out[4 + i] = shape.values[i];
    y[threadIdx.x] = x[threadIdx.x] * 2.0f;
}
"""


@pytest.mark.gpu
def test_gpu_a_packed_launch_passes_what_cupy_passes():
    cupy = backend.cupy()
    rng = np.random.default_rng()
    kernel = cupy.RawKernel(ECHO, "echo")
    struct = np.array([tuple(int(v) for v in rng.integers(-1000, 1000, 16))], dtype=STRUCT)[0]
    n, d = _cuda.i32(int(rng.integers(-99, 99))), _cuda.f64(float(rng.standard_normal()))
    P = _cuda.PER_CALL
    packed = _cuda.PackedLaunch(kernel, (1,), (32,), (P, P, n, d, struct, None, P))
    results = []
    for _ in range(2):  # the second call with arrays at other addresses
        x = cupy.asarray(rng.standard_normal(32), dtype=cupy.float32)
        by_cupy, by_packed = cupy.zeros(20), cupy.zeros(20)
        y_cupy, y_packed = cupy.zeros(32, cupy.float32), cupy.zeros(32, cupy.float32)
        kernel((1,), (32,), (x, by_cupy, n, d, struct, None, y_cupy))
        packed(x, by_packed, y_packed)
        results.append((by_cupy.get(), by_packed.get(), y_cupy.get(), y_packed.get(), x.get()))
    for by_cupy, by_packed, y_cupy, y_packed, x in results:
        np.testing.assert_array_equal(by_packed, by_cupy)
        np.testing.assert_array_equal(by_packed, [x[0], n, d, 1.0, *struct.tolist()])
        np.testing.assert_array_equal(y_packed, y_cupy)
        np.testing.assert_array_equal(y_packed, x * 2)


# ----------------------------------------------------------------------------------------------
# Ready calls: a primitive call's launches recorded once, replayed with new arrays
# ----------------------------------------------------------------------------------------------
class StandInDeviceArray(StandInArray):
    """What a ready call reads of a CuPy array: its address, shape, dtype, size in bytes, contiguity and base; a view
    (``base`` given) lies ``offset`` bytes into its base."""

    addresses = iter(range(0x10_0000, 0x7F_0000, 0x1000))

    def __init__(self, shape, dtype=np.float32, contiguous=True, base=None, offset=0):
        super().__init__(next(self.addresses) if base is None else base.data.ptr + offset)
        self.shape, self.dtype, self.base = shape, np.dtype(dtype), base
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.flags = SimpleNamespace(c_contiguous=contiguous)


def test_a_ready_call_allocates_its_arrays_and_replays_its_launches_with_the_new_addresses(driver, monkeypatch):
    monkeypatch.setattr(_cuda, "grid_stride_blocks", lambda count, threads=_cuda.THREADS: 3)
    backend.cupy().empty = lambda shape, dtype: StandInDeviceArray(shape, dtype)
    backend.cupy().ndarray = StandInDeviceArray
    first, second = SimpleNamespace(ptr=0xA), SimpleNamespace(ptr=0xB)
    kernels = [lambda grid, block, arguments, shared_mem=0: None for _ in range(2)]
    for kernel, function in zip(kernels, (first, second)):
        kernel.ptr = function.ptr
    x, weight = StandInDeviceArray((4, 5)), None
    scratch, out = StandInDeviceArray((2, 5), np.float64), StandInDeviceArray((5,))
    with _cuda.recording() as outer:
        with _cuda.recording() as launches:
            _cuda.launch_blocks(kernels[0], (5, 2), 64, (x, scratch, weight, _cuda.i32(4)))
            _cuda.launch(kernels[1], 17, (scratch, out, _cuda.f64(0.5), _cuda.i32(17)))
            # No work: neither launched nor recorded.
            _cuda.launch(kernels[1], 0, (scratch, out, _cuda.f64(0.5), _cuda.i32(0)))
    assert len(launches) == 2 and outer == launches  # an inner recording's launches are the outer's too
    ready = _cuda.ReadyCall(launches, (x, weight), (scratch, out), (out,))
    driver.launches.clear()
    driver.sizes = [8, 8, 8, 8]  # each launch's four parameters, read as 8 bytes each
    new_x = StandInDeviceArray((4, 5))
    (result,) = ready(new_x, None)
    (function_1, grid_1, block_1, _, _, values_1, _), (function_2, grid_2, block_2, _, _, values_2, _) = driver.launches
    assert (function_1, grid_1, block_1) == (0xA, (5, 2, 1), (64, 1, 1))
    assert (function_2, grid_2, block_2) == (0xB, (3, 1, 1), (_cuda.THREADS, 1, 1))
    assert result.shape == (5,) and result.dtype == np.float32 and result is not out
    addresses_1 = [int.from_bytes(v, "little") for v in values_1[:3]]
    assert addresses_1[0] == new_x.data.ptr and addresses_1[2] == 0 and np.frombuffer(values_1[3], np.int32)[0] == 4
    new_scratch = addresses_1[1]
    assert new_scratch not in (scratch.data.ptr, new_x.data.ptr)  # allocated anew, then passed to both launches
    assert [int.from_bytes(v, "little") for v in values_2[:2]] == [new_scratch, result.data.ptr]
    assert np.frombuffer(values_2[2], np.float64)[0] == 0.5 and np.frombuffer(values_2[3], np.int32)[0] == 17
    kept = _cuda.ReadyCalls()
    kept.keep(("copied",), launches, (StandInDeviceArray((4, 5)), None), (scratch, out), (out,))  # x is not an input
    strided = StandInDeviceArray((5,), contiguous=False)  # a view the call made: a repeat could not allocate it
    with _cuda.recording() as strided_launches:
        _cuda.launch(kernels[1], 17, (scratch, strided, _cuda.f64(0.5), _cuda.i32(17)))
    kept.keep(("strided",), strided_launches, (x, None), (scratch, strided), (strided,))
    kept.keep(("plain",), launches, (x, None), (scratch, out), (out,))
    assert kept.get(("copied",)) is None and kept.get(("strided",)) is None and kept.get(("plain",)) is not None


class StandInCublas(blas._Cublas):
    """cuBLAS's entry points as a list of the calls made: (entry point, its arguments after the handle)."""

    def __init__(self):
        self.calls = []

    def call(self, entry, *arguments):
        self.calls.append((entry, arguments))


def test_a_ready_call_moves_each_view_and_gemm_operand_by_its_offset_into_the_new_arrays(driver, monkeypatch):
    """A convolution's recording takes views: images of its input, pieces of its workspace. Each repeat passes every
    launch and every cuBLAS GEMM the same byte offsets into the new call's arrays; an address outside them all (memory
    the call made itself) is refused."""
    monkeypatch.setattr(_cuda, "grid_stride_blocks", lambda count, threads=_cuda.THREADS: 1)
    backend.cupy().ndarray, backend.cupy().empty = StandInDeviceArray, None  # it allocates nothing
    kernel = lambda grid, block, arguments, shared_mem=0: None  # noqa: E731
    kernel.ptr = 0xC
    cublas = StandInCublas()
    rng = np.random.default_rng()
    image, transformed = (int(v) * 16 for v in rng.integers(1, 40, 2))
    x, out, workspace = StandInDeviceArray((40, 8)), StandInDeviceArray((5, 8)), StandInDeviceArray((4096,), np.uint8)
    late_images = StandInDeviceArray((2, 8), base=x, offset=image)
    U = StandInDeviceArray((4, 4), base=workspace)
    V = StandInDeviceArray((4, 8), base=workspace, offset=1024 + transformed)
    with _cuda.recording() as steps:
        _cuda.launch(kernel, 8, (late_images, U, _cuda.i32(8)))
        cublas.gemm(False, False, 8, 4, 4, 1.0, V, 8, 0, U, 4, 0, 0.0, out, 8, 0, 1)
    assert len(steps) == 2
    ready = _cuda.ReadyCall(steps, (x, out, workspace), (), ())
    driver.launches.clear()
    cublas.calls.clear()
    driver.sizes = [8, 8, 4]
    new_x, new_out, new_workspace = StandInDeviceArray((40, 8)), StandInDeviceArray((5, 8)), \
        StandInDeviceArray((4096,), np.uint8)
    assert ready(new_x, new_out, new_workspace) == ()
    (*_, values, _), = driver.launches
    assert [int.from_bytes(v, "little") for v in values[:2]] == [new_x.data.ptr + image, new_workspace.data.ptr]
    (entry, arguments), = cublas.calls
    assert entry == "gemmEx" and arguments[:5] == (0, 0, 8, 4, 4)
    assert [arguments[6], arguments[9], arguments[13]] == [new_workspace.data.ptr + 1024 + transformed,
                                                           new_workspace.data.ptr, new_out.data.ptr]
    scratch = StandInDeviceArray((4, 4))  # neither an input nor the workspace
    with _cuda.recording() as steps:
        cublas.gemm(False, False, 4, 4, 4, 1.0, U, 4, 0, scratch, 4, 0, 0.0, out, 4, 0, 1)
    with pytest.raises(ValueError, match="lies in no input"):
        _cuda.ReadyCall(steps, (x, out, workspace), (), ())


def test_a_recording_takes_its_own_threads_steps_and_an_inner_recording_adds_them_to_the_outer():
    def make(name):
        return name

    with _cuda.recording() as outer:
        _cuda.record((), make, "first")
        other = threading.Thread(target=_cuda.record, args=((), make, "another thread's"))
        other.start()
        other.join()
        with _cuda.recording() as inner:
            _cuda.record((), make, "inner")
        _cuda.record((), make, "last")
    _cuda.record((), make, "after")  # no recording: nothing kept
    assert [step() for step, _ in inner] == ["inner"]
    assert [step() for step, _ in outer] == ["first", "inner", "last"]


@pytest.mark.gpu
def test_gpu_the_one_call_layers_repeat_through_ready_calls_with_the_numpy_twins_results(monkeypatch):
    """Linear's three directions, bias_backward, adaptive average pooling and cross-entropy, each called three times
    with new values of the same shapes: every call gives what the NumPy twin gives on those values, and only the first
    took the checked path (the repeats went from their keys to their ready calls)."""
    from minidnn.primitives import blas, linear, pooling, softmax  # noqa: PLC0415

    cupy = backend.cupy()
    rng = np.random.default_rng()
    checked = []

    def counted(owner, name):
        function = getattr(owner, name)
        def on_gpu_counted(*arguments, **keywords):  # (the NumPy twins call some of the same helpers)
            if any(backend.is_cuda_array(a) for a in arguments):
                checked.append(name)
            return function(*arguments, **keywords)

        monkeypatch.setattr(owner, name, on_gpu_counted)

    monkeypatch.setattr(linear, "_ready", {})
    for owner, store in ((linear, "_ready_bias_backward"), (pooling, "_ready_adaptive_forward"),
                         (pooling, "_ready_adaptive_backward"), (softmax, "_ready_forward"),
                         (softmax, "_ready_backward")):
        monkeypatch.setattr(owner, store, _cuda.ReadyCalls())
    counted(blas, "gemm")
    for owner, name in ((linear, "_bias_backward_gpu"), (pooling, "_adaptive_avg_pool2d_gpu"),
                        (softmax, "_cross_entropy_forward_gpu"), (softmax, "_cross_entropy_backward_gpu")):
        counted(owner, name)
    for repeat in range(3):
        checked.clear()
        x, weight, bias, dy = (rng.standard_normal(s).astype(np.float32) for s in ((37, 23), (11, 23), (11,), (37, 11)))
        maps, target = rng.standard_normal((6, 5, 7, 3)).astype(np.float32), rng.integers(0, 11, 37)
        pooled_grad = rng.standard_normal((6, 5, 1, 1)).astype(np.float32)
        calls = [(linear.linear_forward, (x, weight, bias)), (linear.linear_backward_data, (dy, weight)),
                 (linear.linear_backward_weight, (x, dy)), (linear.bias_backward, (dy, -1)),
                 (pooling.adaptive_avg_pool2d_forward, (maps, 1)),
                 (pooling.adaptive_avg_pool2d_backward, (pooled_grad, (6, 5, 7, 3))),
                 (softmax.cross_entropy_forward, (dy, target)),
                 (softmax.cross_entropy_backward, (np.full((), 0.7, np.float32),
                                                   softmax.cross_entropy_forward(dy, target)[1], target))]
        for function, arguments in calls:
            on_gpu = function(*(cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in arguments))
            twin = function(*arguments)
            for got, expected in zip(on_gpu if isinstance(on_gpu, tuple) else (on_gpu,),
                                     twin if isinstance(twin, tuple) else (twin,)):
                np.testing.assert_allclose(cupy.asnumpy(got), expected, rtol=2e-5, atol=2e-6,
                                           err_msg=f"{function.__name__}, call {repeat}")
        expected_checked = {"gemm", "_bias_backward_gpu", "_adaptive_avg_pool2d_gpu", "_cross_entropy_forward_gpu",
                            "_cross_entropy_backward_gpu"}
        assert set(checked) == (expected_checked if repeat == 0 else set()), (repeat, checked)
