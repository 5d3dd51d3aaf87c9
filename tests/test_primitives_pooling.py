"""Pooling primitives against float64 loop references written here, finite differences and (optionally) PyTorch.

The references loop over output pixels and window taps in plain Python and never call the code
under test; they define PyTorch's semantics independently: windows are counted one by one, padding
is skipped (so it can never be the maximum), and divisors are counted tap by tap.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import assert_close, numerical_gradient, to_numpy
from minidnn.primitives import pooling

F32 = dict(rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# References (float64, loops)
# ----------------------------------------------------------------------------------------------
def as_pair(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def ref_output_size(size, kernel, stride, padding, dilation, ceil_mode):
    """Count windows one by one, in padded coordinates.

    Floor mode keeps the windows that fit in the padded input. Ceil mode also keeps a window that
    overhangs the padded end by less than one stride, as long as it starts before the input ends.
    """
    span, padded_size, count = dilation * (kernel - 1) + 1, size + 2 * padding, 0
    while True:
        start = count * stride
        end = start + span
        keep = end - padded_size < stride and start < size + padding if ceil_mode else end <= padded_size
        if not keep:
            return count
        count += 1


def ref_geometry(x_shape, kernel, stride, padding, dilation, ceil_mode):
    kernel, padding, dilation = as_pair(kernel), as_pair(padding), as_pair(dilation)
    stride = kernel if stride is None else as_pair(stride)
    out = tuple(ref_output_size(x_shape[2 + a], kernel[a], stride[a], padding[a], dilation[a], ceil_mode)
                for a in (0, 1))
    return kernel, stride, padding, dilation, out


def ref_max_pool(x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False):
    """(y, indices): the first strictly greater input pixel of each window wins; padding is skipped."""
    N, C, H, W = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (P, Q) = ref_geometry(x.shape, kernel, stride, padding, dilation,
                                                                   ceil_mode)
    y = np.empty((N, C, P, Q))
    indices = np.empty((N, C, P, Q), dtype=np.int64)
    for n, c, p, q in np.ndindex(N, C, P, Q):
        best, where = -np.inf, None
        for r in range(kh):
            for s in range(kw):
                h, w = p * sh - ph + r * dh, q * sw - pw + s * dw
                if 0 <= h < H and 0 <= w < W and (where is None or x[n, c, h, w] > best):
                    best, where = x[n, c, h, w], h * W + w
        y[n, c, p, q], indices[n, c, p, q] = best, where
    return y, indices


def ref_max_pool_backward(dy, indices, x_shape):
    N, C, H, W = x_shape
    dx = np.zeros(x_shape)
    for n, c, p, q in np.ndindex(*dy.shape):
        h, w = divmod(int(indices[n, c, p, q]), W)
        dx[n, c, h, w] += dy[n, c, p, q]
    return dx


def ref_avg_windows(x_shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Yield (p, q, [(h, w) input pixels], divisor) for every output pixel."""
    N, C, H, W = x_shape
    (kh, kw), (sh, sw), (ph, pw), _, (P, Q) = ref_geometry(x_shape, kernel, stride, padding, 1, ceil_mode)
    for p in range(P):
        for q in range(Q):
            pixels, in_padded_input = [], 0
            for r in range(kh):
                for s in range(kw):
                    h, w = p * sh - ph + r, q * sw - pw + s
                    if -ph <= h < H + ph and -pw <= w < W + pw:
                        in_padded_input += 1
                    if 0 <= h < H and 0 <= w < W:
                        pixels.append((h, w))
            if divisor_override is not None:
                divisor = divisor_override
            else:
                divisor = in_padded_input if count_include_pad else len(pixels)
            yield p, q, pixels, divisor


