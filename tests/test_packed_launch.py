"""_cuda.PackedLaunch: a kept launch's arguments packed once, the per-call arrays' addresses rewritten, the driver
called with the slots' addresses. On the CPU with a stand-in for CuPy's driver (the bytes each parameter pointer
points at are read back); on the GPU against the same kernel launched through CuPy."""
from types import SimpleNamespace

import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda
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
