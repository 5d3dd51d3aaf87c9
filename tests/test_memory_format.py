"""Channels-last tensors (``minidnn.channels_last``, PyTorch's ``torch.channels_last``): the API against PyTorch's,
the layout each primitive hands on, and the values, which a layout must never change.

The primitives with channels-last kernels (the half-precision implicit GEMMs, batch norm) are held to their own
C-contiguous results (the convolutions' forward and backward-data bit for bit: the same sums, only the loads and
the store differ), which their own test files hold to float64 references; the others run on C-contiguous copies
and must lay out their results again. A small network's float64 step, channels-last, is held to PyTorch's channels-last step, and a bfloat16
autocast step to the same step on C-contiguous tensors.
"""
import math

import numpy as np
import pytest
import torch

import minidnn
import minidnn.nn as nn
import minidnn.functional as F
from minidnn.primitives import batchnorm, conv, convert, layout
from minidnn.primitives.conv import implicit_gemm_nhwc
from tests.helpers import half_operand, to_numpy
from tests.test_conv_half import operand_shapes
from tests.test_conv_implicit_gemm import problem_of, run

DIRECTIONS = ("forward", "backward_data", "backward_filter")


def element_strides(array, shape):
    """An array's strides in elements, those of axes of size 1 (which never move) left out."""
    return tuple(s // array.itemsize for s, n in zip(array.strides, shape) if n > 1)


def torch_strides(tensor):
    return tuple(s for s, n in zip(tensor.stride(), tensor.shape) if n > 1)


# ----------------------------------------------------------------------------------------------
# The API, against PyTorch's
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 1, 3, 3), (2, 5, 1, 1), (0, 3, 2, 2), (2, 3, 0, 4), (3, 4, 1, 6),
                                   (2, 4, 6, 1), (1, 7, 2, 3)])
def test_is_channels_last_is_the_strides_of_an_nhwc_buffer_that_is_not_c_contiguous(shape):
    """Against the definition read off NumPy's flags: every layout a step makes (C-contiguous, channels-last, their
    slices and transposes), with the shapes whose two layouts coincide or that hold nothing."""
    N, C, H, W = shape
    base = np.arange(max(N * C * H * W, 1) * 2, dtype=np.float32)
    nhwc = base[:N * C * H * W].reshape(N, H, W, C)
    every_other = base[:2 * N * C * H * W].reshape(N, H, W, 2 * C)[..., ::2]  # strided channels
    candidates = [nhwc.transpose(0, 3, 1, 2), base[:N * C * H * W].reshape(shape), nhwc.transpose(0, 3, 2, 1),
                  base[:N * C * H * W].reshape(N, C, W, H).transpose(0, 1, 3, 2),
                  np.ascontiguousarray(every_other).transpose(0, 3, 1, 2), every_other.transpose(0, 3, 1, 2),
                  base[:N * C * H * W].reshape(N * C * H * W), base[:N * C * H * W].reshape(N, C, H * W)]
    for array in candidates:
        item, (c, h, w) = array.itemsize, array.shape[1:] if array.ndim == 4 else (0, 0, 0)
        expected = array.ndim == 4 and not array.flags.c_contiguous and array.strides == (
            h * w * c * item, item, w * c * item, c * item)
        assert layout.is_channels_last(array) == expected, (array.shape, array.strides)
    assert layout.is_channels_last(candidates[0]) == (C != 1 and H * W != 1 and N * C * H * W != 0)


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 8, 3, 3), (2, 1, 4, 4), (3, 6, 1, 1)])
def test_to_and_is_contiguous_agree_with_pytorch(shape):
    values = np.random.default_rng(0).standard_normal(shape)
    x, t = minidnn.tensor(values), torch.tensor(values)
    ours, theirs = x.to(memory_format=minidnn.channels_last), t.to(memory_format=torch.channels_last)
    assert element_strides(ours.data, shape) == torch_strides(theirs)
    for fmt, torch_fmt in ((minidnn.contiguous_format, torch.contiguous_format),
                           (minidnn.channels_last, torch.channels_last)):
        assert ours.is_contiguous(memory_format=fmt) == theirs.is_contiguous(memory_format=torch_fmt)
        assert x.is_contiguous(memory_format=fmt) == t.is_contiguous(memory_format=torch_fmt)
    back = ours.contiguous()
    assert back.is_contiguous() and np.array_equal(back.numpy(), values)
    assert np.array_equal(ours.numpy(), values)
    assert ours.to(memory_format=minidnn.channels_last) is ours  # nothing to change
    assert ours.to(memory_format=minidnn.preserve_format) is ours