def ref_avg_pool(x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    N, C = x.shape[:2]
    *_, (P, Q) = ref_geometry(x.shape, kernel, stride, padding, 1, ceil_mode)
    y = np.zeros((N, C, P, Q))
    for p, q, pixels, divisor in ref_avg_windows(x.shape, kernel, stride, padding, ceil_mode, count_include_pad,
                                                 divisor_override):
        for h, w in pixels:
            y[:, :, p, q] += x[:, :, h, w]
        y[:, :, p, q] /= divisor
    return y


def ref_avg_pool_backward(dy, x_shape, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                          divisor_override=None):
    dx = np.zeros(x_shape)
    for p, q, pixels, divisor in ref_avg_windows(x_shape, kernel, stride, padding, ceil_mode, count_include_pad,
                                                 divisor_override):
        for h, w in pixels:
            dx[:, :, h, w] += dy[:, :, p, q] / divisor
    return dx


def ref_adaptive_windows(size, out):
    return [(math.floor(i * size / out), math.ceil((i + 1) * size / out)) for i in range(out)]


def ref_adaptive_output(x_shape, output_size):
    P, Q = as_pair(output_size)
    return (x_shape[2] if P is None else P, x_shape[3] if Q is None else Q)


def ref_adaptive_pool(x, output_size):
    P, Q = ref_adaptive_output(x.shape, output_size)
    y = np.empty(x.shape[:2] + (P, Q))
    for p, (h0, h1) in enumerate(ref_adaptive_windows(x.shape[2], P)):
        for q, (w0, w1) in enumerate(ref_adaptive_windows(x.shape[3], Q)):
            y[:, :, p, q] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return y


def ref_adaptive_pool_backward(dy, x_shape):
    P, Q = dy.shape[2:]
    dx = np.zeros(x_shape)
    for p, (h0, h1) in enumerate(ref_adaptive_windows(x_shape[2], P)):
        for q, (w0, w1) in enumerate(ref_adaptive_windows(x_shape[3], Q)):
            dx[:, :, h0:h1, w0:w1] += dy[:, :, p, q][:, :, None, None] / ((h1 - h0) * (w1 - w0))
    return dx


# ----------------------------------------------------------------------------------------------
# Cases: (kernel, stride, padding, dilation, ceil_mode, x_shape)
# ----------------------------------------------------------------------------------------------
MAX_CASES = [
    (1, None, 0, 1, False, (1, 2, 5, 4)),
    (2, None, 0, 1, False, (2, 3, 7, 6)),                  # floor mode drops the last row
    (2, None, 0, 1, True, (2, 3, 7, 5)),                   # ceil mode: windows overhang the input
    (3, 2, 1, 1, False, (1, 2, 9, 7)),
    (3, 2, 1, 1, True, (2, 1, 8, 7)),
    ((3, 2), (2, 1), (1, 1), 1, True, (1, 3, 7, 5)),
    (3, 1, 1, 2, False, (2, 2, 7, 8)),                     # dilation
    ((2, 3), (3, 2), (1, 0), (2, 1), True, (1, 2, 9, 6)),
    (4, 3, 2, 1, True, (2, 2, 9, 7)),                      # padding 2
    (4, (1, 3), (2, 1), (1, 2), False, (1, 1, 6, 11)),
    (2, 3, 1, 1, True, (1, 2, 5, 8)),                      # ceil mode drops a window starting in the padding
    (3, 1, 1, 1, False, (2, 3, 6, 7)),                     # three candidate outputs per axis (the GPU's largest fixed grid)
    (4, 1, 2, 1, False, (1, 2, 6, 9)),                     # four: the GPU's loop on runtime bounds
]
AVG_CASES = [
    (1, None, 0, False, True, None, (1, 2, 5, 4)),
    (2, None, 0, False, True, None, (2, 3, 7, 6)),
    (2, None, 0, True, True, None, (2, 3, 7, 5)),          # overhang not counted in the divisor
    (3, 2, 1, False, True, None, (1, 2, 9, 7)),            # padding counted
    (3, 2, 1, False, False, None, (1, 2, 9, 7)),           # padding not counted
    (3, 2, 1, True, True, None, (2, 1, 8, 7)),
    (3, 2, 1, True, False, None, (2, 1, 8, 7)),
    ((3, 2), (2, 1), (1, 1), True, False, None, (1, 3, 7, 5)),
    (4, 3, 2, True, True, None, (2, 2, 9, 7)),
    (4, (1, 3), (2, 1), False, False, None, (1, 1, 6, 11)),
    (2, 3, 1, True, True, None, (1, 2, 5, 8)),
    (3, 2, 1, True, True, 4, (1, 2, 7, 6)),                # divisor_override
    ((2, 3), 1, (1, 0), False, False, 5, (2, 1, 5, 6)),
]
ADAPTIVE_CASES = [
    ((1, 2, 7, 7), 3),             # 7 -> 3: windows of unequal size that overlap
    ((2, 3, 5, 9), (2, 4)),
    ((1, 2, 6, 8), (3, 4)),        # sizes that divide: plain non-overlapping windows
    ((2, 1, 5, 7), 1),             # global average
    ((1, 2, 7, 5), (None, 3)),     # None keeps the input height
    ((1, 1, 3, 4), (5, 6)),        # output larger than input: windows repeat
]


def draw(rng, shape):
    return rng.standard_normal(shape)


def random_max_case(rng):
    kernel = tuple(int(k) for k in rng.integers(1, 5, 2))
    stride = tuple(int(s) for s in rng.integers(1, 4, 2))
    padding = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
    dilation = tuple(int(d) for d in rng.integers(1, 3, 2))
    ceil_mode = bool(rng.integers(2))
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(4, 10)), int(rng.integers(4, 10)))
    return kernel, stride, padding, dilation, ceil_mode, shape


def random_avg_case(rng):
    kernel, stride, padding, _, ceil_mode, shape = random_max_case(rng)
    return kernel, stride, padding, ceil_mode, bool(rng.integers(2)), [None, None, 3, -2][rng.integers(4)], shape


def fits(case_geometry, shape):
    """Whether every window holds an input pixel and the output is non-empty (the reference's view)."""
    kernel, stride, padding, dilation, (P, Q) = case_geometry
    if min(P, Q) < 1:
        return False
    for a, (size, out) in enumerate(zip(shape[2:], (P, Q))):
        for i in range(out):
            taps = [i * stride[a] - padding[a] + t * dilation[a] for t in range(kernel[a])]
            if not any(0 <= tap < size for tap in taps):
                return False
    return True


# ----------------------------------------------------------------------------------------------
# Output size
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, expected", [
    ((5, 2, 2, 0, 1, False), 2), ((5, 2, 2, 0, 1, True), 3), ((5, 2, 3, 1, 1, True), 2), ((5, 2, 3, 1, 1, False), 2),
    ((6, 3, 2, 1, 1, True), 4), ((7, 3, 2, 1, 2, True), 3), ((3, 4, 2, 0, 1, True), 1), ((224, 3, 2, 1, 1, False), 112),
    ((112, 3, 2, 0, 1, True), 56), ((1, 1, 1, 0, 1, True), 1), ((2, 5, 1, 0, 1, False), -2),
])
def test_pool_output_size_known_values(args, expected):
    # Values read from torch.nn.functional.max_pool2d output shapes.
    assert pooling.pool_output_size(*args) == expected


