"""The GEMM seam: every operand layout it accepts, accumulation, batching, dtypes, and its errors."""
import numpy as np
import pytest

from minidnn import backend
from minidnn.primitives import _cuda, blas
from tests.helpers import (FLOAT32_UNIT, assert_close, assert_half_twins_agree, assert_within_half_bound, cuda_constants,
                           half_operand, to_numpy)


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
    with _cuda.tf32(False):
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
    with _cuda.tf32(False):
        fp32 = backend.to_device(blas.gemm(a, b), "cpu")
    with _cuda.tf32(True):
        tf32 = backend.to_device(blas.gemm(a, b), "cpu")
    error = lambda got: np.linalg.norm(got - exact) / np.linalg.norm(exact)  # noqa: E731
    assert error(fp32) < 1e-6
    assert 1e-5 < error(tf32) < 3e-3  # 10-bit mantissas: visibly coarser, still close


@pytest.mark.gpu
def test_gemm_batched_can_keep_float32_when_tf32_is_on_and_use_tf32_when_off(rng):
    cupy = backend.cupy()
    a = cupy.asarray(rng.standard_normal((3, 128, 256)).astype(np.float32))
    b = cupy.asarray(rng.standard_normal((3, 256, 96)).astype(np.float32))
    exact = backend.to_device(a, "cpu").astype(np.float64) @ backend.to_device(b, "cpu").astype(np.float64)
    error = lambda got: np.linalg.norm(backend.to_device(got, "cpu") - exact) / np.linalg.norm(exact)  # noqa: E731
    with _cuda.tf32(True):
        assert error(blas.gemm_batched(a, b, tf32=False)) < 1e-6
        assert 1e-5 < error(blas.gemm_batched(a, b)) < 3e-3
    with _cuda.tf32(False):
        assert 1e-5 < error(blas.gemm_batched(a, b, tf32=True)) < 3e-3
        assert error(blas.gemm_batched(a, b)) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 3])
def test_the_ctypes_bindings_give_the_cython_ones_bits(monkeypatch, rng, batch):
    """Both ways of calling cuBLAS (CuPy's Cython bindings, ctypes where a CuPy lacks them) run the same
    GEMM: the same bits, and the float64 product."""
    cupy = backend.cupy()
    a, b = (cupy.asarray(rng.standard_normal((batch, *shape)).astype(np.float32)) for shape in ((37, 19), (19, 23)))
    results = []
    for cython in (True, False):
        monkeypatch.setattr(blas, "_cublas", lambda cython=cython: blas._Cublas(cupy, cython))
        with _cuda.tf32(False):
            results.append((blas.gemm_batched(a, b) if batch > 1 else blas.gemm(a[0], b[0])).get())
    assert np.array_equal(results[0], results[1])
    want = a.get().astype(np.float64) @ b.get().astype(np.float64)
    assert_close(results[0], want if batch > 1 else want[0], rtol=1e-5, atol=1e-5)
    ctypes_only = blas._Cublas(cupy, cython=False)
    assert all(getattr(f, "__name__", "") == "call" for f in ctypes_only.eager.values())


@pytest.mark.gpu
def test_a_gemm_captured_into_a_graph_replays_the_product(rng):
    """CuPy's Cython cuBLAS bindings refuse a call during stream capture: a captured GEMM must go through the
    capturable ones, and its replays must compute the product of whatever the inputs then hold."""
    cupy = backend.cupy()
    a, b = (cupy.asarray(rng.standard_normal(shape).astype(np.float32)) for shape in ((29, 13), (13, 11)))
    out = cupy.empty((29, 11), dtype=np.float32)
    blas.prepare_capture()
    stream = cupy.cuda.Stream(non_blocking=True)
    with _cuda.tf32(False), stream:
        stream.begin_capture()
        blas.gemm(a, b, out)
        graph = stream.end_capture()
    a[...] = cupy.asarray(rng.standard_normal((29, 13)).astype(np.float32))
    cupy.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    assert_close(out.get(), a.get().astype(np.float64) @ b.get().astype(np.float64), rtol=1e-5, atol=1e-5)


def test_gemm_batched_tf32_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match="tf32 must be None, True or False"):
        blas.gemm_batched(np.ones((1, 2, 2)), np.ones((1, 2, 2)), tf32="off")


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


