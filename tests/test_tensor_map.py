"""Tensor maps' arguments (minidnn.primitives.tensor_map): worked out on the CPU, held here to the convolution's own
output size and to the copy engine's limits. The encoding itself needs the driver: the GPU tests of
tests/test_conv_wgmma.py (the TMA build, bit for bit the gathering build's output) cover it."""
import numpy as np
import pytest

from minidnn.primitives import tensor_map


def corners_along(size, lower, upper, stride):
    """The window corners the copy walks along one dimension: lower, lower + stride, ... below size + upper."""
    return list(range(lower, size + upper, stride))


def test_the_im2col_box_holds_one_corner_per_output_pixel(rng):
    """Along H and W, the corners of the box are exactly the output pixels' windows: P and Q of them (the
    convolution's own output size, (size + 2·pad − (filter − 1)·dilation − 1) // stride + 1), the first at −pad,
    each stride on."""
    for _ in range(200):
        N, H, W = (int(v) for v in rng.integers(1, 40, size=3))
        R, S = (int(v) for v in rng.integers(1, 8, size=2))
        stride = tuple(int(v) for v in rng.integers(1, 5, size=2))
        dilation = tuple(int(v) for v in rng.integers(1, 4, size=2))
        padding = tuple(int(v) for v in rng.integers(0, 4, size=2))
        P = (H + 2 * padding[0] - (R - 1) * dilation[0] - 1) // stride[0] + 1
        Q = (W + 2 * padding[1] - (S - 1) * dilation[1] - 1) // stride[1] + 1
        if P <= 0 or Q <= 0:
            continue
        itemsize = int(rng.choice([2, 4]))
        C = 64 // itemsize * int(rng.integers(1, 5))
        a = tensor_map.im2col_arguments(N, H, W, C, itemsize, (R, S), stride, padding, dilation, 64 // itemsize, 128)
        assert a.dims == (C, W, H, N)  # innermost first
        assert a.byte_strides == (C * itemsize, W * C * itemsize, H * W * C * itemsize)
        assert a.element_strides == (1, stride[1], stride[0], 1)
        assert a.box == (64 // itemsize, 128)
        assert a.data_type == {2: 1, 4: 7}[itemsize]
        w_corners = corners_along(W, a.lower_corner[0], a.upper_corner[0], stride[1])
        h_corners = corners_along(H, a.lower_corner[1], a.upper_corner[1], stride[0])
        assert w_corners == [q * stride[1] - padding[1] for q in range(Q)]
        assert h_corners == [p * stride[0] - padding[0] for p in range(P)]
        # The last tap of the last window stays inside the padded image.
        assert h_corners[-1] + (R - 1) * dilation[0] <= H - 1 + padding[0]


def test_a_cropped_outputs_box_ends_after_its_last_corner(rng):
    """An output cropped to its first P' rows and Q' columns, with the padding after the image that makes it (what a
    strided backward-data's phase asks: its padding before may be negative too): the box holds exactly P' × Q'
    corners, the first at −pad, and without padding_after the whole output's."""
    for _ in range(200):
        H, W = (int(v) for v in rng.integers(2, 30, size=2))
        R, S = (int(v) for v in rng.integers(1, 4, size=2))
        padding = tuple(int(v) for v in rng.integers(-2, 3, size=2))
        P, Q = H + 2 * padding[0] - R + 1, W + 2 * padding[1] - S + 1
        if P < 2 or Q < 2:
            continue
        rows, columns = int(rng.integers(1, P + 1)), int(rng.integers(1, Q + 1))
        after = (rows + R - 1 - H - padding[0], columns + S - 1 - W - padding[1])
        a = tensor_map.im2col_arguments(2, H, W, 64, 2, (R, S), (1, 1), padding, (1, 1), 64, 128, after)
        assert corners_along(H, a.lower_corner[1], a.upper_corner[1], 1) == [p - padding[0] for p in range(rows)]
        assert corners_along(W, a.lower_corner[0], a.upper_corner[0], 1) == [q - padding[1] for q in range(columns)]
        whole = tensor_map.im2col_arguments(2, H, W, 64, 2, (R, S), (1, 1), padding, (1, 1), 64, 128)
        assert corners_along(H, whole.lower_corner[1], whole.upper_corner[1], 1) == [p - padding[0] for p in range(P)]
    with pytest.raises(ValueError, match="after"):  # the box's end out of the copy engine's range
        tensor_map.im2col_arguments(2, 9, 9, 64, 2, (3, 3), (1, 1), (1, 1), (1, 1), 64, 128, (300, 1))


def test_the_tiled_box_reads_rows_of_at_most_128_bytes():
    a = tensor_map.tiled_arguments(rows=192, columns=9 * 64, itemsize=2, box_columns=64, box_rows=128)
    assert a.dims == (576, 192) and a.byte_strides == (1152,) and a.box == (64, 128) and a.element_strides == (1, 1)
    assert not a.lower_corner
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        tensor_map.tiled_arguments(rows=8, columns=9, itemsize=2, box_columns=8, box_rows=8)
    with pytest.raises(ValueError, match="at most 128 bytes"):
        tensor_map.tiled_arguments(rows=8, columns=64, itemsize=4, box_columns=64, box_rows=8)
    with pytest.raises(ValueError, match="2- or 4-byte"):
        tensor_map.tiled_arguments(rows=8, columns=64, itemsize=8, box_columns=8, box_rows=8)


@pytest.mark.parametrize("change, message", [
    (dict(C=12), "multiple of 16 bytes"),                      # 24-byte pixels
    (dict(channels=128), "at most 128 bytes"),                 # 256 bytes a pixel's slice
    (dict(pixels=512), "pixels 1 to 256"),
    (dict(stride=(9, 1)), "strides 1 to 8"),
    (dict(padding=(200, 1)), "corners must lie within"),
    (dict(filter_size=(3, 3), dilation=(1, 200)), "corners must lie within"),  # the upper corner 1 − 400
    (dict(filter_size=(1, 300), padding=(0, 0), dilation=(1, 1)), "corners must lie within"),  # taps past 255
])
def test_what_the_copy_engine_cannot_map_is_refused_by_name(change, message):
    arguments = dict(C=64, itemsize=2, filter_size=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1),
                     channels=64, pixels=128)
    assert tensor_map.im2col_fits(**arguments)
    arguments.update(change)
    assert not tensor_map.im2col_fits(**arguments)
    with pytest.raises(ValueError, match=message):
        tensor_map.im2col_arguments(2, 9, 9, **arguments)


def test_a_map_needs_a_tensor_on_16_bytes():
    arguments = tensor_map.tiled_arguments(rows=8, columns=64, itemsize=2, box_columns=64, box_rows=8)
    with pytest.raises(ValueError, match="start on 16 bytes"):
        tensor_map.encode(arguments, 0x1008)


def test_the_cache_encodes_once_per_arguments_and_address(monkeypatch):
    encoded = []

    def encode(arguments, address):
        encoded.append((arguments, address))
        return np.zeros((), dtype=tensor_map.MAP_DTYPE)[()]

    monkeypatch.setattr(tensor_map, "encode", encode)
    cache = tensor_map.MapCache(most=2)
    a = tensor_map.tiled_arguments(rows=8, columns=64, itemsize=2, box_columns=64, box_rows=8)
    b = tensor_map.tiled_arguments(rows=16, columns=64, itemsize=2, box_columns=64, box_rows=8)
    for key in ((a, 256), (a, 256), (a, 512), (a, 256)):
        cache.get(*key)
    assert encoded == [(a, 256), (a, 512)]
    cache.get(b, 256)  # a third key: the cache starts over
    cache.get(a, 256)
    assert encoded[2:] == [(b, 256), (a, 256)]
    assert tensor_map.MAP_DTYPE.itemsize == 128
