"""The GEMM seam: every operand layout it accepts, accumulation, batching, dtypes, and its errors."""
import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import blas
from tests.helpers import assert_close


def operand(xp, rng, shape, transposed, dtype):
    """A (rows, cols) operand: a row-major array, or the transpose of one (a view, no copy)."""
    data = rng.standard_normal(shape[::-1] if transposed else shape)
    if np.dtype(dtype).kind == "c":
        data = data + 1j * rng.standard_normal(data.shape)
    array = xp.asarray(data.astype(dtype))
    return array.T if transposed else array


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_matches_float64_for_every_layout(xp, rng, dtype, a_t, b_t):
    a = operand(xp, rng, (5, 7), a_t, dtype)
    b = operand(xp, rng, (7, 3), b_t, dtype)
    expected = backend.to_device(a, "cpu").astype(np.complex128) @ backend.to_device(b, "cpu").astype(np.complex128)
    tolerance = dict(rtol=1e-5, atol=1e-5) if np.dtype(dtype) in (np.float32, np.complex64) else {}
    with backend.tf32(False):
        assert_close(blas.gemm(a, b), expected if np.dtype(dtype).kind == "c" else expected.real, **tolerance)


def test_gemm_alpha_beta_and_rows_of_a_larger_matrix(xp, rng):
    a, b = xp.asarray(rng.standard_normal((4, 6))), xp.asarray(rng.standard_normal((6, 5)))
    big = xp.asarray(rng.standard_normal((9, 5)))
    before = backend.to_device(big, "cpu").copy()
    blas.gemm(a, b, big[2:6], alpha=2.0, beta=1.0)  # rows 2..5 of a larger matrix, accumulated
    expected = before.copy()
    expected[2:6] += 2 * backend.to_device(a, "cpu") @ backend.to_device(b, "cpu")
    assert_close(big, expected)
    wide = xp.asarray(rng.standard_normal((4, 8)))
    blas.gemm(a, b, wide[:, 1:6])  # a column block: rows 8 apart
    assert_close(wide[:, 1:6], backend.to_device(a, "cpu") @ backend.to_device(b, "cpu"))


def test_gemm_batched_with_a_shared_matrix_and_strided_views(xp, rng):
    w = xp.asarray(rng.standard_normal((3, 4)))
    images = xp.asarray(rng.standard_normal((5, 2, 4, 6)))  # five images, take channel group 1
    out = xp.asarray(rng.standard_normal((5, 3, 6)))
    shared = xp.broadcast_to(w, (5, 3, 4))
    blas.gemm_batched(shared, images[:, 1], out)
    expected = np.einsum("kc,ncl->nkl", backend.to_device(w, "cpu"), backend.to_device(images, "cpu")[:, 1])
    assert_close(out, expected)
    blas.gemm_batched(shared, images[:, 1], out, beta=1.0)
    assert_close(out, 2 * expected)
    transposed = images[:, 0].transpose(0, 2, 1)  # (5, 6, 4), each matrix a transpose
    assert_close(blas.gemm_batched(transposed, xp.broadcast_to(w.T, (5, 4, 3))),
                 np.einsum("ncl,kc->nlk", backend.to_device(images, "cpu")[:, 0], backend.to_device(w, "cpu")))


def test_empty_products(xp):
    out = xp.ones((3, 2))
    blas.gemm(xp.ones((3, 0)), xp.ones((0, 2)), out)
    assert_close(out, np.zeros((3, 2)))


@pytest.mark.gpu
def test_tf32_changes_float32_products_only_when_allowed(rng):
    cupy = backend.cupy()
    a = cupy.asarray(rng.standard_normal((256, 256)).astype(np.float32))
    b = cupy.asarray(rng.standard_normal((256, 256)).astype(np.float32))
    exact = backend.to_device(a, "cpu").astype(np.float64) @ backend.to_device(b, "cpu").astype(np.float64)
    with backend.tf32(False):
        fp32 = backend.to_device(blas.gemm(a, b), "cpu")
    with backend.tf32(True):
        tf32 = backend.to_device(blas.gemm(a, b), "cpu")
    error = lambda got: np.linalg.norm(got - exact) / np.linalg.norm(exact)  # noqa: E731
    assert error(fp32) < 1e-6
    assert 1e-5 < error(tf32) < 3e-3  # 10-bit mantissas: visibly coarser, still close


@pytest.mark.parametrize("a, b, out, error, match", [
    (np.ones((2, 3)), np.ones((4, 2)), None, ValueError, "do not match"),
    (np.ones((2, 3), np.float32), np.ones((3, 2)), None, TypeError, "share one dtype"),
    (np.ones((2, 3), np.int64), np.ones((3, 2), np.int64), None, TypeError, "share one dtype"),
    (np.ones(3), np.ones((3, 2)), None, ValueError, "must be 2-D"),
    (np.ones((2, 3)), np.ones((3, 2)), np.ones((2, 2)).T, None, None),
])
def test_bad_operands_are_clear_errors(a, b, out, error, match):
    if error is None:
        blas.gemm(a, b, out)  # a transposed out is fine on the CPU (NumPy writes any view)
        return
    with pytest.raises(error, match=match):
        blas.gemm(a, b, out)
