"""primitives._select: np.where through the values' bits, bit for bit np.where's result (signed zeros, NaN
payloads, infinities, subnormals), on fresh random masks and values of odd shapes, for each float width."""
import numpy as np
import pytest

from minidnn.primitives._select import select, where_or_zero

BITS = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}


def awkward_values(rng, shape, dtype):
    """Random values with every special case mixed in: ±0, ±inf, NaNs with payloads, subnormals."""
    values = rng.standard_normal(shape).astype(dtype)
    flat = values.reshape(-1)
    bits = BITS[dtype]
    info = np.finfo(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, info.smallest_subnormal, -info.smallest_subnormal],
                        dtype=dtype)
    flat[: specials.size] = specials
    nan = np.array([np.nan], dtype=dtype).view(bits)[0]
    flat[specials.size: specials.size + 2] = np.array([nan | 1, nan | 3], dtype=bits).view(dtype)  # payloads
    rng.shuffle(flat)
    return values


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_where_or_zero_is_np_where_bit_for_bit(rng, dtype):
    values = awkward_values(rng, (3, 5, 7, 11), dtype)
    mask = rng.random(values.shape) < 0.5
    got = where_or_zero(mask, values)
    want = np.where(mask, values, np.zeros((), dtype))
    assert got.dtype == dtype and got.shape == values.shape
    assert np.array_equal(got.view(BITS[dtype]), want.view(BITS[dtype]))
    assert got is not values and not np.shares_memory(got, values)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_select_is_np_where_bit_for_bit(rng, dtype):
    a, b = awkward_values(rng, (4, 9, 13), dtype), awkward_values(rng, (4, 9, 13), dtype)
    mask = rng.random(a.shape) < 0.4
    got = select(mask, a[:, ::-1], b[:, ::-1])  # non-contiguous operands too
    want = np.where(mask, a[:, ::-1], b[:, ::-1])
    assert np.array_equal(got.view(BITS[dtype]), want.view(BITS[dtype]))


def test_other_dtypes_and_broadcasts_take_np_where(rng):
    ints = rng.integers(-5, 5, (6, 7))
    mask = ints > 0
    assert np.array_equal(where_or_zero(mask, ints), np.where(mask, ints, 0))
    row = rng.standard_normal(7).astype(np.float32)  # mask of another shape: np.where broadcasts
    assert np.array_equal(where_or_zero(mask, row), np.where(mask, row, np.float32(0)))