def test_pool_output_size_matches_window_count():
    for size in range(1, 12):
        for kernel in range(1, 5):
            for stride in range(1, 4):
                for dilation in (1, 2):
                    for padding in range(kernel // 2 + 1):
                        for ceil_mode in (False, True):
                            args = (size, kernel, stride, padding, dilation, ceil_mode)
                            got = pooling.pool_output_size(*args)
                            assert max(got, 0) == ref_output_size(*args), args


# ----------------------------------------------------------------------------------------------
# Max pooling
# ----------------------------------------------------------------------------------------------
def taps_to_positions(taps, kernel, stride, padding, dilation, shape):
    """The compact uint8 record r·kernel_w + c as flat positions h·W + w (written here, for the test)."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    sh, sw = (kh, kw) if stride is None else ((stride, stride) if isinstance(stride, int) else stride)
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    positions = np.empty(taps.shape, dtype=np.int64)
    for p in range(taps.shape[2]):
        for q in range(taps.shape[3]):
            r, c = np.divmod(taps[:, :, p, q].astype(np.int64), kw)
            positions[:, :, p, q] = (p * sh - ph + r * dh) * shape[3] + (q * sw - pw + c * dw)
    return positions


def check_max_pool(xp, rng, kernel, stride, padding, dilation, ceil_mode, shape):
    x = draw(rng, shape)
    y, indices = pooling.max_pool2d_forward(xp.asarray(x), kernel, stride, padding, dilation, ceil_mode,
                                            return_indices=True)
    y_ref, indices_ref = ref_max_pool(x, kernel, stride, padding, dilation, ceil_mode)
    assert_close(y, y_ref, name="y")
    assert to_numpy(indices).dtype == np.int64
    np.testing.assert_array_equal(to_numpy(indices), indices_ref)
    dy = draw(rng, y_ref.shape)
    dx_ref = ref_max_pool_backward(dy, indices_ref, shape)
    dx = pooling.max_pool2d_backward(xp.asarray(dy), indices, shape)
    assert_close(dx, dx_ref, name="dx")
    # Given the window parameters, the GPU gathers per input pixel instead (same result).
    dx = pooling.max_pool2d_backward(xp.asarray(dy), indices, shape, kernel, stride, padding, dilation, ceil_mode)
    assert_close(dx, dx_ref, name="dx with window parameters")
    # Without return_indices: the compact record of winning taps, the same maxima, the same gradient.
    y_compact, taps = pooling.max_pool2d_forward(xp.asarray(x), kernel, stride, padding, dilation, ceil_mode)
    assert_close(y_compact, y_ref, name="y (compact record)")
    assert to_numpy(taps).dtype == np.uint8
    np.testing.assert_array_equal(taps_to_positions(to_numpy(taps), kernel, stride, padding, dilation, shape),
                                  indices_ref)
    dx = pooling.max_pool2d_backward(xp.asarray(dy), taps, shape, kernel, stride, padding, dilation, ceil_mode)
    assert_close(dx, dx_ref, name="dx from taps")


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, shape", MAX_CASES)
def test_max_pool2d_matches_reference(xp, rng, kernel, stride, padding, dilation, ceil_mode, shape):
    check_max_pool(xp, rng, kernel, stride, padding, dilation, ceil_mode, shape)


def test_max_pool2d_random_cases_match_reference(xp, rng):
    checked = 0
    while checked < 12:
        kernel, stride, padding, dilation, ceil_mode, shape = random_max_case(rng)
        if fits(ref_geometry(shape, kernel, stride, padding, dilation, ceil_mode), shape):
            check_max_pool(xp, rng, kernel, stride, padding, dilation, ceil_mode, shape)
            checked += 1


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, shape",
                         [(3, 2, 1, 1, False, (3, 5, 11, 9)), (3, 1, 1, 2, True, (2, 7, 6, 37)),
                          ((2, 3), (3, 2), (1, 0), (2, 1), False, (4, 3, 40, 9))])
def test_max_pool2d_threads_loop_over_the_planes(poisoned, rng, monkeypatch, kernel, stride, padding, dilation,
                                                 ceil_mode, shape):
    """The GPU's max-pool backward kernels give a thread one position of a plane and loop over the planes from
    blockIdx.y: with a single row of blocks (max_blocks 1, as when N·C outnumbers what fills the GPU) each
    thread covers every plane; a plane of more positions than a block's threads spans several blocks (the
    forward kernels' grid-stride loops then run in one block). Every element written (empty arrays poisoned)
    and right."""
    if poisoned is np:
        pytest.skip("the GPU's launch")
    from minidnn.primitives import _cuda  # noqa: PLC0415

    monkeypatch.setattr(_cuda, "max_blocks", lambda: 1)
    check_max_pool(poisoned, rng, kernel, stride, padding, dilation, ceil_mode, shape)


def test_max_pool_backward_grid_fills_the_gpu_with_rows_of_planes(monkeypatch):
    """The plane loop's launch rule (pooling._launch_by_planes), with a stand-in launch: blocks of a warp or more
    threads, up to 256, over a plane's positions (an (n, c)'s H·W; channels-last, an image's H·W·C and the
    kernel of that layout); as many rows of blocks as fill max_blocks, no more than there are planes (N·C; N),
    at most 65535; nothing launched for no planes."""
    from minidnn.primitives import _cuda  # noqa: PLC0415

    launched = []

    def kernel(grid, block, args, shared_mem=0):  # the stand-in kernel; _cuda.launch_blocks is the real one
        launched.append((grid, block[0]))

    def element_function(source, name, half, dtype):
        launched.append(name)
        return kernel

    monkeypatch.setattr(_cuda, "element_function", element_function)
    monkeypatch.setattr(_cuda, "max_blocks", lambda: 4224)  # 32 blocks on each of the H200's 132 SMs

    def launch(x_shape, channels_last=False):  # only the shape struct is read, and the first array's dtype
        pooling._launch_by_planes("max_pool_backward_taps", (np.empty(0, np.float32),),
                                  pooling._pool_shape(x_shape, (1, 1)), channels_last)

    for positions, planes in [(112 * 112, 128 * 64), (7 * 7, 10), (1, 10**6), (5 * 5, 0)]:
        launch((planes, 1, 1, positions))
    assert launched == ["max_pool_backward_taps", ((49, 87), 256), "max_pool_backward_taps", ((1, 10), 64),
                        "max_pool_backward_taps", ((1, 4224), 32), "max_pool_backward_taps"]
    launch((128, 64, 112, 112), channels_last=True)
    assert launched[-2:] == ["max_pool_backward_taps_last", ((3136, 2), 256)]
    monkeypatch.setattr(_cuda, "max_blocks", lambda: 10**6)
    launch((10**6, 1, 1, 1))
    assert launched[-1] == ((1, _cuda.MAX_GRID_Y), 32)


def test_max_pool2d_empty_batch(xp):
    """A batch of no images pools to no images, forward and back (the GPU launches nothing)."""
    y, taps = pooling.max_pool2d_forward(xp.zeros((0, 2, 5, 5), dtype=np.float32), 3, 2, 1)
    assert y.shape == taps.shape == (0, 2, 3, 3)
    dx = pooling.max_pool2d_backward(xp.zeros(y.shape, dtype=np.float32), taps, (0, 2, 5, 5), 3, 2, 1)
    assert dx.shape == (0, 2, 5, 5) and dx.dtype == np.float32


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, shape", MAX_CASES[3::2])
def test_max_pool2d_float32(xp, rng, kernel, stride, padding, dilation, ceil_mode, shape):
    x = draw(rng, shape).astype(np.float32)
    y, indices = pooling.max_pool2d_forward(xp.asarray(x), kernel, stride, padding, dilation, ceil_mode,
                                            return_indices=True)
    y_ref, indices_ref = ref_max_pool(x.astype(np.float64), kernel, stride, padding, dilation, ceil_mode)
    assert y.dtype == np.float32
    assert_close(y, y_ref, **F32, name="y")
    np.testing.assert_array_equal(to_numpy(indices), indices_ref)
    dy = draw(rng, y_ref.shape).astype(np.float32)
    dx_ref = ref_max_pool_backward(dy.astype(np.float64), indices_ref, shape)
    dx = pooling.max_pool2d_backward(xp.asarray(dy), indices, shape)
    assert dx.dtype == np.float32
    assert_close(dx, dx_ref, **F32, name="dx")
    dx = pooling.max_pool2d_backward(xp.asarray(dy), indices, shape, kernel, stride, padding, dilation, ceil_mode)
    assert dx.dtype == np.float32
    assert_close(dx, dx_ref, **F32, name="dx with window parameters")


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, shape", [
    (3, 2, 1, 1, True, (1, 2, 5, 4)),       # overlapping windows: gradients add
    ((2, 3), 1, (1, 1), (2, 1), False, (2, 1, 4, 5)),
    (2, None, 0, 1, True, (1, 1, 5, 3)),
])
def test_max_pool2d_backward_finite_differences(xp, rng, kernel, stride, padding, dilation, ceil_mode, shape):
    x = draw(rng, shape)  # random floats: no ties, so the max is differentiable
    y, indices = pooling.max_pool2d_forward(xp.asarray(x), kernel, stride, padding, dilation, ceil_mode,
                                            return_indices=True)
    dy = draw(rng, y.shape)
    expected = numerical_gradient(
        lambda a: pooling.max_pool2d_forward(a, kernel, stride, padding, dilation, ceil_mode)[0], [x], 0, dy)
    assert_close(pooling.max_pool2d_backward(xp.asarray(dy), indices, shape), expected, rtol=1e-6, atol=1e-8)
    assert_close(pooling.max_pool2d_backward(xp.asarray(dy), indices, shape, kernel, stride, padding, dilation,
                                             ceil_mode), expected, rtol=1e-6, atol=1e-8)


def test_max_pool2d_ties_choose_first_maximum(xp, rng):
    x = rng.integers(0, 3, (2, 3, 7, 6)).astype(np.float64)  # many ties
    for args in [(3, 1, 1, 1, False), ((2, 3), (1, 2), (1, 1), (2, 1), True)]:
        y, indices = pooling.max_pool2d_forward(xp.asarray(x), *args, return_indices=True)
        y_ref, indices_ref = ref_max_pool(x, *args)
        assert_close(y, y_ref)
        np.testing.assert_array_equal(to_numpy(indices), indices_ref)


def test_max_pool2d_padding_is_never_chosen(xp, rng):
    x = -1e30 - draw(rng, (1, 2, 5, 4)) ** 2  # all far below the zero a zero padding would give
    y, indices = pooling.max_pool2d_forward(xp.asarray(x), 3, 2, 1, 1, True, return_indices=True)
    y_ref, indices_ref = ref_max_pool(x, 3, 2, 1, 1, True)
    assert_close(y, y_ref)
    np.testing.assert_array_equal(to_numpy(indices), indices_ref)
    # Windows of only −inf pixels point at their first input pixel (PyTorch's kernels do so).
    y, indices = pooling.max_pool2d_forward(xp.asarray(np.full((1, 1, 3, 3), -np.inf)), 2, 1, 1, return_indices=True)
    assert np.all(to_numpy(y) == -np.inf)
    np.testing.assert_array_equal(to_numpy(indices)[0, 0], [[0, 0, 1, 2], [0, 0, 1, 2], [3, 3, 4, 5], [6, 6, 7, 8]])


def test_max_pool2d_nan_propagates(xp):
    x = np.array([[[[1.0, np.nan, np.nan, 2.0], [0.0, 1.0, 2.0, 3.0]]]])
    y, indices = pooling.max_pool2d_forward(xp.asarray(x), (1, 4), return_indices=True)
    assert np.isnan(to_numpy(y)[0, 0, 0, 0]) and to_numpy(y)[0, 0, 1, 0] == 3.0
    np.testing.assert_array_equal(to_numpy(indices)[0, 0, :, 0], [2, 7])  # the last NaN, as PyTorch


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("engine", ["minidnn", "naive"])
@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, shape", MAX_CASES[3:])
def test_half_max_pool2d_is_the_float_layer_on_the_exact_values_rounded_once(xp, rng, name, engine, kernel, stride,
                                                                            padding, dilation, ceil_mode, shape):
    """Half x and dy (minidnn: pooling.cu's half build on the GPU; the naive engine widens): y is the maximum
    of the exact values (the float64 reference, exactly), dx the float64 reference's sums rounded once, bit
    for bit; from int64 positions (with and without the window) and from uint8 taps; ties and NaNs in x."""
    from minidnn import naive  # noqa: PLC0415
    from minidnn.primitives import convert  # noqa: PLC0415

    library = pooling if engine == "minidnn" else naive
    x = draw(rng, shape).astype(np.float32)
    flat = x.reshape(-1)  # a view
    flat[1::4] = flat[0::4][:flat[1::4].size]  # ties: the first in window order must win
    flat[5] = np.nan
    h = convert.float_to_half(xp.asarray(x), name)
    exact = to_numpy(convert.half_to_float(h, name)).astype(np.float64)
    window = (kernel, stride, padding, dilation, ceil_mode)
    y, positions = library.max_pool2d_forward(h, *window, return_indices=True)
    y_ref, positions_ref = ref_max_pool(np.nan_to_num(exact, nan=np.inf), *window)  # a NaN wins as +inf would
    assert y.dtype == h.dtype
    widened = to_numpy(convert.half_to_float(y, name)).astype(np.float64)
    nan = np.isinf(y_ref) & (y_ref > 0)
    assert np.array_equal(np.isnan(widened), nan) and np.array_equal(widened[~nan], y_ref[~nan])
    np.testing.assert_array_equal(to_numpy(positions), positions_ref)
    dy = convert.float_to_half(xp.asarray(draw(rng, y_ref.shape).astype(np.float32)), name)
    dy_exact = to_numpy(convert.half_to_float(dy, name)).astype(np.float64)
    want = convert.float_to_half(ref_max_pool_backward(dy_exact, to_numpy(positions), shape).astype(np.float32), name)
    _, taps = library.max_pool2d_forward(h, *window)
    for label, dx in (("positions", library.max_pool2d_backward(dy, positions, shape)),
                      ("positions and window", library.max_pool2d_backward(dy, positions, shape, *window)),
                      ("taps", library.max_pool2d_backward(dy, taps, shape, *window))):
        assert dx.dtype == h.dtype, label
        np.testing.assert_array_equal(to_numpy(dx).view(np.uint16), to_numpy(want).view(np.uint16), err_msg=label)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("engine", ["minidnn", "naive"])
@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, shape", [MAX_CASES[4], *MAX_CASES[10:]])
def test_max_pool2d_backward_of_two_parts_is_the_backward_of_their_rounded_sum(xp, rng, dtype, engine, kernel,
                                                                               stride, padding, dilation, ceil_mode,
                                                                               shape):
    """max_pool2d_backward(dy, ..., dy_other=): dy + dy_other rounded to the dtype (the float64 sum of two
    float32 or half values is exact, so rounding it is the correctly rounded sum), then the float64 reference's
    gathers; in a half type rounded once more, bit for bit (a sum kept in float32 would differ). From int64
    positions, with and without the window, and (minidnn's) from uint8 taps; on the GPU with the window, minidnn's
    *_sum kernels for the float types (the half types' parts are summed first)."""
    from minidnn import naive  # noqa: PLC0415
    from minidnn.primitives import convert  # noqa: PLC0415

    library = pooling if engine == "minidnn" else naive
    half = dtype in ("float16", "bfloat16")
    window = (kernel, stride, padding, dilation, ceil_mode)

    def stored(values):  # float values -> an array of dtype, and its exact values in float64
        array = convert.float_to_half(xp.asarray(values.astype(np.float32)), dtype) if half \
            else xp.asarray(values.astype(dtype))
        return array, to_numpy(convert.half_to_float(array, dtype) if half else array).astype(np.float64)

    x = draw(rng, shape)  # no ties
    _, positions = ref_max_pool(x, *window)
    _, taps = pooling.max_pool2d_forward(xp.asarray(x), *window)
    # parts of different sizes, so that their float32 sums round in a half type
    (dy, dy_exact), (dy_other, other_exact) = stored(draw(rng, positions.shape)), \
        stored(draw(rng, positions.shape) * 37.25)
    part_sum = dy_exact + other_exact
    if half:
        part_sum = to_numpy(convert.half_to_float(convert.float_to_half(xp.asarray(part_sum.astype(np.float32)),
                                                                        dtype), dtype)).astype(np.float64)
        want = to_numpy(convert.float_to_half(
            xp.asarray(ref_max_pool_backward(part_sum, positions, shape).astype(np.float32)), dtype))
    else:
        want = ref_max_pool_backward(part_sum.astype(dtype).astype(np.float64), positions, shape)
    records = [("positions", xp.asarray(positions), ()), ("positions and window", xp.asarray(positions), window)]
    for label, indices, arguments in records + ([("taps", taps, window)] if engine == "minidnn" else []):
        dx = library.max_pool2d_backward(dy, indices, shape, *arguments, dy_other=dy_other)
        assert dx.dtype == dy.dtype, label
        if half:
            np.testing.assert_array_equal(to_numpy(dx).view(np.uint16), want.view(np.uint16), err_msg=label)
        else:
            assert_close(dx, want, **(F32 if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)), name=label)


@pytest.mark.gpu
def test_the_gpu_gathers_two_float_parts_and_sums_half_ones_first(rng, monkeypatch):
    """On the GPU with the window: float32 parts go to the gather of two parts (pooling.cu's *_sum kernels), half
    ones are summed first (convert.add, a packed kernel) and gathered as one gradient, which was faster for them; in
    either layout."""
    from minidnn import backend  # noqa: PLC0415
    from minidnn.primitives import convert, layout  # noqa: PLC0415

    cupy = backend.cupy()
    launched = []
    original = pooling._launch_by_planes
    monkeypatch.setattr(pooling, "_launch_by_planes",
                        lambda name, *args: (launched.append(name), original(name, *args))[1])
    for dtype in ("float32", "bfloat16", "float16"):
        for channels_last in (False, True):
            values = cupy.asarray(draw(rng, (2, 3, 9, 7)).astype(np.float32))
            x = values.astype(dtype) if dtype != "bfloat16" else convert.float_to_half(values, dtype)
            x = layout.to_channels_last(x) if channels_last else x
            y, taps = pooling.max_pool2d_forward(x, 3, 2, 1)
            pooling.max_pool2d_backward(y, taps, x.shape, 3, 2, 1, dy_other=y)
    assert launched == ["max_pool_backward_taps_sum"] * 2 + ["max_pool_backward_taps"] * 4


def test_max_pool2d_backward_of_two_parts_errors_name_the_argument(xp):
    from minidnn import naive  # noqa: PLC0415

    y, taps = pooling.max_pool2d_forward(xp.zeros((1, 2, 5, 4)), 2)
    dy = xp.ones(y.shape)
    for library in (pooling, naive):
        with pytest.raises(TypeError, match="dy_other and grad_output must have the same dtype, got float32 and "
                                            "float64"):
            library.max_pool2d_backward(dy, taps, (1, 2, 5, 4), 2, dy_other=dy.astype(np.float32))
        with pytest.raises(ValueError, match=r"dy_other must have grad_output's shape \(1, 2, 2, 2\), got \(2, 2\)"):
            library.max_pool2d_backward(dy, taps, (1, 2, 5, 4), 2, dy_other=dy[0, 0])
        with pytest.raises(TypeError, match="dy_other must be a float32, float64, float16 or bfloat16 array"):
            library.max_pool2d_backward(dy, taps, (1, 2, 5, 4), 2, dy_other=dy.astype(np.int32))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("engine", ["minidnn", "naive"])
@pytest.mark.parametrize("operation", ["avg", "avg_padded_ceil", "adaptive"])
def test_half_average_pooling_is_the_float_layer_rounded_once(xp, rng, name, engine, operation):
    """Half x and dy (minidnn: pooling.cu's half build on the GPU; the CPU and the naive engine widen): y and
    dx within one rounding of the float64 reference on the exact values (plus the float32 sums' error), and
    bit for bit the float32 call on the widened arrays rounded once."""
    from minidnn import naive  # noqa: PLC0415
    from minidnn.primitives import convert  # noqa: PLC0415
    from tests.helpers import assert_within_half_bound  # noqa: PLC0415

    library = pooling if engine == "minidnn" else naive
    shape = (2, 3, 7, 9)
    if operation == "adaptive":
        args, window = ((3, 4),), 9  # the output size; the backward reads it from dy
        forward, backward = library.adaptive_avg_pool2d_forward, library.adaptive_avg_pool2d_backward
        reference, reference_backward = ref_adaptive_pool, ref_adaptive_pool_backward
    else:
        args = (3, 2, 0, False, True, None) if operation == "avg" else ((3, 2), (2, 1), (1, 1), True, False, None)
        window = 6
        forward, backward = library.avg_pool2d_forward, library.avg_pool2d_backward
        reference, reference_backward = ref_avg_pool, ref_avg_pool_backward
    h = convert.float_to_half(xp.asarray(draw(rng, shape).astype(np.float32)), name)
    exact = to_numpy(convert.half_to_float(h, name)).astype(np.float64)
    y = forward(h, *args)
    assert y.dtype == h.dtype
    y_exact = reference(exact, *args)
    assert_within_half_bound(y, y_exact, reference(np.abs(exact), *args), name, window, "y")
    widened = forward(convert.half_to_float(h, name), *args)
    np.testing.assert_array_equal(to_numpy(y).view(np.uint16), to_numpy(convert.float_to_half(widened, name)).view(np.uint16))

    dy = convert.float_to_half(xp.asarray(draw(rng, y_exact.shape).astype(np.float32)), name)
    dy_exact = to_numpy(convert.half_to_float(dy, name)).astype(np.float64)
    backward_args = () if operation == "adaptive" else args
    dx = backward(dy, shape, *backward_args)
    assert dx.dtype == dy.dtype
    assert_within_half_bound(dx, reference_backward(dy_exact, shape, *backward_args),
                             reference_backward(np.abs(dy_exact), shape, *backward_args), name, window, "dx")
    widened = backward(convert.half_to_float(dy, name), shape, *backward_args)
    np.testing.assert_array_equal(to_numpy(dx).view(np.uint16), to_numpy(convert.float_to_half(widened, name)).view(np.uint16))


# ----------------------------------------------------------------------------------------------
# Average pooling
# ----------------------------------------------------------------------------------------------
def check_avg_pool(xp, rng, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape):
    args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    x = draw(rng, shape)
    y = pooling.avg_pool2d_forward(xp.asarray(x), *args)
    y_ref = ref_avg_pool(x, *args)
    assert_close(y, y_ref, name="y")
    dy = draw(rng, y_ref.shape)
    assert_close(pooling.avg_pool2d_backward(xp.asarray(dy), shape, *args), ref_avg_pool_backward(dy, shape, *args),
                 name="dx")


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape", AVG_CASES)
def test_avg_pool2d_matches_reference(xp, rng, kernel, stride, padding, ceil_mode, count_include_pad,
                                      divisor_override, shape):
    check_avg_pool(xp, rng, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape)


def test_avg_pool2d_random_cases_match_reference(xp, rng):
    checked = 0
    while checked < 12:
        kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape = random_avg_case(rng)
        if fits(ref_geometry(shape, kernel, stride, padding, 1, ceil_mode), shape):
            check_avg_pool(xp, rng, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape)
            checked += 1


def test_avg_pool2d_divisors():
    # 1x6 row, kernel 1x3, stride 2, padding 1, ceil mode: windows [-1, 2), [1, 4), [3, 6), [5, 8).
    # The last holds x[5], the right padding (6) and an overhang (7): its divisor is 2 counting
    # the padding but not the overhang, 1 counting input pixels only. (Values checked with PyTorch.)
    x = np.arange(1.0, 7.0).reshape(1, 1, 1, 6)
    assert_close(pooling.avg_pool2d_forward(x, (1, 3), 2, (0, 1), True, True), [[[[3 / 3, 9 / 3, 15 / 3, 6 / 2]]]])
    assert_close(pooling.avg_pool2d_forward(x, (1, 3), 2, (0, 1), True, False), [[[[3 / 2, 9 / 3, 15 / 3, 6 / 1]]]])
    assert_close(pooling.avg_pool2d_forward(x, (1, 3), 2, (0, 1), True, False, 7), [[[[3 / 7, 9 / 7, 15 / 7, 6 / 7]]]])


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape",
                         AVG_CASES[3::2])
def test_avg_pool2d_float32(xp, rng, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                            shape):
    args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    x = draw(rng, shape).astype(np.float32)
    y = pooling.avg_pool2d_forward(xp.asarray(x), *args)
    assert y.dtype == np.float32
    assert_close(y, ref_avg_pool(x.astype(np.float64), *args), **F32, name="y")
    dy = draw(rng, y.shape).astype(np.float32)
    dx = pooling.avg_pool2d_backward(xp.asarray(dy), shape, *args)
    assert dx.dtype == np.float32
    assert_close(dx, ref_avg_pool_backward(dy.astype(np.float64), shape, *args), **F32, name="dx")


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, shape", [
    (3, 2, 1, True, True, None, (1, 2, 5, 4)),
    ((2, 3), 1, (1, 1), False, False, None, (2, 1, 4, 5)),
    (2, None, 0, True, False, 3, (1, 1, 5, 3)),
])
def test_avg_pool2d_backward_finite_differences(xp, rng, kernel, stride, padding, ceil_mode, count_include_pad,
                                                divisor_override, shape):
    args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    x = draw(rng, shape)
    dy = draw(rng, pooling.avg_pool2d_forward(x, *args).shape)
    expected = numerical_gradient(lambda a: pooling.avg_pool2d_forward(a, *args), [x], 0, dy)
    assert_close(pooling.avg_pool2d_backward(xp.asarray(dy), shape, *args), expected, rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------------------------
# Adaptive average pooling
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, output_size", ADAPTIVE_CASES)
def test_adaptive_avg_pool2d_matches_reference(xp, rng, shape, output_size):
    x = draw(rng, shape)
    y = pooling.adaptive_avg_pool2d_forward(xp.asarray(x), output_size)
    y_ref = ref_adaptive_pool(x, output_size)
    assert_close(y, y_ref, name="y")
    dy = draw(rng, y_ref.shape)
    assert_close(pooling.adaptive_avg_pool2d_backward(xp.asarray(dy), shape), ref_adaptive_pool_backward(dy, shape),
                 name="dx")


@pytest.mark.parametrize("shape, output_size", ADAPTIVE_CASES[:3])
def test_adaptive_avg_pool2d_float32(xp, rng, shape, output_size):
    x = draw(rng, shape).astype(np.float32)
    y = pooling.adaptive_avg_pool2d_forward(xp.asarray(x), output_size)
    assert y.dtype == np.float32
    assert_close(y, ref_adaptive_pool(x.astype(np.float64), output_size), **F32, name="y")
    dy = draw(rng, y.shape).astype(np.float32)
    dx = pooling.adaptive_avg_pool2d_backward(xp.asarray(dy), shape)
    assert dx.dtype == np.float32
    assert_close(dx, ref_adaptive_pool_backward(dy.astype(np.float64), shape), **F32, name="dx")


def test_adaptive_avg_pool2d_windows():
    # 7 -> 3: [0, 3), [2, 5), [4, 7) (they overlap at 2 and 4).
    x = np.arange(7.0).reshape(1, 1, 1, 7)
    assert_close(pooling.adaptive_avg_pool2d_forward(x, (1, 3)), [[[[1.0, 3.0, 5.0]]]])


@pytest.mark.parametrize("shape, output_size", [((1, 2, 5, 4), (2, 3)), ((2, 1, 3, 5), (4, 2))])
def test_adaptive_avg_pool2d_backward_finite_differences(xp, rng, shape, output_size):
    x = draw(rng, shape)
    dy = draw(rng, tuple(shape[:2]) + ref_adaptive_output(shape, output_size))
    expected = numerical_gradient(lambda a: pooling.adaptive_avg_pool2d_forward(a, output_size), [x], 0, dy)
    assert_close(pooling.adaptive_avg_pool2d_backward(xp.asarray(dy), shape), expected, rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, error, message", [
    (lambda x: pooling.max_pool2d_forward(x[0], 2), ValueError, r"input must be 4-D \(N, C, H, W\)"),
    (lambda x: pooling.avg_pool2d_forward(x.astype(np.int32), 2), TypeError, "input must be a float32, float64, float16 or bfloat16"),
    (lambda x: pooling.adaptive_avg_pool2d_forward(x[..., :0], 1), ValueError, "non-zero C, H and W"),
    (lambda x: pooling.max_pool2d_forward(x, 0), ValueError, "kernel_size must be >= 1"),
    (lambda x: pooling.max_pool2d_forward(x, 1.5), TypeError, "kernel_size must be an int or a pair of ints, got 1.5"),
    (lambda x: pooling.avg_pool2d_forward(x, (2, 2, 2)), TypeError, "kernel_size must be an int or a pair"),
    (lambda x: pooling.max_pool2d_forward(x, 2, 0), ValueError, "stride must be >= 1"),
    (lambda x: pooling.avg_pool2d_forward(x, 2, (1, 0)), ValueError, "stride must be >= 1"),
    (lambda x: pooling.max_pool2d_forward(x, 2, padding=-1), ValueError, "padding must be >= 0"),
    (lambda x: pooling.max_pool2d_forward(x, 3, padding=2), ValueError, "padding must be at most half of kernel_size"),
    (lambda x: pooling.avg_pool2d_forward(x, (2, 4), padding=(2, 1)), ValueError, "padding must be at most half"),
    (lambda x: pooling.max_pool2d_forward(x, 2, dilation=0), ValueError, "dilation must be >= 1"),
    (lambda x: pooling.max_pool2d_forward(x, 6), ValueError, r"kernel_size \(6, 6\) .*too large for input"),
    (lambda x: pooling.max_pool2d_forward(x, 3, dilation=3), ValueError, r"dilated \(7, 7\).*too large for input"),
    (lambda x: pooling.avg_pool2d_forward(x, (1, 6), 1), ValueError, "too large for input of size"),
    (lambda x: pooling.max_pool2d_forward(x, 2, ceil_mode="yes"), TypeError, "ceil_mode must be a bool"),
    (lambda x: pooling.avg_pool2d_forward(x, 2, count_include_pad=1), TypeError, "count_include_pad must be a bool"),
    (lambda x: pooling.avg_pool2d_forward(x, 2, divisor_override=0), ValueError, "divisor_override must be None or"),
    (lambda x: pooling.avg_pool2d_forward(x, 2, divisor_override=1.5), TypeError, "divisor_override must be None or"),
    (lambda x: pooling.max_pool2d_forward(x[..., :1, :1], 2, 1, 1, 2), ValueError, "holds no input pixel"),
    (lambda x: pooling.adaptive_avg_pool2d_forward(x, 0), ValueError, "output_size must be >= 1"),
    (lambda x: pooling.adaptive_avg_pool2d_forward(x, 1.5), TypeError, "output_size must be an int or a pair"),
    (lambda x: pooling.adaptive_avg_pool2d_forward(x, (1, 2, 3)), TypeError, "output_size must be an int or a pair"),
])
def test_forward_errors(call, error, message):
    x = np.zeros((1, 2, 5, 4))
    with pytest.raises(error, match=message):
        call(x)


