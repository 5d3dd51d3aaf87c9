"""float32 <-> bfloat16 / float16 conversion (minidnn/primitives/convert.py, convert.cu): bit for bit against
ml_dtypes (bfloat16) and NumPy (float16) on every rounding case, NaNs, infinities, subnormals and ties included;
exact on the way back; the GPU kernels against the same oracles and against PyTorch's bfloat16."""
import numpy as np
import pytest

from minidnn import backend, naive
from minidnn.primitives import convert

ENGINES = {"minidnn": convert, "naive": naive}

ml_dtypes = pytest.importorskip("ml_dtypes")


def float32_cases(rng, random_count=400_000):
    """float32 values as bit patterns: every bfloat16 word's neighbourhood (low halves 0, 1, just under,
    at and just over the tie, and all ones: for bfloat16 every rounding case of every word, ties to both
    parities included), every float16 tie and its neighbours across the normal and subnormal range, the
    edges of both types, and random bit patterns (NaN payloads of both signs among them)."""
    highs = np.arange(65536, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    around_bfloat16 = (highs[:, None] | lows[None, :]).ravel()
    # float16 keeps 13 fewer fraction bits than float32: the tie is bit 12 alone set below the kept bits.
    kept = np.arange(0, 1 << 19, dtype=np.uint32) << 13  # sign, exponent and 10 fraction bits of float32
    around_float16 = (kept[:, None] + np.array([0x0FFF, 0x1000, 0x1001], dtype=np.uint32)[None, :]).ravel()
    edges = np.array([65504.0, 65519.99, 65520.0, 65536.0, 2.0**-14, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001,
                      2.0**-26, 3.3895314e38, 3.4028235e38, 1.1754944e-38, 1e-45, np.inf, -np.inf, 0.0, -0.0,
                      np.nan, -np.nan], dtype=np.float32).view(np.uint32)
    random = rng.integers(0, 2**32, random_count, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([around_bfloat16, around_float16, edges, edges | 0x80000000, random])
    return bits.view(np.float32)


def bits_of(array):
    array = np.asarray(array)
    return array.view(np.uint16 if array.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_bfloat16_twin_rounds_as_ml_dtypes_bit_for_bit(rng, engine):
    x = float32_cases(rng)
    with np.errstate(invalid="ignore"):
        want = bits_of(x.astype(ml_dtypes.bfloat16))
    assert np.array_equal(convert.bfloat16_words(x), want)
    got = ENGINES[engine].float_to_half(x, "bfloat16")
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(bits_of(got), want)


@pytest.mark.parametrize("engine", ENGINES)
def test_float16_rounds_as_numpy_bit_for_bit(rng, engine):
    x = float32_cases(rng)
    with np.errstate(invalid="ignore", over="ignore"):
        want = bits_of(x.astype(np.float16))
    got = ENGINES[engine].float_to_half(x, np.float16)
    assert got.dtype == np.float16
    assert np.array_equal(bits_of(got), want)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", convert.HALF_TYPES)
def test_every_half_word_comes_back_exactly_and_rounds_to_itself(name, engine):
    words = np.arange(65536, dtype=np.uint16)
    half = words.view(convert.storage_dtype(name, np))
    back = ENGINES[engine].half_to_float(half, name)
    want = half.astype(np.float32)  # ml_dtypes' and NumPy's own widening: exact
    assert np.array_equal(bits_of(back), bits_of(want))
    not_nan = ~np.isnan(back)
    assert np.array_equal(bits_of(ENGINES[engine].float_to_half(back, name))[not_nan], words[not_nan])


def test_shapes_and_out_are_kept(rng):
    x = rng.standard_normal((3, 1, 5, 2)).astype(np.float32)[:, :, ::2]  # a strided view
    out = np.empty(x.shape, np.float16)
    assert convert.float_to_half(x, "float16", out=out) is out
    assert np.array_equal(out, x.astype(np.float16))
    back = convert.half_to_float(convert.float_to_half(x, "bfloat16"), "bfloat16")
    assert back.shape == x.shape and np.all(np.abs(back - x) <= np.abs(x) * 2.0**-8)


@pytest.mark.parametrize("call, error, match", [
    (lambda: convert.float_to_half(np.zeros(3), "bfloat16"), TypeError, "x must be a float32 array"),
    (lambda: convert.float_to_half(np.zeros(3, np.float32), "float32"), ValueError, "dtype must be one of"),
    (lambda: convert.float_to_half(np.zeros(3, np.float32), 7), ValueError, "dtype must be one of"),
    (lambda: convert.half_to_float(np.zeros(3, np.uint16), "bfloat16"), TypeError, "h must be a bfloat16 array"),
    (lambda: convert.float_to_half(np.zeros(3, np.float32), "float16", out=np.zeros(4, np.float16)), ValueError,
     "out must be a C-contiguous or channels-last float16 array of shape"),
])
def test_bad_arguments_are_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ----------------------------------------------------------------------------------------------
# The GPU kernels
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_the_gpu_kernels_round_as_ml_dtypes_numpy_and_pytorch(rng):
    cupy = backend.cupy()
    x = float32_cases(rng)
    with np.errstate(invalid="ignore", over="ignore"):
        want_bfloat16, want_float16 = bits_of(x.astype(ml_dtypes.bfloat16)), bits_of(x.astype(np.float16))
    x_gpu = cupy.asarray(x)
    bfloat16 = convert.float_to_half(x_gpu, "bfloat16")
    assert bfloat16.dtype == np.uint16
    assert np.array_equal(bfloat16.get(), want_bfloat16)
    float16 = convert.float_to_half(x_gpu, "float16")
    assert float16.dtype == np.float16
    assert np.array_equal(bits_of(float16.get()), want_float16)
    torch = pytest.importorskip("torch")
    finite = np.isfinite(x)  # PyTorch's NaN word is its own; every other value must agree
    from_torch = torch.from_numpy(x[finite]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bfloat16.get()[finite], from_torch)


@pytest.mark.gpu
def test_the_naive_engine_converts_on_the_gpu_as_the_kernels(rng):
    cupy = backend.cupy()
    x = cupy.asarray(float32_cases(rng, random_count=50_000))
    for name in convert.HALF_TYPES:
        kernels, plain = convert.float_to_half(x, name), naive.float_to_half(x, name)
        nan = cupy.isnan(x).get()  # CuPy's float16 conversion writes the GPU's own NaN
        assert np.array_equal(bits_of(plain.get())[~nan], bits_of(kernels.get())[~nan])
        widened = convert.half_to_float(kernels, name).get()
        nan = np.isnan(widened)
        assert np.array_equal(np.isnan(naive.half_to_float(kernels, name).get()), nan)
        assert np.array_equal(bits_of(naive.half_to_float(kernels, name).get())[~nan], bits_of(widened)[~nan])


@pytest.mark.gpu
@pytest.mark.parametrize("name", convert.HALF_TYPES)
def test_the_gpu_kernels_widen_every_half_word_exactly(name):
    cupy = backend.cupy()
    words = np.arange(65536, dtype=np.uint16)
    on_gpu = cupy.asarray(words).view(convert.storage_dtype(name, cupy))
    back = convert.half_to_float(on_gpu.reshape(256, 256), name)
    assert back.shape == (256, 256)
    want = words.view(convert.storage_dtype(name, np)).astype(np.float32)
    assert np.array_equal(bits_of(back.get().ravel()), bits_of(want))


@pytest.mark.gpu
def test_bfloat16_words_add_as_ml_dtypes_in_one_kernel(rng):
    """convert.add (a gradient's two parts, summed by autograd): float32 addition of the exact values, one
    rounding, bit for bit as ml_dtypes (NaNs as NaNs), on every special value and random words, in packs of
    eight words and one by one; and with shapes that broadcast, by the widening route."""
    from minidnn.primitives import _cuda  # noqa: PLC0415 - GPU only

    cupy = backend.cupy()
    x = float32_cases(rng, random_count=100_000)
    with np.errstate(invalid="ignore", over="ignore"):
        a = x.astype(ml_dtypes.bfloat16)
        b = rng.permutation(x).astype(ml_dtypes.bfloat16)
        want = (a.astype(np.float32) + b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    count = (a.size - 16) // 8 * 8 + 5  # a tail of single words after the packs
    for offset in (0, 1):  # 16-byte aligned (packs of eight words), then one word in (the plain build)
        on_gpu = [cupy.asarray(v.view(np.uint16))[offset:offset + count] for v in (a, b)]
        assert _cuda.elements_per_access(on_gpu) == (1 if offset else 8)
        got = convert.add(*on_gpu).get()
        expected = want[offset:offset + count]
        nan = np.isnan(expected.astype(np.float32))
        assert np.array_equal(np.isnan(got.view(ml_dtypes.bfloat16).astype(np.float32)), nan)
        assert np.array_equal(got[~nan], expected.view(np.uint16)[~nan])
    column = cupy.asarray(a[:7].reshape(7, 1).view(np.uint16))
    wide = convert.add(column, cupy.asarray(b[:21].reshape(3, 7).view(np.uint16)[:1]))  # (7, 1) + (1, 7)
    with np.errstate(invalid="ignore", over="ignore"):
        want_wide = (a[:7].reshape(7, 1).astype(np.float32) + b[:7].reshape(1, 7).astype(np.float32))
    assert wide.shape == (7, 7)
    finite = np.isfinite(want_wide)
    assert np.array_equal(wide.get()[finite], want_wide.astype(ml_dtypes.bfloat16).view(np.uint16)[finite])
