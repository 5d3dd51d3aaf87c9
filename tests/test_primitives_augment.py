"""crop_flip_normalize: the NumPy twin against a naive per-image reference, the GPU kernel against the twin
(bitwise), and the argument checks."""
import numpy as np
import pytest

from minidnn.primitives.augment import crop_flip_normalize


def naive(images, top, left, flip, size, mean, std, padding, fill, scale):
    """Image by image and pixel by pixel in float64: pad, cut the window, mirror it, scale, normalise."""
    count, height, width, channels = images.shape
    h, w = size
    out = np.empty((count, channels, h, w))
    for n in range(count):
        padded = np.full((height + 2 * padding, width + 2 * padding, channels), fill, dtype=np.float64)
        padded[padding:padding + height, padding:padding + width] = images[n]
        window = padded[top[n]:top[n] + h, left[n]:left[n] + w]
        if flip[n]:
            window = window[:, ::-1]
        for c in range(channels):
            out[n, c] = (window[:, :, c] * scale - mean[c]) / std[c]
    return out


def draws(rng, count, height, width, size, padding):
    top = rng.integers(0, height + 2 * padding - size[0] + 1, count).astype(np.int32)
    left = rng.integers(0, width + 2 * padding - size[1] + 1, count).astype(np.int32)
    return top, left, rng.random(count) < 0.5


CASES = [  # (N, H, W, C), (h, w), padding, fill
    ((5, 7, 9, 3), (7, 9), 2, 0),
    ((3, 6, 5, 1), (4, 6), 1, 17),
    ((4, 11, 8, 2), (13, 3), 3, 255),
    ((2, 4, 4, 4), (4, 4), 0, 0),
]


@pytest.mark.parametrize("shape, size, padding, fill", CASES)
def test_twin_matches_the_naive_reference(rng, shape, size, padding, fill):
    images = rng.integers(0, 256, shape, dtype=np.uint8)
    top, left, flip = draws(rng, shape[0], shape[1], shape[2], size, padding)
    mean, std = rng.random(shape[3]), rng.random(shape[3]) + 0.1
    expected = naive(images, top, left, flip, size, mean, std, padding, fill, 1 / 255)
    got64 = crop_flip_normalize(images, top, left, flip, size, mean, std, padding=padding, fill=fill, dtype=np.float64)
    np.testing.assert_allclose(got64, expected, rtol=1e-13, atol=1e-13)
    got32 = crop_flip_normalize(images, top, left, flip, size, mean.astype(np.float32), std.astype(np.float32),
                                padding=padding, fill=fill)
    assert got32.dtype == np.float32 and got32.shape == (shape[0], shape[3], *size)
    np.testing.assert_allclose(got32, expected, rtol=2e-6, atol=2e-6)


def test_twin_rounds_as_to_tensor_then_normalize(rng):
    """float32 results are bit for bit (x · float32(1/255) − mean) / std, each step rounded, as ToTensor and
    Normalize compute them on one image."""
    images = rng.integers(0, 256, (6, 5, 5, 3), dtype=np.uint8)
    mean, std = np.float32([0.49, 0.48, 0.45]), np.float32([0.25, 0.24, 0.26])
    zeros = np.zeros(6, np.int32)
    got = crop_flip_normalize(images, zeros, zeros, np.zeros(6, bool), 5, mean, std)
    expected = (images.transpose(0, 3, 1, 2).astype(np.float32) * np.float32(1 / 255) - mean[:, None, None]) \
        / std[:, None, None]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, size, padding, fill", CASES)
def test_gpu_kernel_matches_the_twin_bitwise(poisoned, rng, dtype, shape, size, padding, fill):
    cupy = poisoned
    if cupy is np:
        pytest.skip("the GPU half of the comparison")
    images = rng.integers(0, 256, shape, dtype=np.uint8)
    top, left, flip = draws(rng, shape[0], shape[1], shape[2], size, padding)
    mean, std = rng.random(shape[3]).astype(dtype), (rng.random(shape[3]) + 0.1).astype(dtype)
    expected = crop_flip_normalize(images, top, left, flip, size, mean, std, padding=padding, fill=fill, dtype=dtype)
    arrays = [cupy.asarray(a) for a in (images, top, left, flip, mean, std)]
    got = crop_flip_normalize(*arrays[:4], size, *arrays[4:], padding=padding, fill=fill, dtype=dtype)
    np.testing.assert_array_equal(cupy.asnumpy(got), expected)
    out = cupy.empty(expected.shape, dtype)
    assert crop_flip_normalize(*arrays[:4], size, *arrays[4:], padding=padding, fill=fill, out=out) is out
    np.testing.assert_array_equal(cupy.asnumpy(out), expected)


