"""Linear and bias primitives against plain-loop float64 references, finite differences and torch."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minidnn.primitives.linear import (bias_add, bias_backward, linear_backward_data, linear_backward_weight,
                                       linear_forward)
from tests.helpers import assert_close, numerical_gradient, to_numpy

IN, OUT = 5, 3
LEADING = [(), (1,), (4,), (2, 3)]  # x is (*leading, in_features); () is a single 1-D sample


# ----------------------------------------------------------------------------------------------
# Independent float64 reference: plain loops over every index
# ----------------------------------------------------------------------------------------------
def reference_linear(x, weight, bias):
    x, weight = np.asarray(x, dtype=np.float64), np.asarray(weight, dtype=np.float64)
    out_features, in_features = weight.shape
    y = np.zeros(x.shape[:-1] + (out_features,))
    for lead in np.ndindex(*x.shape[:-1]):
        for o in range(out_features):
            total = 0.0 if bias is None else float(bias[o])
            for i in range(in_features):
                total += x[lead + (i,)] * weight[o, i]
            y[lead + (o,)] = total
    return y


def reference_backward_data(dy, weight):
    out_features, in_features = weight.shape
    dx = np.zeros(dy.shape[:-1] + (in_features,))
    for lead in np.ndindex(*dy.shape[:-1]):
        for i in range(in_features):
            dx[lead + (i,)] = sum(float(dy[lead + (o,)]) * float(weight[o, i]) for o in range(out_features))
    return dx


def reference_backward_weight(x, dy):
    dweight = np.zeros((dy.shape[-1], x.shape[-1]))
    for lead in np.ndindex(*x.shape[:-1]):
        for o in range(dy.shape[-1]):
            for i in range(x.shape[-1]):
                dweight[o, i] += float(dy[lead + (o,)]) * float(x[lead + (i,)])
    return dweight


def reference_bias_add(y, bias, axis):
    out = np.array(y, dtype=np.float64)
    for index in np.ndindex(*y.shape):
        out[index] += float(bias[index[axis]])
    return out


def reference_bias_backward(dy, axis):
    dbias = np.zeros(dy.shape[axis])
    for index in np.ndindex(*dy.shape):
        dbias[index[axis]] += float(dy[index])
    return dbias


def draws(rng, leading, dtype=np.float64):
    x = rng.standard_normal(leading + (IN,)).astype(dtype)
    weight = rng.standard_normal((OUT, IN)).astype(dtype)
    bias = rng.standard_normal(OUT).astype(dtype)
    dy = rng.standard_normal(leading + (OUT,)).astype(dtype)
    return x, weight, bias, dy


# ----------------------------------------------------------------------------------------------
# Linear
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("leading", LEADING)
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_reference(xp, rng, leading, with_bias):
    x, weight, bias, dy = draws(rng, leading)
    bias = bias if with_bias else None
    y = linear_forward(xp.asarray(x), xp.asarray(weight), None if bias is None else xp.asarray(bias))
    assert_close(y, reference_linear(x, weight, bias), name="y")
    assert_close(linear_backward_data(xp.asarray(dy), xp.asarray(weight)), reference_backward_data(dy, weight),
                 name="dx")
    assert_close(linear_backward_weight(xp.asarray(x), xp.asarray(dy)), reference_backward_weight(x, dy),
                 name="dweight")
    assert_close(bias_backward(xp.asarray(dy), axis=-1), reference_bias_backward(dy, -1), name="dbias")


@pytest.mark.parametrize("leading", [(), (1,), (2, 3)])
def test_linear_finite_differences(xp, rng, leading):
    x, weight, bias, dy = draws(rng, leading)

    def f(x_, w_, b_):
        return to_numpy(linear_forward(xp.asarray(x_), xp.asarray(w_), xp.asarray(b_)))

    inputs = [x, weight, bias]
    grads = {
        "dx": linear_backward_data(xp.asarray(dy), xp.asarray(weight)),
        "dweight": linear_backward_weight(xp.asarray(x), xp.asarray(dy)),
        "dbias": bias_backward(xp.asarray(dy), axis=-1),
    }
    for index, (name, grad) in enumerate(grads.items()):
        assert_close(grad, numerical_gradient(f, inputs, index, dy), rtol=1e-7, atol=1e-9, name=name)


def test_linear_does_not_require_contiguous_inputs(xp, rng):
    x = rng.standard_normal((IN, 4, 3)).transpose(2, 1, 0)  # (3, 4, IN), strided
    weight = rng.standard_normal((IN, OUT)).T  # (OUT, IN), transposed view
    assert_close(linear_forward(xp.asarray(x), xp.asarray(weight)), reference_linear(x, weight, None), name="y")


def test_linear_float32_against_float64_reference(xp, rng):
    x, weight, bias, dy = draws(rng, (4, 3), np.float32)
    x64, w64, b64, dy64 = (a.astype(np.float64) for a in (x, weight, bias, dy))
    results = {
        "y": (linear_forward(xp.asarray(x), xp.asarray(weight), xp.asarray(bias)), reference_linear(x64, w64, b64)),
        "dx": (linear_backward_data(xp.asarray(dy), xp.asarray(weight)), reference_backward_data(dy64, w64)),
        "dweight": (linear_backward_weight(xp.asarray(x), xp.asarray(dy)), reference_backward_weight(x64, dy64)),
        "dbias": (bias_backward(xp.asarray(dy), axis=-1), reference_bias_backward(dy64, -1)),
    }
    for name, (actual, expected) in results.items():
        assert to_numpy(actual).dtype == np.float32, name
        assert_close(actual, expected, rtol=1e-5, atol=1e-5, name=name)


# ----------------------------------------------------------------------------------------------
# Bias
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis", [((1, 3, 4, 5), 1), ((2, 3, 5), 1), ((2, 5, 3), -1), ((7,), 0),
                                         ((3, 2, 4), 0), ((2, 3, 4, 5), -2)])
def test_bias_add_and_backward_match_reference(xp, rng, shape, axis):
    y, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    bias = rng.standard_normal(shape[axis])
    y_dev = xp.asarray(y)
    out = bias_add(y_dev, xp.asarray(bias), axis=axis)
    assert_close(out, reference_bias_add(y, bias, axis), name="y + bias")
    assert_close(y_dev, y, name="y unchanged")  # a new array, not an in-place add
    assert_close(bias_backward(xp.asarray(dy), axis=axis), reference_bias_backward(dy, axis), name="dbias")


@pytest.mark.parametrize("shape, axis", [((2, 3, 2, 2), 1), ((3, 4), -1)])
def test_bias_backward_finite_differences(xp, rng, shape, axis):
    y, dy, bias = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape[axis])

    def f(y_, b_):
        return to_numpy(bias_add(xp.asarray(y_), xp.asarray(b_), axis=axis))

    assert_close(bias_backward(xp.asarray(dy), axis=axis), numerical_gradient(f, [y, bias], 1, dy),
                 rtol=1e-7, atol=1e-9, name="dbias")
    assert_close(numerical_gradient(f, [y, bias], 0, dy), dy, rtol=1e-7, atol=1e-9, name="dy passes through")


def test_bias_float32_against_float64_reference(xp, rng):
    y, dy = rng.standard_normal((3, 4, 5, 3)).astype(np.float32), rng.standard_normal((3, 4, 5, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    out, dbias = bias_add(xp.asarray(y), xp.asarray(bias)), bias_backward(xp.asarray(dy))
    assert to_numpy(out).dtype == np.float32 and to_numpy(dbias).dtype == np.float32
    assert_close(out, reference_bias_add(y.astype(np.float64), bias, 1), rtol=1e-6, atol=1e-6, name="y + bias")
    assert_close(dbias, reference_bias_backward(dy.astype(np.float64), 1), rtol=1e-6, atol=1e-6, name="dbias")


# Large enough that the GPU's bias_backward splits its reductions over several blocks (both the
# column kernel, inner = 1, with C not a multiple of 32, and the plane kernel), and that bias_add's
# grid-stride loop runs more than once (more than 132·32·256 elements).
@pytest.mark.parametrize("shape, axis", [((64, 3, 33, 35), 1), ((20000, 2), -1), ((5000, 100), 1),
                                         ((3000, 401), -1), ((4, 3, 300, 400), 1), ((1, 2, 70000), 1)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_bias_large_shapes_match_numpy_twin(xp, rng, shape, axis, dtype):
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    y, dy = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    bias = rng.standard_normal(shape[axis]).astype(dtype)
    out = bias_add(xp.asarray(y), xp.asarray(bias), axis=axis)
    np.testing.assert_array_equal(to_numpy(out), bias_add(y, bias, axis=axis))  # one rounding, both devices
    # Both sum in float64 (in different orders) and round once.
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == "float64" else dict(rtol=1e-6, atol=1e-6)
    dbias = bias_backward(xp.asarray(dy), axis=axis)
    assert to_numpy(dbias).dtype == dtype
    assert_close(dbias, bias_backward(dy.astype(np.float64), axis=axis), **tol, name="dbias")


@pytest.mark.gpu
def test_gpu_bias_backward_is_one_launch_that_leaves_the_shared_counters_at_zero():
    """bias_backward is one kernel: each channel's last block adds its splits. The split reductions of both mappings
    (planes, and (rows, C) columns), called again and again with new values (the repeats through their ready forms)
    and between batch-norm calls, which share the GPU's counters, each equal the float64 sum, and every counter is
    back at 0 after each call."""
    from minidnn.primitives import _cuda, batchnorm, linear  # noqa: PLC0415
    from minidnn import backend  # noqa: PLC0415

    cupy = backend.cupy()
    rng = np.random.default_rng()
    for shape, axis in (((int(rng.integers(40, 70)), 3, 33, 35), 1), ((int(rng.integers(2900, 3100)), 401), -1)):
        dy = cupy.asarray(rng.standard_normal(shape).astype(np.float32))
        with _cuda.recording() as steps:
            linear._bias_backward_gpu(dy, axis % len(shape))
        assert len(steps) == 1, shape
        for repeat in range(4):
            x = cupy.asarray(rng.standard_normal((6, 5, 7, 9)).astype(np.float32))
            ones, zeros = cupy.ones(5, np.float32), cupy.zeros(5, np.float32)
            batchnorm.batch_norm_forward_training(x, ones, zeros, zeros.copy(), ones.copy(), 0.1, 1e-5)
            values = rng.standard_normal(shape).astype(np.float32)
            dbias = bias_backward(cupy.asarray(values), axis=axis)
            others = tuple(a for a in range(len(shape)) if a != axis % len(shape))
            np.testing.assert_allclose(cupy.asnumpy(dbias), values.astype(np.float64).sum(axis=others),
                                       rtol=1e-6, atol=1e-5, err_msg=f"{shape}, call {repeat}")
            assert not cupy.asnumpy(_cuda.block_counters(dy, 0)).any(), (shape, repeat)


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------
def test_argument_errors(xp):
    x, w = xp.ones((2, 4)), xp.ones((3, 5))
    with pytest.raises(ValueError, match=r"x has in_features=4 \(shape \(2, 4\)\) but weight expects "
                                         r"in_features=5 \(shape \(3, 5\)\)"):
        linear_forward(x, w)
    with pytest.raises(ValueError, match=r"weight must be 2-D \(out_features, in_features\), got shape \(5,\)"):
        linear_forward(x, xp.ones(5))
    with pytest.raises(ValueError, match=r"bias must have shape \(out_features,\) = \(3,\), got \(4,\)"):
        linear_forward(xp.ones((2, 5)), w, xp.ones(4))
    with pytest.raises(TypeError, match="x and weight must have the same dtype, got float32 and float64"):
        linear_forward(xp.ones((2, 5), dtype=xp.float32), w)
    with pytest.raises(TypeError, match="x and bias must have the same dtype, got float64 and float32"):
        linear_forward(xp.ones((2, 5)), w, xp.ones(3, dtype=xp.float32))
    with pytest.raises(TypeError, match="x must be a float32 or float64 array, got int64"):
        linear_forward(xp.ones((2, 5), dtype=xp.int64), w)
    with pytest.raises(TypeError, match="weight must be a float32 or float64 array, got int32"):
        linear_forward(xp.ones((2, 5)), xp.ones((3, 5), dtype=xp.int32))
    with pytest.raises(ValueError, match="x must be at least 1-D"):
        linear_forward(xp.ones(()), w)
    with pytest.raises(ValueError, match=r"dy has out_features=4 \(shape \(2, 4\)\) but weight has out_features=3"):
        linear_backward_data(xp.ones((2, 4)), w)
    with pytest.raises(ValueError, match=r"x \(2, 5\) and dy \(3, 3\) must have the same leading dimensions"):
        linear_backward_weight(xp.ones((2, 5)), xp.ones((3, 3)))
    with pytest.raises(TypeError, match="x and dy must have the same dtype"):
        linear_backward_weight(xp.ones((2, 5)), xp.ones((2, 3), dtype=xp.float32))
    y = xp.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\) \(y.shape\[1\] of y with shape \(2, 3, 4\)\), "
                                         r"got \(4,\)"):
        bias_add(y, xp.ones(4))
    with pytest.raises(ValueError, match=r"axis 3 is out of range for y with 3 dimension\(s\)"):
        bias_add(y, xp.ones(4), axis=3)
    with pytest.raises(TypeError, match="axis must be an int, got 1.0"):
        bias_add(y, xp.ones(3), axis=1.0)
    with pytest.raises(TypeError, match="y and bias must have the same dtype"):
        bias_add(y, xp.ones(3, dtype=xp.float32))
    with pytest.raises(TypeError, match="y must be a float32 or float64 array, got int64"):
        bias_add(xp.ones((2, 3), dtype=xp.int64), xp.ones(3))
    with pytest.raises(ValueError, match=r"axis -4 is out of range for dy"):
        bias_backward(y, axis=-4)
    with pytest.raises(ValueError, match="dy must be at least 1-D"):
        bias_backward(xp.ones(()))


# ----------------------------------------------------------------------------------------------
# Optional cross-check with PyTorch
# ----------------------------------------------------------------------------------------------
def test_matches_torch(xp, rng):
    torch = pytest.importorskip("torch")
    x, weight, bias, dy = draws(rng, (2, 3))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, weight, bias))
    ty = torch.nn.functional.linear(tx, tw, tb)
    ty.backward(torch.tensor(dy))
    assert_close(linear_forward(*(xp.asarray(a) for a in (x, weight, bias))), ty.detach().numpy(), name="y")
    assert_close(linear_backward_data(xp.asarray(dy), xp.asarray(weight)), tx.grad.numpy(), name="dx")
    assert_close(linear_backward_weight(xp.asarray(x), xp.asarray(dy)), tw.grad.numpy(), name="dweight")
    assert_close(bias_backward(xp.asarray(dy), axis=-1), tb.grad.numpy(), name="dbias")


def test_bias_add_writes_into_out_and_in_place(xp, rng):
    y = xp.asarray(rng.standard_normal((2, 3, 4, 5)))
    bias = xp.asarray(rng.standard_normal(3))
    expected = to_numpy(y) + to_numpy(bias).reshape(1, 3, 1, 1)
    out = xp.empty_like(y)
    assert bias_add(y, bias, 1, out=out) is out
    assert_close(out, expected)
    same = bias_add(y, bias, 1, out=y)  # in place: the convolution's output gets its bias, no copy
    assert same is y
    assert_close(y, expected)
    with pytest.raises(ValueError, match="out must be a C-contiguous"):
        bias_add(y, bias, 1, out=xp.empty((2, 3, 4, 4)))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape, axis", [((3, 5, 7, 6), 1), ((2, 9, 130), -1), ((4, 1, 3, 3), 1), ((300, 70), -1)])
def test_half_bias_is_the_float64_sum_of_the_exact_values_rounded(xp, rng, name, shape, axis):
    """Half y, bias and dy (on the GPU linear.cu's half build): y + bias is the exact sum's float32 value
    rounded once, in place too; dbias is the float64 sum rounded to float32, then to the half type."""
    from minidnn.primitives import convert  # noqa: PLC0415

    def half(values):
        stored = convert.float_to_half(xp.asarray(values.astype(np.float32)), name)
        return stored, to_numpy(convert.half_to_float(stored, name)).astype(np.float64)

    def words(array):
        return to_numpy(array).view(np.uint16)

    (y, y_exact), (bias, bias_exact), (dy, dy_exact) = (half(rng.standard_normal(s) * 4) for s in
                                                         (shape, (shape[axis],), shape))
    want = words(convert.float_to_half(xp.asarray(reference_bias_add(y_exact, bias_exact, axis % len(shape))
                                                  .astype(np.float32)), name))
    got = bias_add(y, bias, axis=axis)
    assert got.dtype == y.dtype
    np.testing.assert_array_equal(words(got), want)
    assert bias_add(y, bias, axis=axis, out=y) is y
    np.testing.assert_array_equal(words(y), want)
    dbias = bias_backward(dy, axis=axis)
    assert dbias.dtype == dy.dtype
    exact_sums = reference_bias_backward(dy_exact, axis % len(shape)).astype(np.float32)
    np.testing.assert_array_equal(words(dbias), words(convert.float_to_half(xp.asarray(exact_sums), name)))


# ----------------------------------------------------------------------------------------------
# The steady state on the GPU: a repeated call goes from its key to its ready GEMM and bias launch
# ----------------------------------------------------------------------------------------------
class DeviceArray(np.ndarray):
    """A stand-in CuPy array: NumPy's, on GPU 0 at its own address."""

    __module__ = "cupy_stand_in"  # backend.is_cuda_array: a CuPy type

    @property
    def data(self):
        return SimpleNamespace(device_id=0, ptr=self.ctypes.data)


def test_a_repeated_call_passes_cublas_and_the_bias_kernel_what_the_checked_call_passed(rng, monkeypatch):
    """Each direction twice with new arrays of the same shapes: the second call, ready, hands cuBLAS the first call's
    arguments with its own addresses, and the bias kernel the same sizes; a change of the TF32 switch is a new call.
    On the CPU with stand-ins for CuPy's arrays, cuBLAS's handle and the launches."""
    from minidnn import backend  # noqa: PLC0415
    from minidnn.primitives import _cuda, blas, linear  # noqa: PLC0415

    calls = []

    class Handle:  # the real argument lists; the call only recorded
        gemm = blas._Cublas.gemm
        gemm_arguments = staticmethod(blas._Cublas.gemm_arguments)

        def call(self, entry, *arguments):
            calls.append(("cublas", entry, arguments))

    class Recorded:
        def __init__(self, kernel, grid, block, arguments, shared_bytes=0):
            self.arguments = arguments

        def __call__(self, *arrays):
            calls.append(("packed", self.arguments, tuple(a.data.ptr for a in arrays)))

    def empty(shape, dtype):
        return np.empty(shape, dtype).view(DeviceArray)

    monkeypatch.setattr(backend, "cupy", lambda: SimpleNamespace(empty=empty, ascontiguousarray=lambda a: a))
    monkeypatch.setattr(blas, "_cublas", Handle)
    monkeypatch.setattr(linear, "_kernel", lambda name, array: name)
    monkeypatch.setattr(linear, "_ready", {})
    monkeypatch.setattr(_cuda, "PackedLaunch", Recorded)
    monkeypatch.setattr(_cuda, "grid_stride_blocks", lambda count, threads=_cuda.THREADS: 1)
    checked, gemm = [], blas.gemm
    monkeypatch.setattr(blas, "gemm", lambda *a, **k: (checked.append(1), gemm(*a, **k))[1])
    monkeypatch.setattr(_cuda, "launch", lambda kernel, count, arguments: calls.append(
        ("launch", arguments[3:], tuple(a.data.ptr for a in arguments[:3]))))

    def draw(*shape):
        return rng.standard_normal(shape).astype(np.float32).view(DeviceArray)

    directions = [(lambda x, w, b, dy: linear_forward(x, w, b), lambda x, w, b, dy, out: (x, w, out)),
                  (lambda x, w, b, dy: linear_backward_data(dy, w), lambda x, w, b, dy, out: (dy, w, out)),
                  (lambda x, w, b, dy: linear_backward_weight(x, dy), lambda x, w, b, dy, out: (dy, x, out))]
    for call, operands in directions:
        for tf32 in (False, True):
            monkeypatch.setattr(_cuda, "_tf32_enabled", tf32)
            recorded = []
            for repeat in range(2):
                x, weight, bias, dy = draw(2, 3, IN), draw(OUT, IN), draw(OUT), draw(2, 3, OUT)
                calls.clear(), checked.clear()
                out = call(x, weight, bias, dy)
                assert len(checked) == 1 - repeat  # the repeat goes from its key to its ready form
                (_, entry, arguments), *bias_launch = calls
                addresses = [a.data.ptr for a in operands(x, weight, bias, dy, out)]
                # cuBLAS computes Cᵀ = Bᵀ·Aᵀ: its A is the product's second operand.
                assert [arguments[6], arguments[9], arguments[13]] == [addresses[1], addresses[0], addresses[2]]
                recorded.append((entry, [v for i, v in enumerate(arguments) if i not in (6, 9, 13)], out.shape,
                                 out.dtype, bias_launch))
            (entry, fixed, shape, dtype, first_bias), (entry_2, fixed_2, shape_2, dtype_2, second_bias) = recorded
            assert (entry, fixed, shape, dtype) == (entry_2, fixed_2, shape_2, dtype_2)
            if first_bias:
                (_, scalars, _), = first_bias
                (kind, packed_arguments, addresses), = second_bias
                assert kind == "packed" and tuple(packed_arguments[3:]) == tuple(scalars)
                assert addresses == (out.data.ptr, bias.data.ptr, out.data.ptr)
    assert len(linear._ready) == 6  # three directions under each TF32 setting