@pytest.mark.parametrize("call, error, message", [
    (lambda dy, i: pooling.max_pool2d_backward(dy, i, (1, 2, 5)), ValueError, "x_shape must be a tuple of 4 ints"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i, "1x2x5x4"), ValueError, "x_shape must be a tuple of 4 ints"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i, (1, 2, 0, 4)), ValueError, "x_shape must have"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i, (2, 2, 5, 4)), ValueError, "grad_output must have x_shape's N"),
    (lambda dy, i: pooling.max_pool2d_backward(dy.astype(np.int64), i, (1, 2, 5, 4)), TypeError,
     "grad_output must be a float32, float64, float16 or bfloat16 array"),
    (lambda dy, i: pooling.max_pool2d_backward(dy[0], i, (1, 2, 5, 4)), ValueError, "grad_output must be 4-D"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i.astype(np.float64), (1, 2, 5, 4)), TypeError,
     "indices must be an integer array"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i[..., :1], (1, 2, 5, 4)), ValueError,
     "indices must have grad_output's shape"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i + 20, (1, 2, 5, 4)), ValueError,
     r"indices must lie in \[0, H\*W\)"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i - 20, (1, 2, 5, 4)), ValueError,
     r"indices must lie in \[0, H\*W\)"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i, (1, 2, 5, 4), 3), ValueError,
     r"grad_output must have shape \(1, 2, 1, 1\)"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i, (1, 2, 5, 4), stride=2), ValueError,
     "give kernel_size with the other window parameters"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i.astype(np.uint8), (1, 2, 5, 4)), ValueError,
     "uint8 taps need the window parameters"),
    (lambda dy, i: pooling.max_pool2d_backward(dy, i.astype(np.uint8) + 9, (1, 2, 5, 4), 2), ValueError,
     r"indices must lie in \[0, H\*W\)"),
    (lambda dy, i: pooling.avg_pool2d_backward(dy, (1, 2, 7, 4), 2), ValueError,
     r"grad_output must have shape \(1, 2, 3, 2\)"),
    (lambda dy, i: pooling.avg_pool2d_backward(dy, (1, 3, 5, 4), 2), ValueError, "grad_output must have shape"),
    (lambda dy, i: pooling.avg_pool2d_backward(dy.astype(np.int64), (1, 2, 5, 4), 2), TypeError, "grad_output must be"),
    (lambda dy, i: pooling.avg_pool2d_backward(dy, (1, 2, 5), 2), ValueError, "x_shape must be a tuple of 4 ints"),
    (lambda dy, i: pooling.avg_pool2d_backward(dy, (1, 2, 5, 4), 3, padding=2), ValueError, "padding must be at most"),
    (lambda dy, i: pooling.adaptive_avg_pool2d_backward(dy, (2, 2, 5, 4)), ValueError,
     r"grad_output must have shape \(2, 2, P, Q\)"),
    (lambda dy, i: pooling.adaptive_avg_pool2d_backward(dy[0], (1, 2, 5, 4)), ValueError, "grad_output must be 4-D"),
    (lambda dy, i: pooling.adaptive_avg_pool2d_backward(dy, [1, 2, 5.0, 4]), ValueError, "x_shape must be a tuple"),
])
def test_backward_errors(call, error, message):
    x = np.zeros((1, 2, 5, 4))
    y, indices = pooling.max_pool2d_forward(x, 2, return_indices=True)
    with pytest.raises(error, match=message):
        call(np.ones_like(y), indices)


