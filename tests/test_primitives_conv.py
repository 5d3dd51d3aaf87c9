"""Convolution primitives: every registered algorithm, three directions, against a loop reference.

The reference here is written independently of minidnn: explicit loops over output pixels and
groups, each window cut out by slicing, in float64.
"""
import numpy as np
import pytest

from minidnn.primitives import conv
from minidnn.primitives.conv import api, registry
from tests.helpers import assert_close, to_numpy

# (N, C, H, W, K, R, S, stride, padding, dilation, groups): odd, non-square, strided, dilated, grouped
CASES = [
    (2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1),
    (1, 4, 8, 5, 6, 2, 3, (2, 1), (2, 0), 1, 2),
    (3, 6, 9, 11, 6, 3, 2, 3, 2, (2, 1), 6),   # depthwise, stride 3, dilation 2
    (2, 4, 10, 7, 8, 5, 4, (4, 2), (3, 1), 1, 1),  # stride 4, padding 3
    (1, 2, 6, 6, 3, 3, 3, 2, 0, 2, 1),         # dilation 2, no padding
    (2, 8, 5, 6, 4, 1, 1, 1, 0, 1, 2),         # 1x1 grouped
    (1, 3, 4, 4, 2, 4, 4, 1, 0, 1, 1),         # kernel as large as the input
]


def loop_reference(x, w, stride, padding, dilation, groups):
    """y, and functions for dx and dw, by explicit loops over output pixels (float64)."""
    sh, sw = stride if isinstance(stride, tuple) else (stride, stride)
    ph, pw = padding if isinstance(padding, tuple) else (padding, padding)
    dh, dw = dilation if isinstance(dilation, tuple) else (dilation, dilation)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    Kg = K // groups
    xp_ = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    xp_[:, :, ph:ph + H, pw:pw + W] = x
    P = (H + 2 * ph - dh * (R - 1) - 1) // sh + 1
    Q = (W + 2 * pw - dw * (S - 1) - 1) // sw + 1

    def window(p, q):
        return (slice(None), slice(None), slice(p * sh, p * sh + dh * (R - 1) + 1, dh),
                slice(q * sw, q * sw + dw * (S - 1) + 1, dw))

    y = np.zeros((N, K, P, Q))
    for g in range(groups):
        cs, ks = slice(g * Cg, (g + 1) * Cg), slice(g * Kg, (g + 1) * Kg)
        for p in range(P):
            for q in range(Q):
                patch = xp_[window(p, q)][:, cs]  # N, Cg, R, S
                y[:, ks, p, q] = np.tensordot(patch, w[ks], axes=([1, 2, 3], [1, 2, 3]))

    def backward_data(dy):
        dx = np.zeros_like(xp_)
        for g in range(groups):
            cs, ks = slice(g * Cg, (g + 1) * Cg), slice(g * Kg, (g + 1) * Kg)
            for p in range(P):
                for q in range(Q):
                    region = window(p, q)
                    dx[region[0], cs, region[2], region[3]] += np.tensordot(dy[:, ks, p, q], w[ks], axes=(1, 0))
        return dx[:, :, ph:ph + H, pw:pw + W]

    def backward_filter(dy):
        dwt = np.zeros_like(w)
        for g in range(groups):
            cs, ks = slice(g * Cg, (g + 1) * Cg), slice(g * Kg, (g + 1) * Kg)
            for p in range(P):
                for q in range(Q):
                    patch = xp_[window(p, q)][:, cs]
                    dwt[ks] += np.tensordot(dy[:, ks, p, q], patch, axes=(0, 0))
        return dwt

    return y, backward_data, backward_filter