# ----------------------------------------------------------------------------------------------
# gemm_batched_split_k: partial products over ranges of the reduction (split_k_gemm.cu on the GPU)
# ----------------------------------------------------------------------------------------------
def reduction_contiguous(xp, rng, batch, rows, reduction, columns, dtype):
    """a (batch, rows, L) row-major and b (batch, L, columns) as transposes of row-major (columns, L)
    matrices: the layout Winograd's transforms write."""
    a = xp.asarray(rng.standard_normal((batch, rows, reduction)).astype(dtype))
    b = xp.asarray(rng.standard_normal((batch, columns, reduction)).astype(dtype)).transpose(0, 2, 1)
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, columns, reduction, splits", [
    (131, 50, 77, 3),   # a row tile and a column tile past the edge, a short last range
    (7, 97, 300, 7),    # several column tiles, ranges of 48
    (129, 5, 33, 5),    # 33 in ranges of 16: the last two splits get nothing and must be written as zeros
    (64, 48, 16, 1),    # one exact tile, one step
    (131, 50, 64, 3),   # rows 64 values long: the 16-byte copies (split_k_gemm_aligned), tiles past both edges
])
def test_split_k_partials_sum_to_the_float64_product(xp, rng, dtype, rows, columns, reduction, splits):
    a, b = reduction_contiguous(xp, rng, 3, rows, reduction, columns, dtype)
    out = xp.asarray(rng.standard_normal((splits, 3, rows, columns)).astype(dtype))  # garbage to overwrite
    blas.gemm_batched_split_k(a, b, out)
    a64, b64 = to_numpy(a).astype(np.float64), to_numpy(b).astype(np.float64)
    per = blas.split_length(reduction, splits)
    assert per % 16 == 0 and per * splits >= reduction
    for split in range(splits):  # each partial is its own range's product, exactly that range
        reduction_range = slice(split * per, (split + 1) * per)
        want = a64[:, :, reduction_range] @ b64[:, reduction_range, :]
        tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else {}
        assert_close(out[split], want, **tolerance, name=f"split {split}")
    # beta = 1 adds a second product (another chunk of a batch) onto the partials
    before = to_numpy(out).astype(np.float64)
    blas.gemm_batched_split_k(a, b, out, beta=1.0)
    assert_close(out, 2 * before, **(dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else {}))


def test_split_k_with_one_shared_matrix_and_rows_of_a_larger_array(xp, rng):
    a, b = reduction_contiguous(xp, rng, 1, 9, 40, 6, np.float64)
    tiles = xp.asarray(rng.standard_normal((2, 4, 6, 41)))  # b's matrices: (6, 40) views of a wider array
    b = tiles[1, :, :, :40].transpose(0, 2, 1)
    shared = xp.broadcast_to(a[0], (4, 9, 40))
    out = xp.zeros((2, 4, 9, 6))
    blas.gemm_batched_split_k(shared, b, out)
    want = to_numpy(a[0]) @ to_numpy(b)
    assert_close(out.sum(axis=0), want)


@pytest.mark.parametrize("change, error, match", [
    (dict(out_shape=(4, 9, 6)), ValueError, "4-D"),
    (dict(a_transposed=True), ValueError, "row-major matrices and b transposes"),
    (dict(beta=0.5), ValueError, "beta must be 0 or 1"),
    (dict(dtype=np.complex64), TypeError, "float32 or float64"),
])
def test_split_k_bad_operands_are_clear_errors(xp, change, error, match):
    dtype = change.get("dtype", np.float64)
    a = xp.ones((4, 40, 9), dtype=dtype).transpose(0, 2, 1) if change.get("a_transposed") else \
        xp.ones((4, 9, 40), dtype=dtype)
    b = xp.ones((4, 6, 40), dtype=dtype).transpose(0, 2, 1)
    out = xp.zeros(change.get("out_shape", (2, 4, 9, 6)), dtype=dtype)
    if change.get("a_transposed") and xp is np:
        pytest.skip("NumPy multiplies any layout; only the kernel needs reduction-contiguous operands")
    with pytest.raises(error, match=match):
        blas.gemm_batched_split_k(a, b, out, beta=change.get("beta", 0.0))


def test_split_length_rounds_to_whole_kernel_steps():
    assert blas.split_length(6272, 8) == 784
    assert blas.split_length(637, 8) == 80
    assert blas.split_length(33, 5) == 16
    assert blas.split_length(5, 1) == 16
    with pytest.raises(ValueError, match="splits must be at least 1"):
        blas.split_length(10, 0)