@pytest.mark.parametrize("place, tap, found", [
    ((0, 0, 0, 0), 0, "a tap on the padding"),      # output (0, 0)'s tap (0, 0): pixel (-1, -1)
    ((0, 1, 1, 0), 3, "a tap on the padding"),      # output (1, 0)'s tap (1, 0): pixel (2, -1), at flat position 7
    ((0, 0, 2, 1), 8, "a tap on the padding"),      # output (2, 1)'s tap (2, 2): pixel (5, 3), below the input
    ((0, 1, 1, 1), 9, "a tap 9 of a 3 x 3 window"),
])
def test_backward_refuses_taps_off_the_input(place, tap, found):
    """uint8 taps that name no window tap, or one on the padding, are a ValueError: the forward never picks padding
    (a flat position h·W + w still inside [0, H·W) does not make a pixel of the input)."""
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 4))
    y, taps = pooling.max_pool2d_forward(x, 3, 2, 1)
    dx = pooling.max_pool2d_backward(np.ones_like(y), taps, x.shape, 3, 2, 1)  # the forward's own record is valid
    assert dx.sum() == y.size
    taps[place] = tap
    with pytest.raises(ValueError, match=rf"indices must lie in \[0, H\*W\).*{found}"):
        pooling.max_pool2d_backward(np.ones_like(y), taps, x.shape, 3, 2, 1)