@pytest.mark.parametrize("dtype", [np.uint16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 37, 5, 7), (2, 64, 33, 1), (1, 5, 40, 41), (4, 3, 9, 11), (6, 40, 3, 3)])
def test_layout_changes_keep_the_values(xp, shape, dtype):
    """layout.to_channels_last and layout.contiguous (on the GPU layout.cu's transpose: tiles off the 32 x 32
    grid, and the narrow kernels of 3 or 5 channels and of 3 x 3 planes; 2-, 4- and 8-byte words) against NumPy's
    own strided copies."""
    values = (np.arange(np.prod(shape)) % 65521).astype(dtype).reshape(shape)
    last = layout.to_channels_last(xp.asarray(values))
    assert layout.is_channels_last(last)
    assert np.array_equal(to_numpy(layout.buffer(last)), values.transpose(0, 2, 3, 1))
    back = layout.contiguous(last)
    assert back.flags.c_contiguous and np.array_equal(to_numpy(back), values)


@pytest.mark.parametrize("dtype, word", [(np.uint16, np.uint16), (np.float32, np.float32), (np.float16, np.uint16)],
                         ids=["bfloat16_words", "float32", "float16_into_words"])
@pytest.mark.parametrize("weight_last", [False, True], ids=["nchw", "channels_last"])
def test_a_padded_channels_last_copy_puts_zeros_after_the_channels(xp, rng, dtype, word, weight_last):
    """layout.to_channels_last_padded, of either layout, into an out full of all-ones bits (a NaN as float32 and as
    a half type): each pixel's channels, then zeros, against NumPy's own padding; float16 values into a workspace's
    16-bit words keep their bits (a cast would turn 1.5 into 1). A slice of images too (a chunk of a batch), whose
    first value lies inside its array; on the GPU pixels of 16 bytes (3 channels padded to 4 floats or 8 half words)
    go one vector a pixel, in an out 16-byte aligned or not, and other widths one word a thread."""
    for channels in (3, 5):
        values = (rng.integers(1, 1000, size=(4, channels, 7, 6)) / 2).astype(dtype)
        array = xp.asarray(values)
        array = layout.to_channels_last(array) if weight_last else array
        for images in (slice(None), slice(1, 3)):
            for padded_channels in (4, 5, 8, 16):
                if padded_channels < channels:
                    continue
                chunk = values[images]
                shape = (len(chunk), 7, 6, padded_channels)
                for offset in (0, 1):  # out at the start of its buffer, or one word in
                    buffer = xp.full(math.prod(shape) + offset, 0xFFFF if word == np.uint16 else np.nan, word)
                    out = buffer[offset:].reshape(shape)
                    layout.to_channels_last_padded(array[images], out)
                    want = np.pad(chunk.transpose(0, 2, 3, 1),
                                  ((0, 0), (0, 0), (0, 0), (0, padded_channels - channels))).view(word)
                    assert np.array_equal(to_numpy(out), want), (channels, images, padded_channels, offset)


def test_a_narrow_transpose_moves_words_in_a_grid_that_fills_the_gpu():
    """layout.transpose_launch: 32 x 32 tiles for wide matrices; a matrix with under 16 rows or columns (a stem's
    3 channels: a tile of it would be 3/32 full) goes to the narrow kernel, in a grid of at most max_blocks blocks
    shared by the images (at most 65535 rows of them), at least one block an image row."""
    assert layout.transpose_launch(64, 3136, 128, 2, 4224) == ("transpose_planes_2", (98, 2, 128), 256)
    assert layout.transpose_launch(3, 224 * 224, 128, 2, 4224) == ("transpose_narrow_2", (33, 128), 256)
    assert layout.transpose_launch(224 * 224, 3, 128, 4, 4224) == ("transpose_narrow_4", (33, 128), 256)
    assert layout.transpose_launch(9, 20, 7, 8, 4224) == ("transpose_narrow_8", (1, 7), 256)
    assert layout.transpose_launch(9, 512, 10**5, 2, 4224) == ("transpose_narrow_2", (1, 65535), 256)


def test_a_given_out_decides_the_common_layout(xp):
    """layout.common: the inputs follow a given out (which a kernel writes and the caller reads), whichever layout
    they have; without out, the first 4-D input whose layouts differ (one of shape (2, 1, 4, 5) has no say)."""
    plain, last = xp.zeros((2, 3, 4, 5)), layout.to_channels_last(xp.zeros((2, 3, 4, 5)))
    (a, b), channels_last = layout.common((plain, last), out=last)
    assert channels_last and layout.is_channels_last(a) and b is last
    (a, b), channels_last = layout.common((plain, last), out=plain)
    assert not channels_last and a is plain and a.flags.c_contiguous and b.flags.c_contiguous
    assert layout.common((last, last))[1] and not layout.common((plain, last))[1]
    (a, b), channels_last = layout.common((last, plain))
    assert channels_last and a is last and layout.is_channels_last(b)
    (none, a, b), channels_last = layout.common((None, plain, last))
    assert not channels_last and none is None and a is plain and b.flags.c_contiguous
    one_channel = xp.zeros((2, 1, 4, 5))
    assert layout.common((one_channel, last))[1] and not layout.common((one_channel, plain))[1]