def test_split_k_tile_grid():
    assert blas.split_k_tile_grid(128, 48, np.float32) == (1, 1)  # CaffeNet conv2's products: one tile each
    assert blas.split_k_tile_grid(131, 50, np.float32) == (2, 2)
    assert blas.split_k_tile_grid(131, 50, np.float64) == (2, 3)  # 64-row tiles for double
    assert blas.split_k_tiles(64, 64, np.float32) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_k_launch_constants_are_the_kernels_tiles(dtype):
    """blas.py sizes split_k_gemm.cu's grid and reduction ranges with the kernel's tiles."""
    kernel = cuda_constants("split_k_gemm.cu", dtype)
    assert (blas.SPLIT_K_THREADS, blas.SPLIT_K_TILE_M[np.dtype(dtype)], blas.SPLIT_K_TILE_N) == \
        (kernel["THREADS"], kernel["TILE_M"], kernel["TILE_N"])
    assert blas.SPLIT_K_STEP % kernel["TILE_K"] == 0  # each split's range is a whole number of the kernel's steps


# ----------------------------------------------------------------------------------------------
# Half precision: float32 products and sums, one rounding (the bound of tests/test_conv_half.py)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_half_gemm_within_its_error_bound_for_every_layout(xp, rng, name, a_t, b_t):
    (a, a_exact), (b, b_exact) = half_operand(xp, rng, (37, 129), name, transposed=a_t), half_operand(xp, rng, (129, 45), name, transposed=b_t)
    out = blas.gemm(a, b)
    assert out.dtype == a.dtype and out.shape == (37, 45)
    assert_within_half_bound(out, a_exact @ b_exact, np.abs(a_exact) @ np.abs(b_exact), name, 129)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_gemm_alpha_beta_into_rows_of_a_larger_matrix_and_batched(xp, rng, name):
    (a, a_exact), (b, b_exact) = half_operand(xp, rng, (4, 70), name), half_operand(xp, rng, (70, 5), name)
    big, big_exact = half_operand(xp, rng, (9, 5), name)
    blas.gemm(a, b, big[2:6], alpha=0.5, beta=1.0)
    expected, magnitude = big_exact.copy(), np.abs(big_exact)
    expected[2:6] += 0.5 * a_exact @ b_exact
    magnitude[2:6] += 0.5 * np.abs(a_exact) @ np.abs(b_exact)
    assert_within_half_bound(big, expected, magnitude, name, 71)
    (w, w_exact), (x, x_exact) = half_operand(xp, rng, (3, 70), name), half_operand(xp, rng, (6, 70, 8), name)
    out = blas.gemm_batched(xp.broadcast_to(w, (6, 3, 70)), x)
    assert_within_half_bound(out, np.einsum("kc,ncl->nkl", w_exact, x_exact),
                             np.einsum("kc,ncl->nkl", np.abs(w_exact), np.abs(x_exact)), name, 70)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_gemm_on_cublas_and_its_numpy_twin_agree_to_a_rounding(rng, name):
    cupy = backend.cupy()
    (a, a_exact), (b, b_exact) = half_operand(np, rng, (300, 520), name), half_operand(np, rng, (520, 130), name)
    words = [cupy.asarray(m.view(np.uint16) if name == "bfloat16" else m) for m in (a, b)]
    sums_apart = 2 * 520 * FLOAT32_UNIT * (np.abs(a_exact) @ np.abs(b_exact))
    assert_half_twins_agree(blas.gemm(*words), blas.gemm(a, b), name, sums_apart)


def test_uint16_is_bfloat16_only_on_the_gpu():
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        blas.gemm(np.zeros((2, 3), np.uint16), np.zeros((3, 2), np.uint16))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("batched", [False, True])
def test_half_operands_with_a_float32_out_are_not_rounded(xp, rng, name, batched):
    """Half a and b, float32 out: the float32 sums themselves (within float32's summation error of the exact
    products, far inside one half rounding), with beta accumulating in float32."""
    shape_a, shape_b = ((3, 9, 37), (3, 37, 5)) if batched else ((9, 37), (37, 5))
    a, a_exact = half_operand(xp, rng, shape_a, name)
    b, b_exact = half_operand(xp, rng, shape_b, name)
    start = rng.standard_normal(shape_a[:-1] + shape_b[-1:]).astype(np.float32)
    out = xp.asarray(start.copy())
    (blas.gemm_batched if batched else blas.gemm)(a, b, out, beta=1.0)
    exact = a_exact @ b_exact + start
    bound = 38 * 2.0 ** -24 * (np.abs(a_exact) @ np.abs(b_exact) + np.abs(start))
    assert out.dtype == np.float32
    assert np.all(np.abs(to_numpy(out) - exact) <= bound)
    with pytest.raises(TypeError, match="half operands with a float32 out"):
        (blas.gemm_batched if batched else blas.gemm)(a, b, xp.zeros(out.shape, dtype=np.float64))
