"""The launch path of minidnn's kernels (_cuda._launch): each kernel's arguments packed by a layout made at its
first launch, as CuPy would pass them. On the CPU the layout's bytes against NumPy's own encoding of each value;
on the GPU a kernel that writes back what it was given, launched through CuPy and then through the layout."""
import ctypes
import struct

import numpy as np
import pytest

from minidnn.primitives import _cuda

RECORD = np.dtype([("N", np.int32), ("K", np.int32), ("scale", np.float64), ("flag", np.int8)], align=True)


class _StandInArray:
    """What the layout reads of a CuPy array: its address, as ``array.data.ptr``."""

    def __init__(self, address):
        self.data = type("memory", (), {"ptr": address})()


def _arguments(record_values=(3, 5, 0.25, 1)):
    record = np.array([record_values], dtype=RECORD)
    return (_StandInArray(0x7F00_0000_1000), None, np.int32(-7), np.uint64(2**63 + 5), np.float32(1.5),
            np.float64(-2.25), record[0], np.int8(-3), np.float16(0.5), 0.125, True, record)


def _expected_bytes(argument):
    """The bytes CuPy passes for ``argument``: an array's address, 0 for None, a NumPy value's own bytes, a Python
    float as float64 and bool as bool (NEP 50's default types)."""
    if isinstance(argument, _StandInArray):
        return struct.pack("=Q", argument.data.ptr)
    if argument is None:
        return bytes(8)
    if isinstance(argument, (bool, float)):
        return np.array(argument).tobytes()
    return np.asarray(argument).tobytes()


@pytest.fixture
def stand_in_arrays(monkeypatch):
    monkeypatch.setattr(_cuda, "_array_type", _StandInArray)


def test_layout_puts_each_argument_where_its_pointer_says(stand_in_arrays):
    arguments = _arguments()
    layout = _cuda.ArgumentLayout.of(arguments)
    assert layout is not None
    for values in (arguments, _arguments((-1, 2**31 - 1, 1e300, -128))):  # packed again: the same layout, new values
        layout.pack(values)
        pointers = list(layout.pointers)
        assert layout.parameters == ctypes.addressof(layout.pointers)
        assert all(p % _cuda.SLOT_BYTES == 0 for p in pointers)
        for pointer, argument in zip(pointers, values, strict=True):
            expected = _expected_bytes(argument)
            assert ctypes.string_at(pointer, len(expected)) == expected, argument


def test_layout_of_no_arguments_hands_the_driver_no_table():
    assert _cuda.ArgumentLayout.of(()).parameters == 0


@pytest.mark.parametrize("argument", [7, 2**63, 1j, np.zeros(2, np.float32), np.array([1], dtype=object), "text",
                                      np.datetime64(1, "s")], ids=repr)
def test_arguments_the_layout_does_not_know_stay_with_cupy(stand_in_arrays, argument):
    """A Python int (CuPy gives it 64 bits signed or unsigned by its value), a complex, an array of more than one
    value, and anything that is no scalar: no layout, so each launch goes through CuPy's own."""
    assert _cuda.ArgumentLayout.of((np.int32(1), argument)) is None


def test_a_stand_in_kernel_is_always_called_as_it_is(monkeypatch):
    """A kernel that is no CuPy Function (the tests' stand-ins) gets every launch as a call, never the driver."""
    calls = []
    monkeypatch.setattr(_cuda, "_function_type", ())  # no CuPy kernel type: as on a machine without CuPy
    monkeypatch.setattr(_cuda, "_driver", None)  # the fast path would fail on it

    def kernel(grid, block, args, shared_mem=0):
        calls.append((grid, block, args, shared_mem))

    for _ in range(3):
        _cuda.launch_blocks(kernel, (2, 3), 64, (np.int32(4),), shared_bytes=16)
    assert calls == [((2, 3), (64,), (np.int32(4),), 16)] * 3


ECHO = r"""
struct Record { int N; int K; double scale; signed char flag; };
extern "C" __global__ void echo(double* out, const float* x, const float* absent, int i, unsigned long long u,
                                float f, double d, Record r, signed char c, double python_float, bool python_bool) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    out[0] = x[0]; out[1] = absent == nullptr; out[2] = i; out[3] = (double)(u >> 32); out[4] = (double)(u & 0xffffffffu);
    out[5] = f; out[6] = d; out[7] = r.N; out[8] = r.K; out[9] = r.scale; out[10] = r.flag; out[11] = c;
    out[12] = python_float; out[13] = python_bool; out[14] = gridDim.x * 100 + gridDim.y; out[15] = blockDim.x;
}
"""


@pytest.mark.gpu
def test_kernel_gets_the_same_arguments_through_cupy_and_through_its_layout(monkeypatch):
    import cupy  # noqa: PLC0415

    kernel = cupy.RawModule(code=ECHO).get_function("echo").kernel  # the device's Function, as _cuda.function's
    driver_launches = []

    class CountingDriver:
        @staticmethod
        def launchKernel(*args):
            driver_launches.append(args[0])
            return _cuda._driver.launchKernel(*args)

    monkeypatch.setattr(_cuda, "_driver", CountingDriver)
    results = []
    for step in range(3):  # the first launch goes through CuPy, the others through the layout
        out, x = cupy.full(16, np.nan), cupy.asarray([2.5 + step], np.float32)
        record = np.array([(3 + step, -4, 0.75 * step, -2)], dtype=RECORD)[0]
        _cuda.launch_blocks(kernel, (3, 2), 32, (out, x, None, np.int32(-9 - step), np.uint64(2**40 + 7 + step),
                                                 np.float32(1.25), np.float64(-6.5 + step), record, np.int8(-5),
                                                 0.125 * step, step % 2 == 1))
        results.append(out.get())
    assert driver_launches == [kernel.ptr, kernel.ptr]
    for step, result in enumerate(results):
        np.testing.assert_array_equal(result, [2.5 + step, 1, -9 - step, 2**8, 7 + step, 1.25, -6.5 + step,
                                               3 + step, -4, 0.75 * step, -2, -5, 0.125 * step, step % 2, 302, 32])


@pytest.mark.gpu
def test_primitives_launch_their_kernels_through_the_layout(monkeypatch):
    """_cuda.function hands out the device's Function, so a primitive's second launch of a kernel reaches the
    driver through its layout (a RawKernel, which CuPy's modules hand out, would always go through CuPy)."""
    import cupy  # noqa: PLC0415

    from minidnn.primitives import activation  # noqa: PLC0415

    driver_launches = []

    class CountingDriver:
        @staticmethod
        def launchKernel(*args):
            driver_launches.append(args[0])
            return _cuda._driver.launchKernel(*args)

    x = cupy.asarray(np.random.default_rng(5).standard_normal((3, 7, 5)), np.float32)
    expected = np.maximum(x.get(), 0)
    activation.relu_forward(x)  # the first launch of the kernel on this thread: through CuPy
    monkeypatch.setattr(_cuda, "_driver", CountingDriver)
    np.testing.assert_array_equal(activation.relu_forward(x).get(), expected)
    assert len(driver_launches) == 1