def test_shapes_whose_layouts_coincide_are_left_as_they_are(xp):
    """C = 1 or H = W = 1: both layouts are one memory order, so nothing is copied or re-strided."""
    for shape in ((4, 8, 1, 1), (2, 1, 3, 5)):
        array = xp.zeros(shape, dtype=np.float32)
        assert layout.to_channels_last(array) is array and not layout.is_channels_last(array)


def test_the_update_takes_state_whose_length_1_axes_have_other_strides(xp):
    """A (K, C, 1, 1) weight made channels-last by CuPy's copy has strides on its length-1 axes that a C-contiguous
    gradient's do not share: one memory order all the same (the H200 found it: ResNet-18's 1 x 1 projections)."""
    from minidnn.primitives import optimizer  # noqa: PLC0415

    values = np.arange(32, dtype=np.float32).reshape(4, 8, 1, 1)
    param = xp.lib.stride_tricks.as_strided(xp.asarray(values.copy()), values.shape, (32, 4, 32, 32))  # same memory
    grad = xp.ones(values.shape, dtype=np.float32)
    assert param.strides != grad.strides and layout.same_order(param, grad)
    optimizer.sgd_update_multi([param], [grad], None, lr=0.5)
    np.testing.assert_array_equal(to_numpy(param), values - 0.5)


def test_gradient_sums_keep_the_layout(xp, rng):
    """Two gradients of one channels-last tensor add up channels-last, as in PyTorch: layout.add walks the two
    buffers (CuPy's own sum is a new C-contiguous array, read across the inputs' strides, and every node after it
    would change its layout again), for an inner tensor's pending sum and a leaf's .grad alike."""
    shape = (3, 10, 5, 7)
    a64, b64, c64 = (rng.standard_normal(shape) for _ in range(3))
    a, b = (layout.to_channels_last(xp.asarray(v, dtype=np.float32)) for v in (a64, b64))
    for second in (b, layout.contiguous(b)):  # PyTorch's rule: the first operand's layout, whatever the second's
        total = layout.add(a, second)
        assert layout.is_channels_last(total)
        np.testing.assert_allclose(to_numpy(total), a64 + b64, rtol=1e-6, atol=1e-6)

    device = "cpu" if xp is np else "cuda"
    weights = [minidnn.tensor(v.astype(np.float32), device=device) for v in (b64, c64)]
    source = minidnn.tensor(a64.astype(np.float32), device=device, requires_grad=True)
    inner = source.to(memory_format=minidnn.channels_last)  # its two gradients meet in the pending sum
    inner.retain_grad()
    leaf = minidnn.tensor(a64.astype(np.float32), device=device).to(memory_format=minidnn.channels_last)
    leaf.requires_grad_()  # its two gradients meet in .grad
    for tensor in (inner, leaf):
        ((tensor * weights[0]).sum() + (tensor * weights[1]).sum()).backward()
        assert tensor.grad.is_contiguous(memory_format=minidnn.channels_last)
        np.testing.assert_allclose(to_numpy(tensor.grad.data), b64 + c64, rtol=1e-6, atol=1e-6)


# A tensor's element-wise operations on operands of each arrangement: (name, expression over (library, operands)).
# "cl" is channels-last, "c" C-contiguous, "bias" (1, C, 1, 1) and "row" (W,) broadcast, 0.75 a Python scalar.
ELEMENT_WISE = [
    *((f"{first} {symbol} {second}", function, (first, second))
      for symbol, function in (("+", lambda lib, a, b: a + b), ("-", lambda lib, a, b: a - b),
                               ("*", lambda lib, a, b: a * b), ("/", lambda lib, a, b: a / b))
      for first, second in (("cl", "cl"), ("cl", "c"), ("c", "cl"), ("cl", "bias"), ("bias", "cl"), ("cl", "row"),
                            ("row", "cl"), ("cl", 0.75), (0.75, "cl"))),
    ("cl ** 2", lambda lib, a: a.abs() ** 2, ("cl",)),
    ("-cl", lambda lib, a: -a, ("cl",)),
    ("exp, log, sqrt, abs", lambda lib, a: ((a.exp() + 1).log() + a.abs().sqrt()), ("cl",)),
    ("clamp", lambda lib, a: a.clamp(-0.5, 0.5), ("cl",)),
    ("clamp by a bias", lambda lib, a, b: a.clamp(min=b), ("cl", "bias")),
    ("cl > c", lambda lib, a, b: a > b, ("cl", "c")),
    ("c <= cl", lambda lib, a, b: a <= b, ("c", "cl")),
    ("cl == 0.75", lambda lib, a: a == 0.75, ("cl",)),
    ("where(cl > 0, cl, c)", lambda lib, a, b: lib.where(a > 0, a, b), ("cl", "c")),
    ("where(c > 0, cl, c)", lambda lib, a, b: lib.where(b > 0, a, b), ("cl", "c")),
]


