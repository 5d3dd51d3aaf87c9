"""The per-sample generators of a whole batch at once: what ``np.random.default_rng((seed, epoch, i))``
gives for each index i of a batch, computed on arrays of indices instead of one generator at a time.

Each sample's augmentation draws from its own generator (see :mod:`minidnn.data.dataset`), and making
one is NumPy's SeedSequence hash and PCG64's seeding, in Python-held time, for every sample: for a
batch that costs more than the batch transform it feeds, all of it holding the GIL in the loader's
thread, which competes with the training loop's own Python dispatch (a captured GPU step leaves the
host little time). Here the same generators are evaluated on NumPy arrays, all the batch's samples at
once (benchmarks/results/2026-12-02-cpu-input-pipeline/ times both ways), and they are the same
numbers, bit for bit:

* ``SeedSequence(entropy)``: the entropy words (each int as little-endian uint32 words, 0 as one
  word) are hashed into a pool of four uint32 (``mix_entropy``), and the pool into the state words
  (``generate_state``), with NumPy's constants;
* ``PCG64(seed_sequence)``: 128-bit state and increment from those words, the LCG stepped as
  ``pcg_setseq_128_srandom_r`` does, each output the XSL-RR of the stepped state;
* ``Generator.integers(0, high)`` for high <= 2^32: Lemire's multiply-shift on a 32-bit output
  (PCG64 hands out the low half of a 64-bit output, then the buffered high half), and
  ``Generator.random()``: the top 53 bits of a 64-bit output times 2^-53.

A sample for which a bounded draw falls into Lemire's rejection zone (probability high / 2^32 per
draw, so about one in 10^8 for a crop offset), whose index does not fit 32 bits, or whose draws
this module was not built for is drawn by NumPy itself, so the result is exact in every case. NumPy
guarantees the streams of SeedSequence and PCG64 across versions, not those of Generator's methods:
the first batch drawn in each process is also drawn by NumPy and compared, and a mismatch (a NumPy
that changed ``integers``) switches to NumPy's per-sample generators for good, with a warning.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

_U32, _U64 = np.uint32, np.uint64
_MASK32 = 0xFFFFFFFF
# SeedSequence's constants (numpy/random/bit_generator.pyx).
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL_SIZE = 4
# PCG64's multiplier (PCG_DEFAULT_MULTIPLIER_128), high and low halves.
_MULTIPLIER = (_U64(2549297995355413924), _U64(4865540595714422341))

_checked = False    # whether this process compared a batch with NumPy's own generators
_agrees = True      # what the comparison found

Call = tuple  # ("integers", high) or ("random",): one draw made on every sample's generator, in order


def draw(seed: int, epoch: int, indices: Any, calls: Sequence[Call]) -> list[np.ndarray]:
    """For each call, in order, its result on every sample's generator ``default_rng((seed, epoch, i))``.

    indices: (N,) sample indices. calls: ``("integers", high)`` (``integers(0, high)``, an int64 per
    sample, 1 <= high <= 2^32) or ``("random",)`` (a float64 in [0, 1) per sample). Returns one (N,)
    array per call.
    """
    global _checked, _agrees
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    for call in calls:
        if not (call == ("random",) or (len(call) == 2 and call[0] == "integers" and 1 <= call[1] <= 2**32)):
            raise ValueError(f"a draw must be ('integers', high) with 1 <= high <= 2**32 or ('random',), got {call!r}")
    if not _agrees or seed < 0 or epoch < 0 or indices.size == 0:  # NumPy raises on negative entropy itself
        return _numpy_draws(seed, epoch, indices, calls)
    results, exact = _vector_draws(seed, epoch, indices, calls)
    redo = np.flatnonzero(~exact)
    if redo.size:
        for result, value in zip(results, _numpy_draws(seed, epoch, indices[redo], calls)):
            result[redo] = value
    if not _checked:
        _checked = True
        sample = slice(0, min(indices.size, 4))
        expected = _numpy_draws(seed, epoch, indices[sample], calls)
        if not all(np.array_equal(r[sample], e) for r, e in zip(results, expected)):
            _agrees = False
            warnings.warn(f"this NumPy ({np.__version__}) draws differently from the batched per-sample generators "
                          "of minidnn.data.sample_random; drawing sample by sample from now on", RuntimeWarning,
                          stacklevel=2)
            return _numpy_draws(seed, epoch, indices, calls)
    return results


def _numpy_draws(seed: int, epoch: int, indices: np.ndarray, calls: Sequence[Call]) -> list[np.ndarray]:
    """The definition: one NumPy generator per sample."""
    results = [np.empty(indices.size, np.int64 if call[0] == "integers" else np.float64) for call in calls]
    for position, index in enumerate(indices.tolist()):
        generator = np.random.default_rng((seed, epoch, index))
        for result, call in zip(results, calls):
            result[position] = generator.integers(0, call[1]) if call[0] == "integers" else generator.random()
    return results


def _vector_draws(seed: int, epoch: int, indices: np.ndarray, calls: Sequence[Call]) -> tuple[list[np.ndarray],
                                                                                              np.ndarray]:
    """The draws on arrays, and which samples they are exact for (the others: index over 32 bits, rejection)."""
    exact = (indices >= 0) & (indices <= _MASK32)
    with np.errstate(over="ignore"):  # every operation is modulo 2^32 or 2^64 on purpose
        pool = _seed_sequence_pool(_words(seed) + _words(epoch), indices.astype(_U64) & _U64(_MASK32))
        words = _generate_state(pool, 8)
        state = [(words[2 * k + 1].astype(_U64) << _U64(32)) | words[2 * k].astype(_U64) for k in range(4)]
        generator = _PCG64(state)
        results = []
        for call in calls:
            if call[0] == "random":
                results.append((generator.next64() >> _U64(11)).astype(np.float64) * (1.0 / 9007199254740992.0))
                continue
            values, rejected = generator.bounded(call[1])
            results.append(values)
            exact &= ~rejected
    return results, exact


def _words(value: int) -> list[int]:
    """An int as SeedSequence sees it: little-endian uint32 words, 0 as one word."""
    value, words = int(value), []
    while True:
        words.append(value & _MASK32)
        value >>= 32
        if not value:
            return words


def _constants(start: int, multiplier: int, count: int) -> tuple[np.ndarray, int]:
    """The ``count`` successive values of a SeedSequence hash constant from ``start`` (as a column), and the next."""
    values = []
    for _ in range(count):
        values.append(start)
        start = (start * multiplier) & _MASK32
    return np.array(values, _U32)[:, None], start


def _hashmix(values: np.ndarray, constants: np.ndarray, multiplier: int) -> np.ndarray:
    """SeedSequence's hashmix of each row of ``values`` with its row's hash constant."""
    values = values ^ constants
    values = values * (constants * _U32(multiplier))
    return values ^ (values >> _U32(16))


def _seed_sequence_pool(prefix: list[int], last: np.ndarray) -> np.ndarray:
    """SeedSequence's mix_entropy for entropy ``prefix + [last[k]]``, per sample k: its pool, (4, N) uint32.

    The hash constant advances with every hashmix, the same way for every sample, so a group of
    hashmixes in a row is one operation on a 2-D array with a column of constants."""
    entropy = np.zeros((max(len(prefix) + 1, _POOL_SIZE), last.size), _U32)
    entropy[:len(prefix)] = np.array(prefix, _U32)[:, None]
    entropy[len(prefix)] = last
    constants, constant = _constants(_INIT_A, _MULT_A, _POOL_SIZE)
    pool = _hashmix(entropy[:_POOL_SIZE], constants, _MULT_A)

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = _U32(_MIX_MULT_L) * x - _U32(_MIX_MULT_R) * y
        return result ^ (result >> _U32(16))

    for source in range(_POOL_SIZE):  # each source word into the other three, in order
        targets = [target for target in range(_POOL_SIZE) if target != source]
        constants, constant = _constants(constant, _MULT_A, len(targets))
        pool[targets] = mix(pool[targets], _hashmix(pool[source][None], constants, _MULT_A))
    for source in range(_POOL_SIZE, len(prefix) + 1):  # entropy beyond the pool's four words
        constants, constant = _constants(constant, _MULT_A, _POOL_SIZE)
        pool = mix(pool, _hashmix(entropy[source][None], constants, _MULT_A))
    return pool


def _generate_state(pool: np.ndarray, count: int) -> np.ndarray:
    """SeedSequence.generate_state: ``count`` uint32 words per sample, (count, N)."""
    constants, _ = _constants(_INIT_B, _MULT_B, count)
    return _hashmix(pool[np.arange(count) % _POOL_SIZE], constants, _MULT_B)


def _multiply_wide(a: np.ndarray, b: Any) -> tuple[np.ndarray, np.ndarray]:
    """The 128-bit product of two uint64 arrays, as (high, low) halves."""
    low32 = _U64(_MASK32)
    a0, a1, b0, b1 = a & low32, a >> _U64(32), b & low32, b >> _U64(32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    middle = (p00 >> _U64(32)) + (p01 & low32) + (p10 & low32)
    return p11 + (p01 >> _U64(32)) + (p10 >> _U64(32)) + (middle >> _U64(32)), (p00 & low32) | (middle << _U64(32))


class _PCG64:
    """PCG64 (XSL-RR 128/64) on arrays of generators, seeded as NumPy seeds it; 128-bit numbers as (high, low)."""

    def __init__(self, words: list[np.ndarray]) -> None:
        state_high, state_low, increment_high, increment_low = words
        self.increment = ((increment_high << _U64(1)) | (increment_low >> _U64(63)), (increment_low << _U64(1)) | _U64(1))
        self.state = self._add(self.increment, (state_high, state_low))  # the first step from state 0 gives inc
        self._step()
        self.buffered: np.ndarray | None = None  # the high half of the last output, for the next 32-bit draw

    @staticmethod
    def _add(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
        low = a[1] + b[1]
        return a[0] + b[0] + (low < a[1]).astype(_U64), low

    def _step(self) -> None:
        high, low = _multiply_wide(self.state[1], _MULTIPLIER[1])
        high = high + self.state[0] * _MULTIPLIER[1] + self.state[1] * _MULTIPLIER[0]
        self.state = self._add((high, low), self.increment)

    def next64(self) -> np.ndarray:
        self._step()
        high, low = self.state
        value, rotation = high ^ low, high >> _U64(58)
        return (value >> rotation) | (value << ((_U64(64) - rotation) & _U64(63)))

    def next32(self) -> np.ndarray:
        if self.buffered is not None:
            value, self.buffered = self.buffered, None
            return value
        value = self.next64()
        self.buffered = value >> _U64(32)
        return value & _U64(_MASK32)

    def bounded(self, high: int) -> tuple[np.ndarray, np.ndarray]:
        """``integers(0, high)`` per generator (int64), and where Lemire's method would have drawn again."""
        if high == 1:  # NumPy draws nothing for a range of one value
            return np.zeros(self.state[0].shape, np.int64), np.zeros(self.state[0].shape, bool)
        if high == 2**32:  # the whole 32-bit range: the raw value
            return self.next32().astype(np.int64), np.zeros(self.state[0].shape, bool)
        product = self.next32() * _U64(high)
        threshold = (2**32 - high) % high
        return (product >> _U64(32)).astype(np.int64), (product & _U64(_MASK32)) < _U64(threshold)