ALGORITHMS = list(registry.algorithms())


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_all_directions_match_loop_reference_float64(xp, rng, algo, case):
    N, C, H, W, K, R, S, stride, padding, dilation, groups = case
    x = rng.standard_normal((N, C, H, W))
    w = rng.standard_normal((K, C // groups, R, S))
    y_ref, backward_data, backward_filter = loop_reference(x, w, stride, padding, dilation, groups)
    dy = rng.standard_normal(y_ref.shape)
    args = (stride, padding, dilation, groups)
    y = conv.conv2d_forward(xp.asarray(x), xp.asarray(w), *args, algo=algo)
    assert_close(y, y_ref, name="forward")
    dx = conv.conv2d_backward_data(xp.asarray(dy), xp.asarray(w), x.shape, *args, algo=algo)
    assert_close(dx, backward_data(dy), name="backward_data")
    dw = conv.conv2d_backward_filter(xp.asarray(x), xp.asarray(dy), w.shape, *args, algo=algo)
    assert_close(dw, backward_filter(dy), name="backward_filter")


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_float32_within_float32_tolerance(xp, rng, algo):
    N, C, H, W, K, R, S, stride, padding, dilation, groups = CASES[3]
    x = rng.standard_normal((N, C, H, W))
    w = rng.standard_normal((K, C // groups, R, S))
    y_ref, backward_data, backward_filter = loop_reference(x, w, stride, padding, dilation, groups)
    dy = rng.standard_normal(y_ref.shape)
    f32 = lambda a: xp.asarray(a.astype(np.float32))  # noqa: E731
    args = (stride, padding, dilation, groups)
    y = conv.conv2d_forward(f32(x), f32(w), *args, algo=algo)
    assert y.dtype == np.float32
    assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    assert_close(conv.conv2d_backward_data(f32(dy), f32(w), x.shape, *args, algo=algo), backward_data(dy),
                 rtol=1e-4, atol=1e-4)
    assert_close(conv.conv2d_backward_filter(f32(x), f32(dy), w.shape, *args, algo=algo), backward_filter(dy),
                 rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algo", [name for name in ALGORITHMS if name != "reference"])
def test_chunking_under_a_workspace_limit_gives_the_same_result(xp, rng, algo):
    x = rng.standard_normal((7, 4, 9, 8))
    w = rng.standard_normal((6, 2, 3, 3))
    dy = rng.standard_normal((7, 6, 9, 8))
    args = (1, 1, 1, 2)
    problem = conv.ConvProblem(7, 4, 9, 8, 6, 3, 3, (1, 1), (1, 1), (1, 1), 2, np.dtype(np.float64), "cpu")
    per_image = registry.get(algo).workspace_bytes(problem.with_batch(1), "forward")
    limit = int(2.5 * per_image)  # micro-batches of 2, 2, 2, 1
    seen = []
    api.call_observer = lambda direction, problem, algorithm, batch, workspace: seen.append((batch, workspace))
    try:
        chunked = (conv.conv2d_forward(xp.asarray(x), xp.asarray(w), *args, algo=algo, workspace_limit=limit),
                   conv.conv2d_backward_data(xp.asarray(dy), xp.asarray(w), x.shape, *args, algo=algo,
                                             workspace_limit=limit),
                   conv.conv2d_backward_filter(xp.asarray(x), xp.asarray(dy), w.shape, *args, algo=algo,
                                               workspace_limit=limit))
    finally:
        api.call_observer = None
    assert [batch for batch, _ in seen] == [2, 2, 2]
    assert all(workspace <= limit for _, workspace in seen)
    whole = (conv.conv2d_forward(x, w, *args, algo="reference"),
             conv.conv2d_backward_data(dy, w, x.shape, *args, algo="reference"),
             conv.conv2d_backward_filter(x, dy, w.shape, *args, algo="reference"))
    for got, expected in zip(chunked, whole):
        assert_close(got, expected)


def test_backward_filter_writes_or_accumulates_into_out(xp, rng):
    x = xp.asarray(rng.standard_normal((3, 2, 5, 5)))
    dy = xp.asarray(rng.standard_normal((3, 4, 5, 5)))
    expected = to_numpy(conv.conv2d_backward_filter(x, dy, (4, 2, 3, 3), 1, 1, algo="reference"))
    out = xp.full((4, 2, 3, 3), 7.0)
    result = conv.conv2d_backward_filter(x, dy, (4, 2, 3, 3), 1, 1, out=out)
    assert result is out
    assert_close(out, expected)
    conv.conv2d_backward_filter(x, dy, (4, 2, 3, 3), 1, 1, out=out, accumulate=True)
    assert_close(out, 2 * expected)
    # The micro-batching seam: two halves into one array, the first writes, the second adds.
    out[...] = 123.0
    conv.conv2d_backward_filter(x[:1], dy[:1], (4, 2, 3, 3), 1, 1, out=out)
    conv.conv2d_backward_filter(x[1:], dy[1:], (4, 2, 3, 3), 1, 1, out=out, accumulate=True)
    assert_close(out, expected)


def test_auto_prefers_gemm_and_falls_back_to_reference_when_nothing_fits():
    problem = conv.ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, np.dtype(np.float32), "cpu")
    assert registry.choose(problem, "forward", "auto", 1 << 30).name == "gemm"
    assert registry.choose(problem, "forward", "auto", 0).name == "reference"


def test_settings_force_an_algorithm_and_a_limit(rng):
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    seen = []
    api.call_observer = lambda direction, problem, algorithm, batch, workspace: seen.append((algorithm.name, batch))
    try:
        with conv.settings(algo="reference"):
            conv.conv2d_forward(x, w)
        with conv.settings(algo="gemm", workspace_limit=3 * 3 * 3 * 4 * 4 * 8):  # one image's columns
            conv.conv2d_forward(x, w)
        conv.conv2d_forward(x, w)
    finally:
        api.call_observer = None
    assert seen == [("reference", 2), ("gemm", 1), ("gemm", 2)]


def test_set_workspace_limit_and_environment(monkeypatch):
    monkeypatch.setitem(registry._defaults, "workspace_limit", None)
    monkeypatch.setenv("MINIDNN_WORKSPACE_MB", "3")
    assert conv.workspace_limit() == 3 << 20
    conv.set_workspace_limit(1234)
    assert conv.workspace_limit() == 1234
    with pytest.raises(TypeError, match="workspace_limit"):
        conv.set_workspace_limit(1.5)
    with pytest.raises(ValueError, match="workspace_limit"):
        conv.set_workspace_limit(-1)


@pytest.mark.parametrize("x_shape, w_shape, kwargs, error, match", [
    ((2, 3, 8), (4, 3, 3, 3), {}, ValueError, "input must be 4-D"),
    ((2, 3, 8, 8), (4, 3, 3), {}, ValueError, "weight must be 4-D"),
    ((2, 3, 8, 8), (4, 2, 3, 3), {}, ValueError, "channel mismatch"),
    ((2, 4, 8, 8), (4, 1, 3, 3), {"groups": 3}, ValueError, "groups=3 must divide the input channels"),
    ((2, 4, 8, 8), (6, 1, 3, 3), {"groups": 4}, ValueError, "must divide the output channels"),
    ((2, 3, 4, 4), (4, 3, 7, 3), {}, ValueError, "larger than the padded input"),
    ((2, 3, 4, 4), (4, 3, 3, 3), {"dilation": 3}, ValueError, "dilated 7x7"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"stride": 1.5}, TypeError, "stride must be an int or a pair"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"stride": 0}, ValueError, "stride must be >= 1"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"padding": -1}, ValueError, "padding must be >= 0"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"groups": 1.0}, TypeError, "groups must be an int"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"algo": "winograd9"}, ValueError, "algo must be 'auto' or one of"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"algo": "gemm", "workspace_limit": 10}, ValueError, "over the limit"),
])
def test_bad_arguments_name_the_problem(x_shape, w_shape, kwargs, error, match):
    with pytest.raises(error, match=match):
        conv.conv2d_forward(np.zeros(x_shape), np.zeros(w_shape), **kwargs)


def test_dtype_errors():
    with pytest.raises(TypeError, match="input must be a float32 or float64"):
        conv.conv2d_forward(np.zeros((1, 1, 3, 3), np.int64), np.zeros((1, 1, 1, 1)))
    with pytest.raises(TypeError, match="same dtype"):
        conv.conv2d_forward(np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 1, 1)))
    with pytest.raises(ValueError, match="grad_output must have the output's shape"):
        conv.conv2d_backward_data(np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 1, 1)), (1, 1, 3, 3))
    with pytest.raises(ValueError, match="out must be"):
        conv.conv2d_backward_filter(np.zeros((1, 1, 3, 3)), np.zeros((1, 1, 3, 3)), (1, 1, 1, 1),
                                    out=np.zeros((2, 1, 1, 1)))