@pytest.mark.parametrize("name, expression, arrangement", ELEMENT_WISE, ids=[case[0] for case in ELEMENT_WISE])
def test_element_wise_operations_lay_out_their_results_as_pytorch_does(xp, rng, name, expression, arrangement):
    """A tensor's arithmetic, comparisons and element-wise methods give PyTorch's values and PyTorch's layout:
    channels-last where the first 4-D operand that is not broadcast is channels-last (CuPy's own kernels would write
    C-contiguous results, NumPy's would where the operands disagree)."""
    device = "cpu" if xp is np else "cuda"
    values = {"cl": rng.standard_normal((2, 3, 4, 5)), "c": rng.standard_normal((2, 3, 4, 5)),
              "bias": rng.standard_normal((1, 3, 1, 1)), "row": rng.uniform(0.5, 1.5, 5)}

    def operands(lib, make, channels_last):
        return [value if isinstance(value, float) else
                make(values[value]).to(memory_format=channels_last) if value == "cl" else make(values[value])
                for value in arrangement]
    ours = expression(minidnn, *operands(minidnn, lambda v: minidnn.tensor(v, device=device), minidnn.channels_last))
    theirs = expression(torch, *operands(torch, torch.tensor, torch.channels_last))
    assert ours.is_contiguous(memory_format=minidnn.channels_last) == theirs.is_contiguous(
        memory_format=torch.channels_last), name
    assert ours.is_contiguous() == theirs.is_contiguous(), name
    if theirs.dtype == torch.bool:
        np.testing.assert_array_equal(to_numpy(ours.data), theirs.numpy())
    else:
        np.testing.assert_allclose(to_numpy(ours.data), theirs.numpy(), rtol=1e-12, atol=1e-12)


def test_a_layout_change_is_differentiable():
    x = minidnn.randn(2, 3, 4, 5, requires_grad=True)
    y = x.to(memory_format=minidnn.channels_last)
    (y * minidnn.arange(120.0).reshape(2, 3, 4, 5)).sum().backward()
    assert x.grad.is_contiguous()
    assert np.array_equal(x.grad.numpy(), np.arange(120.0).reshape(2, 3, 4, 5))


def test_bad_memory_formats_are_clear_errors():
    with pytest.raises(ValueError, match=r"channels_last needs a 4-D \(N, C, H, W\) tensor, got shape \(2, 3\)"):
        minidnn.zeros(2, 3).to(memory_format=minidnn.channels_last)
    with pytest.raises(TypeError, match="memory_format must be one of minidnn.contiguous_format"):
        minidnn.zeros(2, 3, 4, 5).to(memory_format="channels_last")
    with pytest.raises(TypeError, match="memory_format must be one of"):
        minidnn.zeros(2, 3, 4, 5).contiguous(minidnn.preserve_format)
    with pytest.raises(TypeError, match="memory_format must be one of"):
        nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)


def test_module_to_lays_out_the_four_dimensional_parameters_as_pytorch_does():
    ours = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8, 2))
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                                 torch.nn.Linear(8, 2))
    weight = ours[0].weight.numpy().copy()
    assert ours.to(memory_format=minidnn.channels_last) is ours
    theirs.to(memory_format=torch.channels_last)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert element_strides(p.data, p.shape) == torch_strides(q), name
    assert np.array_equal(ours[0].weight.numpy(), weight)
    ours.to(memory_format=minidnn.contiguous_format)
    assert ours[0].weight.is_contiguous()


# ----------------------------------------------------------------------------------------------
# Convolution: the output's layout, and values that do not depend on it
# ----------------------------------------------------------------------------------------------
CASE = (3, 24, 9, 11, 40, 3, 3, 1, 1, 1, 1)  # M = 297 rows: off the 128-row tile
GROUPED = (3, 32, 9, 11, 48, 3, 3, 1, 1, 1, 2)  # C/G 16, K/G 24: a group's channels are a slice of each pixel's
ODD_K = (2, 16, 7, 6, 12, 3, 3, 2, 1, 1, 1)  # forward only: K = 12, so a channels-last y takes single stores


