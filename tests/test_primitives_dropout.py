"""Dropout and its counter-based generator: bit-exact hashes, the counter property, statistics, gradients."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from minidnn.primitives import dropout as dropout_module
from minidnn.primitives.dropout import _random_bits, dropout_backward, dropout_forward, uniform
from tests.helpers import assert_close, numerical_gradient, to_numpy

# ----------------------------------------------------------------------------------------------
# Independent reference: SplitMix64 on Python ints, stepped as Vigna's splitmix64.c steps it
# ----------------------------------------------------------------------------------------------
MASK64 = 2**64 - 1
GAMMA = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64(state: int, count: int) -> list[int]:
    """``count`` outputs of the stateful generator: state += GAMMA, then output mix64(state)."""
    outputs = []
    for _ in range(count):
        state = (state + GAMMA) & MASK64
        outputs.append(mix64(state))
    return outputs


def reference_bits(seed: int, offset: int, count: int) -> list[int]:
    """The documented stream: the generator seeded with mix64(seed), jumped ahead by ``offset`` steps."""
    return splitmix64((mix64(seed) + offset * GAMMA) & MASK64, count)


def reference_uniform(seed: int, offset: int, count: int) -> list[float]:
    return [(bits >> 40) / 2**24 for bits in reference_bits(seed, offset, count)]


def reference_dropout(x: np.ndarray, p: float, seed: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    keep = np.array([u >= p for u in reference_uniform(seed, offset, x.size)]).reshape(x.shape)
    return np.asarray(x, dtype=np.float64) * keep / (1.0 - p), keep


def random_seed(rng) -> int:
    return int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))  # the whole [0, 2^64)


# ----------------------------------------------------------------------------------------------
# The hash, bit for bit
# ----------------------------------------------------------------------------------------------
def test_reference_implementation_matches_published_splitmix64():
    # Rosetta Code "Pseudo-random numbers/Splitmix64", seed 1234567, and the first outputs for seed 0.
    assert splitmix64(1234567, 5) == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                      4593380528125082431, 16408922859458223821]
    assert splitmix64(0, 2) == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


# (seed, offset) -> the first four 64-bit hashes; the CUDA twin must reproduce these exactly.
KNOWN_HASHES = {
    (0, 0): [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC],  # mix64(0) = 0
    (42, 0): [0x989B3F130A063869, 0x290DB4BF2570DED7, 0x2A990BE63A01B2D5, 0x0C4B6B24EF01890E],
    (2024, 10): [0x354A93A4E2078B07, 0xB0E85B9EED017AF6, 0x58457970550E2271, 0x14D9657979FCB072],
    (2**64 - 1, 2**63 + 5): [0xDF2DC0C3B2FB3580, 0xFB27639923E39E8E, 0x23EF4636CA8186B4, 0xA378AC1213A98258],
}


@pytest.mark.parametrize("seed, offset", list(KNOWN_HASHES))
def test_hash_matches_hard_coded_values(xp, seed, offset):
    assert reference_bits(seed, offset, 4) == KNOWN_HASHES[(seed, offset)]
    bits = to_numpy(_random_bits(4, seed, offset, xp))
    assert bits.dtype == np.uint64
    assert [int(b) for b in bits] == KNOWN_HASHES[(seed, offset)]


def test_hash_matches_reference_for_random_seeds_and_offsets(xp, rng):
    for _ in range(3):
        seed, offset, count = random_seed(rng), int(rng.integers(0, 2**62)), int(rng.integers(1, 40))
        bits = to_numpy(_random_bits(count, seed, offset, xp))
        assert [int(b) for b in bits] == reference_bits(seed, offset, count)


def test_uniform_is_top_24_bits_in_float32(xp, rng):
    seed, offset = random_seed(rng), int(rng.integers(0, 2**40))
    u = to_numpy(uniform((3, 1, 5), seed, offset, xp))
    assert u.dtype == np.float32 and u.shape == (3, 1, 5)
    np.testing.assert_array_equal(u.ravel(), np.array(reference_uniform(seed, offset, 15), dtype=np.float32))
    assert 0.0 <= u.min() and u.max() < 1.0


def test_no_overflow_warnings_at_the_ends_of_the_ranges(xp):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        u = to_numpy(uniform(7, 2**64 - 1, 2**64 + 3, xp))  # the counter wraps modulo 2^64
        dropout_forward(xp.ones(7, dtype=xp.float32), 0.5, 2**64 - 1, 2**70)
    assert np.array_equal(u, np.array(reference_uniform(2**64 - 1, 3, 7), dtype=np.float32))


# ----------------------------------------------------------------------------------------------
# Counter-based determinism
# ----------------------------------------------------------------------------------------------
def test_same_seed_and_offset_give_the_same_mask(xp, rng):
    x = xp.asarray(rng.standard_normal((4, 3, 5)))
    seed, offset = random_seed(rng), int(rng.integers(0, 2**40))
    y1, mask1 = dropout_forward(x, 0.4, seed, offset)
    y2, mask2 = dropout_forward(x, 0.4, seed, offset)
    assert np.array_equal(to_numpy(mask1), to_numpy(mask2))
    assert np.array_equal(to_numpy(y1), to_numpy(y2))
    _, other_offset = dropout_forward(x, 0.4, seed, offset + 1)
    _, other_seed = dropout_forward(x, 0.4, seed ^ 1, offset)
    assert not np.array_equal(to_numpy(mask1), to_numpy(other_offset))
    assert not np.array_equal(to_numpy(mask1), to_numpy(other_seed))


def test_counter_property_a_later_offset_is_the_tail_of_a_longer_draw(xp, rng):
    seed, offset = random_seed(rng), int(rng.integers(0, 2**40))
    long = to_numpy(uniform(101, seed, offset, xp))
    for k in (1, 17, 60):
        tail = to_numpy(uniform((41 - k // 3,), seed, offset + k, xp))
        np.testing.assert_array_equal(tail, long[k:k + tail.size])
    # Two consecutive dropout calls (offset advanced by numel) cover the same counters as one call.
    x = xp.ones((2, 3, 7))
    _, whole = dropout_forward(x, 0.3, seed, offset)
    _, first = dropout_forward(x[:1], 0.3, seed, offset)
    _, second = dropout_forward(x[1:], 0.3, seed, offset + 21)
    assert np.array_equal(to_numpy(whole), np.concatenate([to_numpy(first), to_numpy(second)]))


# ----------------------------------------------------------------------------------------------
# Statistics (thresholds at about 5 standard deviations / a 1e-5 tail: fresh seeds never flake)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.5, 0.83])
def test_keep_fraction_is_one_minus_p(xp, rng, p):
    n = 200_003
    _, mask = dropout_forward(xp.ones(n, dtype=xp.float32), p, random_seed(rng), int(rng.integers(0, 2**40)))
    kept = int(to_numpy(mask).sum())
    assert abs(kept - n * (1 - p)) < 5 * math.sqrt(n * p * (1 - p))


def test_uniform_is_uniform_chi_square_on_10_bins(xp, rng):
    n = 100_000
    u = to_numpy(uniform(n, random_seed(rng), int(rng.integers(0, 2**40)), xp))
    counts = np.bincount(np.floor(u * 10).astype(np.int64), minlength=10)
    chi_square = float(((counts - n / 10) ** 2 / (n / 10)).sum())
    assert chi_square < 39.3  # chi-square with 9 degrees of freedom exceeds 39.3 with probability 1e-5


def test_mean_is_preserved_in_expectation(xp, rng):
    p, n = 0.3, 100_000
    x = rng.uniform(0.5, 1.5, n)
    y, _ = dropout_forward(xp.asarray(x), p, random_seed(rng), 0)
    # mean(y) − mean(x) = Σ x_i·(m_i/(1−p) − 1)/n has mean 0 and variance Σ x_i²·p/(1−p)/n².
    std = math.sqrt((x**2).sum() * p / (1 - p)) / n
    assert abs(float(to_numpy(y).mean()) - x.mean()) < 5 * std


# ----------------------------------------------------------------------------------------------
# Forward and backward against the reference
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 13), (3, 5, 7), (2, 3, 4, 5)])
@pytest.mark.parametrize("p", [0.25, 0.5, 0.9])
def test_forward_and_backward_match_reference(xp, rng, shape, p):
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    seed, offset = random_seed(rng), int(rng.integers(0, 2**40))
    y, mask = dropout_forward(xp.asarray(x), p, seed, offset)
    y_ref, mask_ref = reference_dropout(x, p, seed, offset)
    assert to_numpy(mask).dtype == bool
    np.testing.assert_array_equal(to_numpy(mask), mask_ref)
    assert_close(y, y_ref, name="y")
    assert_close(dropout_backward(xp.asarray(dy), mask, p), dy * mask_ref / (1 - p), name="dx")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("engine", ["minidnn", "naive"])
def test_half_dropout_is_the_float_product_rounded_once(xp, rng, name, engine):
    """Half x and dy (minidnn: dropout.cu's half build on the GPU; the CPU and the naive engine widen): the
    float32 call's mask, and y, dx the float32 products of the exact values rounded once to the half type by
    NumPy / ml_dtypes, bit for bit."""
    from minidnn import naive  # noqa: PLC0415
    from minidnn.primitives import convert  # noqa: PLC0415

    library = dropout_module if engine == "minidnn" else naive
    shape, p = (5, 67), 0.3
    h = convert.float_to_half(xp.asarray(rng.standard_normal(shape).astype(np.float32)), name)
    exact = to_numpy(convert.half_to_float(h, name))
    scale = np.float32(1 / (1 - p))
    y, mask = library.dropout_forward(h, p, 7, 11)
    _, float_mask = library.dropout_forward(convert.half_to_float(h, name), p, 7, 11)
    np.testing.assert_array_equal(to_numpy(mask), to_numpy(float_mask))
    kept = to_numpy(mask)
    storage = convert.storage_dtype(name, np)

    def rounded(values):  # float32 values to the half type by NumPy / ml_dtypes, as 16-bit words
        return values.astype(np.float16 if name == "float16" else convert.bfloat16()).view(np.uint16)

    assert y.dtype == h.dtype
    np.testing.assert_array_equal(to_numpy(y).view(np.uint16), rounded(exact * (kept * scale)))
    dy = convert.float_to_half(xp.asarray(rng.standard_normal(shape).astype(np.float32)), name)
    dx = library.dropout_backward(dy, mask, p)
    assert dx.dtype == dy.dtype and storage.itemsize == 2
    np.testing.assert_array_equal(to_numpy(dx).view(np.uint16),
                                  rounded(to_numpy(convert.half_to_float(dy, name)) * (kept * scale)))


def test_keep_decision_is_exact_at_the_threshold(xp):
    """u >= p exactly, with u = k·2^-24: p a hair above a grid value drops it; p on the grid keeps it."""
    seed, offset = 7, 3
    k = int(reference_bits(seed, offset, 1)[0] >> 40)
    on_grid = k / 2**24
    x = xp.ones(1)
    assert bool(to_numpy(dropout_forward(x, on_grid, seed, offset)[1])[0])
    assert not bool(to_numpy(dropout_forward(x, math.nextafter(on_grid, 1.0), seed, offset)[1])[0])


def test_backward_finite_differences(xp, rng):
    x, dy = rng.standard_normal((3, 2, 5)), rng.standard_normal((3, 2, 5))
    p, seed, offset = 0.35, random_seed(rng), 11

    def f(x_):
        return to_numpy(dropout_forward(xp.asarray(x_), p, seed, offset)[0])

    _, mask = dropout_forward(xp.asarray(x), p, seed, offset)
    assert_close(dropout_backward(xp.asarray(dy), mask, p), numerical_gradient(f, [x], 0, dy),
                 rtol=1e-7, atol=1e-9, name="dx")


def test_float32_against_float64_reference(xp, rng):
    x, dy = rng.standard_normal((5, 3, 7)).astype(np.float32), rng.standard_normal((5, 3, 7)).astype(np.float32)
    p, seed, offset = 0.3, random_seed(rng), 5
    y, mask = dropout_forward(xp.asarray(x), p, seed, offset)
    dx = dropout_backward(xp.asarray(dy), mask, p)
    y_ref, mask_ref = reference_dropout(x.astype(np.float64), p, seed, offset)
    assert to_numpy(y).dtype == np.float32 and to_numpy(dx).dtype == np.float32
    np.testing.assert_array_equal(to_numpy(mask), mask_ref)  # the mask does not depend on the dtype
    assert_close(y, y_ref, rtol=1e-6, atol=1e-7, name="y")
    assert_close(dx, dy.astype(np.float64) * mask_ref / (1 - p), rtol=1e-6, atol=1e-7, name="dx")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_p_zero_and_one(xp, rng, dtype):
    x = xp.asarray(rng.standard_normal((2, 9)).astype(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in particular no division by zero
        y, mask = dropout_forward(x, 0.0, 3, 0)
        assert y is not x and to_numpy(y).dtype == dtype
        np.testing.assert_array_equal(to_numpy(y), to_numpy(x))
        assert to_numpy(mask).all()
        y, mask = dropout_forward(x, 1.0, 3, 0)
        assert to_numpy(y).dtype == dtype and not to_numpy(y).any() and not to_numpy(mask).any()
        dx = dropout_backward(xp.ones_like(x), mask, 1.0)
        assert not to_numpy(dx).any()
        np.testing.assert_array_equal(to_numpy(dropout_backward(x, xp.ones(x.shape, dtype=bool), 0.0)), to_numpy(x))


def test_gpu_large_draw_matches_numpy_twin(xp, rng):
    """More elements than one pass of the GPU grid (132·32·256 threads): the grid-stride loop keeps
    the C-order counters, so the kernels reproduce the NumPy twin bit for bit."""
    if xp is np:
        pytest.skip("compares the GPU kernels with the NumPy twin")
    n, p = 1_100_003, 0.3
    seed, offset = random_seed(rng), int(rng.integers(0, 2**62))
    x, dy = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    y, mask = dropout_forward(xp.asarray(x), p, seed, offset)
    y_twin, mask_twin = dropout_forward(x, p, seed, offset)
    np.testing.assert_array_equal(to_numpy(mask), mask_twin)
    np.testing.assert_array_equal(to_numpy(y), y_twin)
    np.testing.assert_array_equal(to_numpy(dropout_backward(xp.asarray(dy), mask, p)),
                                  dropout_backward(dy, mask_twin, p))
    np.testing.assert_array_equal(to_numpy(uniform(n, seed, offset, xp)), uniform(n, seed, offset, np))
    np.testing.assert_array_equal(to_numpy(_random_bits(n, seed, offset, xp)), _random_bits(n, seed, offset, np))


def test_strided_input_uses_c_order_counters(xp, rng):
    x = rng.standard_normal((4, 6, 5)).transpose(2, 0, 1)  # (5, 4, 6), not contiguous
    y, mask = dropout_forward(xp.asarray(x), 0.4, 3, 9)
    y_ref, mask_ref = reference_dropout(x, 0.4, 3, 9)
    np.testing.assert_array_equal(to_numpy(mask), mask_ref)
    assert_close(y, y_ref, name="y")


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------
def test_argument_errors(xp):
    x = xp.ones((2, 3))
    for p in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"dropout: probability p must be in \[0, 1\]"):
            dropout_forward(x, p, 0)
    with pytest.raises(TypeError, match="p must be a real number"):
        dropout_forward(x, "0.5", 0)
    with pytest.raises(TypeError, match="x must be a float32, float64, float16 or bfloat16 array, got int64"):
        dropout_forward(xp.ones(3, dtype=xp.int64), 0.5, 0)
    with pytest.raises(TypeError, match="seed must be an int, got float 1.0"):
        dropout_forward(x, 0.5, 1.0)
    with pytest.raises(ValueError, match=r"seed must be >= 0, got -1"):
        dropout_forward(x, 0.5, -1)
    with pytest.raises(ValueError, match=r"seed must be <= 18446744073709551615"):
        uniform(3, 2**64, 0, xp)
    with pytest.raises(ValueError, match="offset must be >= 0, got -2"):
        dropout_forward(x, 0.5, 0, -2)
    with pytest.raises(TypeError, match="offset must be an int, got bool"):
        uniform(3, 0, True, xp)
    with pytest.raises(TypeError, match="shape must be an int or a tuple of ints"):
        uniform((2, 1.5), 0, 0, xp)
    with pytest.raises(ValueError, match="shape must have non-negative sizes"):
        uniform((2, -1), 0, 0, xp)
    with pytest.raises(TypeError, match="mask must be a bool array, got float64"):
        dropout_backward(x, xp.ones((2, 3)), 0.5)
    with pytest.raises(ValueError, match=r"mask must have dy's shape \(2, 3\), got \(3, 2\)"):
        dropout_backward(x, xp.ones((3, 2), dtype=bool), 0.5)
    with pytest.raises(ValueError, match=r"probability p must be in \[0, 1\]"):
        dropout_backward(x, xp.ones((2, 3), dtype=bool), 2.0)