@pytest.mark.gpu
def test_gpu_repeats_go_through_the_ready_call_with_the_twins_bits(poisoned, rng, monkeypatch):
    """A loader augments every batch alike: the first call on the GPU is checked and kept, its repeats with new
    images and draws of the same shapes go straight to their launch, and each gives the twin's bits."""
    from minidnn.primitives import _cuda, augment  # noqa: PLC0415

    cupy = poisoned
    if cupy is np:
        pytest.skip("the GPU's ready calls")
    monkeypatch.setattr(augment, "_ready", _cuda.ReadyCalls())
    checked = []
    check = augment._check_arguments
    monkeypatch.setattr(augment, "_check_arguments", lambda *a: checked.append(1) or check(*a))
    count, size, padding = int(rng.integers(5, 12)), (int(rng.integers(5, 9)), int(rng.integers(5, 9))), 2
    mean, std = rng.random(3).astype(np.float32), (rng.random(3) + 0.1).astype(np.float32)
    for repeat in range(3):
        images = rng.integers(0, 256, (count, 8, 8, 3), dtype=np.uint8)
        top, left, flip = draws(rng, count, 8, 8, size, padding)
        expected = crop_flip_normalize(images, top, left, flip, size, mean, std, padding=padding)
        checked.clear()
        got = crop_flip_normalize(*[cupy.asarray(a) for a in (images, top, left, flip)], size,
                                  cupy.asarray(mean), cupy.asarray(std), padding=padding)
        np.testing.assert_array_equal(cupy.asnumpy(got), expected, err_msg=f"call {repeat}")
        assert len(checked) == (1 if repeat == 0 else 0), repeat


@pytest.mark.gpu
def test_gpu_offsets_outside_the_padded_image_give_nan_for_that_image_only(xp, rng):
    if xp is np:
        pytest.skip("the CPU raises instead (test_errors)")
    images = xp.asarray(rng.integers(0, 256, (3, 4, 4, 3), dtype=np.uint8))
    top, left = xp.asarray(np.int32([0, 5, 1])), xp.asarray(np.int32([1, 0, -1]))
    mean, std = xp.zeros(3, np.float32), xp.ones(3, np.float32)
    got = xp.asnumpy(crop_flip_normalize(images, top, left, xp.zeros(3, bool), 4, mean, std, padding=1))
    assert np.isfinite(got[0]).all() and np.isnan(got[1]).all() and np.isnan(got[2]).all()


def test_out_is_written_and_returned(rng):
    images = rng.integers(0, 256, (2, 3, 3, 1), dtype=np.uint8)
    out = np.full((2, 1, 3, 3), np.nan, np.float32)
    zeros = np.zeros(2, np.int32)
    result = crop_flip_normalize(images, zeros, zeros, np.ones(2, np.uint8), 3, np.zeros(1, np.float32),
                                 np.ones(1, np.float32), out=out)
    assert result is out
    np.testing.assert_array_equal(out[:, 0], images[:, :, ::-1, 0] * np.float32(1 / 255))


def test_errors(rng):
    images = rng.integers(0, 256, (2, 4, 4, 3), dtype=np.uint8)
    zeros, flip = np.zeros(2, np.int32), np.zeros(2, bool)
    mean, std = np.zeros(3, np.float32), np.ones(3, np.float32)

    def call(**changes):
        arguments = dict(images=images, top=zeros, left=zeros, flip=flip, size=4, mean=mean, std=std, padding=1)
        arguments.update(changes)
        return crop_flip_normalize(**arguments)

    with pytest.raises(TypeError, match=r"images must be a uint8 \(N, H, W, C\) array"):
        call(images=images.astype(np.float32))
    with pytest.raises(TypeError, match=r"top must be a int32 array of shape \(2,\)"):
        call(top=zeros.astype(np.int64))
    with pytest.raises(TypeError, match="flip must be a bool or uint8 array"):
        call(flip=np.zeros(3, bool))
    with pytest.raises(ValueError, match="larger than the padded image"):
        call(size=7)
    with pytest.raises(ValueError, match=r"top\[1\] = 3 puts the window outside"):
        call(top=np.int32([0, 3]))
    with pytest.raises(ValueError, match=r"left\[0\] = -1"):
        call(left=np.int32([-1, 0]))
    with pytest.raises(ValueError, match=r"mean must have shape \(3,\)"):
        call(mean=np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="mean and std must be float32 arrays"):
        call(mean=np.zeros(3))
    with pytest.raises(ValueError, match="std must be > 0"):
        call(std=np.float32([1, 0, 1]))
    with pytest.raises(ValueError, match="fill must be <= 255"):
        call(fill=256)
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array"):
        call(out=np.empty((2, 3, 4, 5), np.float32))
    with pytest.raises(TypeError, match="output dtype must be float32 or float64"):
        call(dtype=np.float16)