@pytest.mark.parametrize("weight_last", [False, True], ids=["weight_contiguous", "weight_last"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("algo", ["implicit_gemm_nhwc", "implicit_gemm_wgmma", "implicit_gemm"])
@pytest.mark.parametrize("case", [CASE, GROUPED], ids=["ungrouped", "grouped"])
def test_half_convolution_on_channels_last_operands(xp, rng, case, algo, direction, weight_last):
    """Native (nhwc, wgmma: read as they are, y written channels-last by the epilogue) and through copies
    (implicit_gemm): the same values as on C-contiguous operands, the layout PyTorch gives."""
    if algo == "implicit_gemm_wgmma" and xp is not np and not conv.registry.get(algo).supports(
            problem_of(case, np.uint16, "cuda"), direction):
        pytest.skip("wgmma needs a GPU of compute capability 9.0")
    first, _ = half_operand(xp, rng, operand_shapes(case, direction)[0], "bfloat16")
    second, _ = half_operand(xp, rng, operand_shapes(case, direction)[1], "bfloat16", scale=0.5)
    last_first = layout.to_channels_last(first)
    last_second = layout.to_channels_last(second) if weight_last or direction == "backward_filter" else second
    assert layout.is_channels_last(last_first) and layout.is_channels_last(last_second) == (
        weight_last or direction == "backward_filter")
    extra = {"dtype": np.float32} if direction == "backward_filter" else {}
    plain = run(direction, first, second, case, algo=algo, **extra)
    laid_out = run(direction, last_first, last_second, case, algo=algo, **extra)
    if direction == "backward_filter":  # the weight gradient stays (K, C, R, S); split-K sums vary on the GPU
        assert laid_out.flags.c_contiguous
        np.testing.assert_allclose(to_numpy(laid_out), to_numpy(plain), rtol=1e-5, atol=1e-5)
        return
    assert layout.is_channels_last(laid_out)
    assert xp.array_equal(layout.contiguous(laid_out), plain)


@pytest.mark.parametrize("algo", ["implicit_gemm_nhwc", "implicit_gemm_wgmma"])
def test_a_channels_last_output_with_k_not_a_multiple_of_8(xp, rng, algo):
    problem = problem_of(ODD_K, np.uint16, "cuda") if xp is not np else problem_of(ODD_K, np.float16)
    if not conv.registry.get(algo).supports(problem, "forward"):
        pytest.skip(f"{algo} does not run this problem here")
    x, _ = half_operand(xp, rng, operand_shapes(ODD_K, "forward")[0], "float16")
    w, _ = half_operand(xp, rng, operand_shapes(ODD_K, "forward")[1], "float16", scale=0.5)
    plain = run("forward", x, w, ODD_K, algo=algo)
    laid_out = run("forward", layout.to_channels_last(x), w, ODD_K, algo=algo)
    assert layout.is_channels_last(laid_out) and xp.array_equal(layout.contiguous(laid_out), plain)


def test_a_whole_batch_without_copies_skips_the_chunks(monkeypatch, xp, rng):
    """A channels-last batch runs in one launch even where its copies would have needed chunks (the chunks are
    the GPU's: its workspace; the values need a GPU)."""
    monkeypatch.setattr(implicit_gemm_nhwc, "CHUNK_WORKSPACE", 25_000)  # one image a chunk
    implicit_gemm_nhwc.images_per_chunk.cache_clear()
    try:
        problem = problem_of(CASE, np.uint16, "cuda")
        assert implicit_gemm_nhwc.images_per_chunk(problem, "forward") < CASE[0]
        assert len(list(implicit_gemm_nhwc._chunks(problem, "forward"))) > 1
        assert [first for first, _ in implicit_gemm_nhwc._chunks(problem, "forward", whole=True)] == [0]
        if xp is np:
            return
        x, _ = half_operand(xp, rng, operand_shapes(CASE, "forward")[0], "bfloat16")
        w, _ = half_operand(xp, rng, operand_shapes(CASE, "forward")[1], "bfloat16", scale=0.5)
        plain = run("forward", x, w, CASE, algo="implicit_gemm_nhwc")
        laid_out = run("forward", layout.to_channels_last(x), w, CASE, algo="implicit_gemm_nhwc")
        assert xp.array_equal(layout.contiguous(laid_out), plain)
    finally:
        implicit_gemm_nhwc.images_per_chunk.cache_clear()


def test_float_convolution_keeps_the_layout(xp, rng):
    x = xp.asarray(rng.standard_normal((2, 5, 8, 7)))
    w = xp.asarray(rng.standard_normal((6, 5, 3, 3)))
    y = conv.conv2d_forward(x, layout.to_channels_last(w), padding=1)
    assert layout.is_channels_last(y)
    assert xp.allclose(layout.contiguous(y), conv.conv2d_forward(x, w, padding=1), rtol=1e-12, atol=1e-12)
    out = layout.empty(y.shape, y.dtype, xp, True)
    assert conv.conv2d_forward(layout.to_channels_last(x), w, padding=1, out=out) is out
    assert xp.allclose(out, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_find_times_every_algorithm_in_the_calls_layout(monkeypatch, tmp_path, xp, rng, direction):
    """find times a channels-last call's algorithms on channels-last operands, through the copies an algorithm
    without channels-last kernels needs (what the call itself then runs), and keeps its results apart from the
    same shapes' C-contiguous ones."""
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path))
    # Every cache, not only the measurements: a plan an earlier test made for these shapes (on the GPU, where the
    # default is to find) would be used again without a find.
    conv.registry.clear_caches()
    conv.selection.clear_cache()
    timed = []  # (channels-last problem, first operand channels-last, out channels-last) of each timed call
    original = conv.registry.ConvAlgorithm.run_in_layout

    def recording(self, direction, first, second, problem, out, accumulate, workspace):
        timed.append((problem.channels_last, layout.is_channels_last(first), layout.is_channels_last(out)))
        original(self, direction, first, second, problem, out, accumulate, workspace)

    monkeypatch.setattr(conv.registry.ConvAlgorithm, "run_in_layout", recording)
    x, w = xp.asarray(rng.standard_normal((2, 5, 8, 7))), xp.asarray(rng.standard_normal((6, 5, 3, 3)))
    dy = xp.asarray(rng.standard_normal((2, 6, 8, 7)))
    calls = {"forward": lambda last: conv.conv2d_forward(last(x), last(w), padding=1),
             "backward_data": lambda last: conv.conv2d_backward_data(last(dy), last(w), x.shape, padding=1),
             "backward_filter": lambda last: conv.conv2d_backward_filter(last(x), last(dy), w.shape, padding=1)}
    try:
        with conv.settings(benchmark=True):
            laid_out = calls[direction](layout.to_channels_last)
            assert len(timed) > 2 and all(problem and first for problem, first, _ in timed)
            assert all(out == (direction != "backward_filter") for _, _, out in timed)
            timed.clear()
            plain = calls[direction](lambda a: a)
            assert len(timed) > 2 and not any(problem or first or out for problem, first, out in timed)
        assert [problem.channels_last for _, problem, _ in conv.selection._measured] == [True, False]
    finally:
        conv.registry.clear_caches()
        conv.selection.clear_cache()
    assert xp.allclose(layout.contiguous(laid_out), plain, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Batch norm and the element-wise primitives
# ----------------------------------------------------------------------------------------------
# (N, C, H, W): one channel block of two packs; C = 12 (no 16-byte pack fits a row of half words: single
# elements); C = 520 (channel blocks of 128-byte columns, the last with one pack of half words); many splits of rows;
# more than twice as many packs as a grid-stride launch has threads (2.4 M packs of 8 half words, 4.7 M of 4
# floats; an H200's grid holds 1.1 M threads), so that the element-wise row kernels' threads take their packs two
# at a time and then one (GPU only: NumPy has no grid).
PAIRED_PACKS_SHAPE = (64, 64, 64, 72)
BATCH_NORM_SHAPES = [(3, 16, 5, 7), (2, 12, 3, 5), (2, 520, 3, 3), (16, 64, 20, 20), PAIRED_PACKS_SHAPE]


@pytest.mark.parametrize("shape", BATCH_NORM_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("name", [None, "bfloat16", "float16"])
def test_batch_norm_on_channels_last(xp, rng, name, shape):
    """Training forward and backward, inference forward and backward, channels-last against C-contiguous: the
    GPU's row kernels sum in another order than its plane kernels, so the results agree to rounding."""
    if shape == PAIRED_PACKS_SHAPE and xp is np:
        pytest.skip("the GPU grid's pairs of packs (NumPy has no grid)")
    C = shape[1]
    if name is None:
        x, dy = (xp.asarray(rng.standard_normal(shape).astype(np.float32)) for _ in range(2))
    else:
        (x, _), (dy, _) = (half_operand(xp, rng, shape, name) for _ in range(2))
    weight = xp.asarray(rng.standard_normal(C).astype(np.float32))
    bias = xp.asarray(rng.standard_normal(C).astype(np.float32))
    y, mean, invstd = batchnorm.batch_norm_forward_training(x, weight, bias, None, None, relu=True)
    last = layout.to_channels_last(x)
    y_last, mean_last, invstd_last = batchnorm.batch_norm_forward_training(last, weight, bias, None, None, relu=True)
    assert layout.is_channels_last(y_last)
    wide = (lambda a: to_numpy(convert.half_to_float(layout.contiguous(a), name))) if name else to_numpy
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if name is None else {"rtol": 2.0**-7, "atol": 2.0**-7}
    np.testing.assert_allclose(to_numpy(mean_last), to_numpy(mean), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(to_numpy(invstd_last), to_numpy(invstd), rtol=1e-6)
    np.testing.assert_allclose(wide(y_last), wide(y), **tolerance)
    dx, dweight, dbias = batchnorm.batch_norm_backward_training(dy, x, weight, mean, invstd, relu_output=y)
    dx_last, dweight_last, dbias_last = batchnorm.batch_norm_backward_training(
        layout.to_channels_last(dy), last, weight, mean_last, invstd_last, relu_output=y_last)
    assert layout.is_channels_last(dx_last)
    np.testing.assert_allclose(wide(dx_last), wide(dx), **tolerance)
    np.testing.assert_allclose(to_numpy(dweight_last), to_numpy(dweight), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(to_numpy(dbias_last), to_numpy(dbias), rtol=1e-4, atol=1e-4)
    running_var = (1 / invstd**2).astype(np.float32)
    y_eval = batchnorm.batch_norm_forward_inference(last, weight, bias, mean, running_var, relu=True)
    assert layout.is_channels_last(y_eval)
    y_eval_plain = batchnorm.batch_norm_forward_inference(x, weight, bias, mean, running_var, relu=True)
    np.testing.assert_allclose(wide(y_eval), wide(y_eval_plain), **tolerance)
    dx_eval, dweight_eval, _ = batchnorm.batch_norm_backward_inference(layout.to_channels_last(dy), last, weight, mean,
                                                                       running_var, relu_output=y_eval)
    want_dx, want_dweight, _ = batchnorm.batch_norm_backward_inference(dy, x, weight, mean, running_var,
                                                                       relu_output=y_eval_plain)
    assert layout.is_channels_last(dx_eval)
    np.testing.assert_allclose(wide(dx_eval), wide(want_dx), **tolerance)
    np.testing.assert_allclose(to_numpy(dweight_eval), to_numpy(want_dweight), rtol=1e-4, atol=1e-4)


def test_element_wise_primitives_keep_the_layout(xp, rng):
    from minidnn.primitives import activation  # noqa: PLC0415

    a, b = (layout.to_channels_last(half_operand(xp, rng, (2, 16, 3, 5), "bfloat16")[0]) for _ in range(2))
    for result, want in ((activation.relu_forward(a), activation.relu_forward(layout.contiguous(a))),
                         (activation.add_relu_forward(a, b), activation.add_relu_forward(layout.contiguous(a),
                                                                                           layout.contiguous(b))),
                         (activation.relu_backward(b, a), activation.relu_backward(layout.contiguous(b),
                                                                                    layout.contiguous(a))),
                         (convert.add(a, b), convert.add(layout.contiguous(a), layout.contiguous(b))),
                         (convert.half_to_float(a, "bfloat16"),
                          convert.half_to_float(layout.contiguous(a), "bfloat16"))):
        assert layout.is_channels_last(result)
        assert xp.array_equal(layout.contiguous(result), want)
    relu_in_place = layout.to_channels_last(layout.contiguous(a).copy())
    assert activation.relu_forward(relu_in_place, out=relu_in_place) is relu_in_place
    assert xp.array_equal(layout.contiguous(relu_in_place), activation.relu_forward(layout.contiguous(a)))


# (x shape, kernel_size, stride, padding, dilation, ceil_mode): ResNet's window over an odd number of channels;
# CaffeNet's with ceil mode; a dilated window and one of 4 candidates an axis (the kernels' general loop).
MAX_POOL_CASES = [((2, 37, 13, 11), 3, 2, 1, 1, False), ((3, 8, 9, 10), 3, 2, 0, 1, True),
                  ((2, 5, 12, 12), 3, 1, 1, 2, False), ((1, 16, 7, 9), 4, 1, 1, 1, False)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_sum_is_laid_out_as_its_first_operand(xp, rng, dtype):
    """convert.add of two arrays of either layout: the sum in a's layout (PyTorch's rule), equal bit for bit to the
    sum of C-contiguous copies. On the GPU bfloat16 words go through convert.cu's kernel, which walks all three
    arrays as flat buffers; the other dtypes (and ml_dtypes' bfloat16 on the CPU) through layout.add."""
    if dtype == "bfloat16":
        a, b = (half_operand(xp, rng, (2, 6, 5, 3), "bfloat16")[0] for _ in range(2))
    else:
        a, b = (xp.asarray(rng.standard_normal((2, 6, 5, 3))).astype(dtype) for _ in range(2))
    want = convert.add(a, b)
    for a_last in (False, True):
        for b_last in (False, True):
            first, second = (layout.to_channels_last(v) if last else v for v, last in ((a, a_last), (b, b_last)))
            total = convert.add(first, second)
            assert layout.is_channels_last(total) == a_last
            assert xp.array_equal(layout.contiguous(total), want)


@pytest.mark.parametrize("return_indices", [False, True], ids=["taps", "indices"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("case", MAX_POOL_CASES, ids=lambda case: "x".join(map(str, case[0])))
def test_max_pooling_on_channels_last(xp, rng, case, dtype, return_indices):
    """y, the record of the maxima and dx come back channels-last (PyTorch's rule), each equal bit for bit to the
    C-contiguous computation (on the GPU: kernels of that layout, the same maxima and the same sums), of one gradient
    and of two parts. Values rounded to halves, so that windows hold ties, which must keep the first maximum in both
    layouts."""
    from minidnn.primitives import pooling  # noqa: PLC0415

    shape, *window = case
    values = xp.asarray(np.round(rng.standard_normal(shape) * 2) / 2)
    x = convert.float_to_half(values.astype(np.float32), dtype) if dtype == "bfloat16" else values.astype(dtype)
    y, record = pooling.max_pool2d_forward(layout.to_channels_last(x), *window, return_indices=return_indices)
    want_y, want_record = pooling.max_pool2d_forward(x, *window, return_indices=return_indices)
    assert layout.is_channels_last(y) and layout.is_channels_last(record)
    assert xp.array_equal(layout.contiguous(y), want_y) and xp.array_equal(layout.contiguous(record), want_record)
    dy = xp.asarray(rng.standard_normal(want_y.shape)).astype(np.float32)
    dy = convert.float_to_half(dy, dtype) if dtype == "bfloat16" else dy.astype(dtype)
    dx = pooling.max_pool2d_backward(layout.to_channels_last(dy), record, shape, *window)
    assert layout.is_channels_last(dx)
    assert xp.array_equal(layout.contiguous(dx), pooling.max_pool2d_backward(dy, want_record, shape, *window))
    # Two parts of the gradient (on the GPU the *_sum kernels of each layout), the second in either layout: the
    # backward of their sum, in dy's layout.
    dy_other = convert.add(dy, dy)
    want_dx = pooling.max_pool2d_backward(convert.add(dy, dy_other), want_record, shape, *window)
    for other in (dy_other, layout.to_channels_last(dy_other)):
        dx = pooling.max_pool2d_backward(layout.to_channels_last(dy), record, shape, *window, dy_other=other)
        assert layout.is_channels_last(dx) and xp.array_equal(layout.contiguous(dx), want_dx)
        dx = pooling.max_pool2d_backward(dy, want_record, shape, *window, dy_other=other)
        assert not layout.is_channels_last(dx) and xp.array_equal(dx, want_dx)


# ----------------------------------------------------------------------------------------------
# A network, end to end
# ----------------------------------------------------------------------------------------------
def _build(net, m):
    """conv-BN-ReLU, max pool, a residual block of stride 2 (conv-BN-ReLU, conv-BN; a 1 x 1 projection and BN
    beside; add, ReLU), average pool, linear: ResNet's layers in little. ``m`` is minidnn.nn or torch.nn."""
    net.stem = m.Sequential(m.Conv2d(3, 8, 3, padding=1, bias=False), m.BatchNorm2d(8), m.ReLU(), m.MaxPool2d(2))
    net.conv1, net.bn1 = m.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), m.BatchNorm2d(16)
    net.conv2, net.bn2 = m.Conv2d(16, 16, 3, padding=1), m.BatchNorm2d(16)
    net.projection = m.Sequential(m.Conv2d(8, 16, 1, stride=2, bias=False), m.BatchNorm2d(16))
    net.head = m.Sequential(m.AdaptiveAvgPool2d(1), m.Flatten(), m.Linear(16, 5))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        _build(self, nn)


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _build(self, torch.nn)


def _forward(net, x, relu):
    x = net.stem(x)
    y = net.bn2(net.conv2(relu(net.bn1(net.conv1(x)))))
    return net.head(relu(y + net.projection(x)))


def _torch_twin(ours):
    twin = _TorchNet().double()
    with torch.no_grad():
        for (name, p), (_, q) in zip(ours.named_parameters(), twin.named_parameters()):
            q.copy_(torch.from_numpy(p.numpy().copy()))
    return twin


def test_a_float64_step_matches_pytorch_channels_last():
    rng = np.random.default_rng(3)
    ours = _Net().double().to(memory_format=minidnn.channels_last)
    theirs = _torch_twin(ours).to(memory_format=torch.channels_last)
    values = rng.standard_normal((4, 3, 12, 10))
    target = rng.integers(0, 5, 4)
    seen = []
    ours.conv2.register_forward_hook(lambda module, inputs, output: seen.append(
        (inputs[0].is_contiguous(memory_format=minidnn.channels_last),
         output.is_contiguous(memory_format=minidnn.channels_last))))
    loss = F.cross_entropy(_forward(ours, minidnn.tensor(values), F.relu), minidnn.tensor(target))
    loss.backward()
    their_loss = torch.nn.functional.cross_entropy(_forward(theirs, torch.tensor(values), torch.relu),
                                                   torch.tensor(target))
    their_loss.backward()
    assert seen == [(True, True)]
    np.testing.assert_allclose(loss.item(), their_loss.item(), rtol=1e-12)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert element_strides(p.grad.data, p.shape) == torch_strides(q.grad), name
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_bfloat16_autocast_step_channels_last_equals_the_contiguous_one(device):
    """Two SGD steps with momentum, the same start: C-contiguous, then channels-last model and input."""
    pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    values = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    target = rng.integers(0, 5, 4)
    minidnn.manual_seed(0)
    start = _Net().state_dict()
    results = []
    for memory_format in (minidnn.contiguous_format, minidnn.channels_last):
        net = _Net()
        net.load_state_dict(start)
        net.to(device).to(memory_format=memory_format)
        optimizer = minidnn.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        x = minidnn.tensor(values).to(device).to(memory_format=memory_format)
        for _ in range(2):
            optimizer.zero_grad()
            with minidnn.autocast(device_type=device, dtype=minidnn.bfloat16):
                loss = F.cross_entropy(_forward(net, x, F.relu), minidnn.tensor(target).to(device))
            loss.backward()
            optimizer.step()
        results.append((loss.item(), {k: to_numpy(v.data) for k, v in net.state_dict().items()}))
    (loss_plain, plain), (loss_last, last) = results
    tolerance = 0 if device == "cpu" else 2e-2  # the GPU's split-K weight gradients and batch-norm sums vary
    assert abs(loss_last - loss_plain) <= tolerance * abs(loss_plain)
    for name in plain:
        np.testing.assert_allclose(last[name], plain[name], rtol=tolerance, atol=tolerance, err_msg=name)