@pytest.mark.parametrize("args, error, message", [
    ((5, 0, 1, 0, 1, False), ValueError, "kernel must be >= 1"),
    ((5, 2, 0, 0, 1, False), ValueError, "stride must be >= 1"),
    ((5, 2, 1, -1, 1, False), ValueError, "padding must be >= 0"),
    ((5, 2, 1, 0, 0, False), ValueError, "dilation must be >= 1"),
    ((5.0, 2, 1, 0, 1, False), TypeError, "size must be an int"),
    ((5, 2, 1, 0, 1, None), TypeError, "ceil_mode must be a bool"),
])
def test_pool_output_size_errors(args, error, message):
    with pytest.raises(error, match=message):
        pooling.pool_output_size(*args)


# ----------------------------------------------------------------------------------------------
# Optional cross-check with PyTorch
# ----------------------------------------------------------------------------------------------
def test_matches_torch(rng):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    checked = 0
    while checked < 25:
        kernel, stride, padding, dilation, ceil_mode, shape = random_max_case(rng)
        if not fits(ref_geometry(shape, kernel, stride, padding, dilation, ceil_mode), shape):
            continue
        checked += 1
        x = draw(rng, shape)
        x_torch = torch.tensor(x, requires_grad=True)
        y_torch, indices_torch = functional.max_pool2d(x_torch, kernel, stride, padding, dilation, ceil_mode,
                                                       return_indices=True)
        dy = draw(rng, tuple(y_torch.shape))
        y_torch.backward(torch.tensor(dy))
        window = (kernel, stride, padding, dilation, ceil_mode)
        y, positions = pooling.max_pool2d_forward(x, *window, return_indices=True)  # PyTorch's flat h·W + w
        np.testing.assert_array_equal(y, y_torch.detach().numpy())
        np.testing.assert_array_equal(positions, indices_torch.numpy())
        assert_close(pooling.max_pool2d_backward(dy, positions, shape), x_torch.grad.numpy())
        y, taps = pooling.max_pool2d_forward(x, *window)  # the compact record of winning taps (kernels of <= 16)
        np.testing.assert_array_equal(y, y_torch.detach().numpy())
        assert taps.dtype == np.uint8
        np.testing.assert_array_equal(taps_to_positions(taps, kernel, stride, padding, dilation, shape),
                                      indices_torch.numpy())
        assert_close(pooling.max_pool2d_backward(dy, taps, shape, *window), x_torch.grad.numpy())

        count_include_pad, divisor_override = bool(rng.integers(2)), [None, 3][rng.integers(2)]
        avg_args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
        x_torch = torch.tensor(x, requires_grad=True)
        y_torch = functional.avg_pool2d(x_torch, *avg_args)
        dy = draw(rng, tuple(y_torch.shape))
        y_torch.backward(torch.tensor(dy))
        assert_close(pooling.avg_pool2d_forward(x, *avg_args), y_torch.detach().numpy())
        assert_close(pooling.avg_pool2d_backward(dy, shape, *avg_args), x_torch.grad.numpy())

        output_size = (int(rng.integers(1, 8)), [None, int(rng.integers(1, 8))][rng.integers(2)])
        x_torch = torch.tensor(x, requires_grad=True)
        y_torch = functional.adaptive_avg_pool2d(x_torch, output_size)
        dy = draw(rng, tuple(y_torch.shape))
        y_torch.backward(torch.tensor(dy))
        assert_close(pooling.adaptive_avg_pool2d_forward(x, output_size), y_torch.detach().numpy())
        assert_close(pooling.adaptive_avg_pool2d_backward(dy, shape), x_torch.grad.numpy())
