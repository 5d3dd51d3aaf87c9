"""The naive engine's leaky ReLU, SiLU, GELU and layer norm give the primitives' numbers (the primitives are
tested against float64 references and PyTorch in test_primitives_activation.py and test_primitives_layernorm.py)."""
import numpy as np
import pytest

from minidnn import naive, primitives
from tests.helpers import assert_close

ACTIVATIONS = [("leaky_relu", (0.3,)), ("leaky_relu", (-0.7,)), ("silu", ()), ("gelu", ("none",)), ("gelu", ("tanh",))]


@pytest.mark.parametrize("name, options", ACTIVATIONS)
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_activations_agree_with_the_primitives(xp, rng, name, options, dtype, rtol):
    x = xp.asarray((rng.standard_normal((3, 4, 5)) * 3).astype(dtype))
    dy = xp.asarray(rng.standard_normal((3, 4, 5)).astype(dtype))
    ours = getattr(naive, f"{name}_forward")(x, *options)
    assert ours.dtype == dtype
    assert_close(ours, getattr(primitives, f"{name}_forward")(x, *options), rtol=rtol, atol=rtol, name="forward")
    assert_close(getattr(naive, f"{name}_backward")(dy, x, *options),
                 getattr(primitives, f"{name}_backward")(dy, x, *options), rtol=rtol, atol=rtol, name="backward")


def test_leaky_relu_and_silu_in_place(xp, rng):
    x = rng.standard_normal((4, 3))
    for name, options in (("leaky_relu", (0.2,)), ("silu", ())):
        array = xp.array(x, copy=True)
        assert getattr(naive, f"{name}_forward")(array, *options, out=array) is array
        assert_close(array, getattr(primitives, f"{name}_forward")(xp.asarray(x), *options), rtol=1e-15, atol=0)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_layer_norm_agrees_with_the_primitives(xp, rng, affine, dtype, rtol):
    x = xp.asarray((rng.standard_normal((3, 2, 4, 5)) * 2 + 1).astype(dtype))
    dy = xp.asarray(rng.standard_normal((3, 2, 4, 5)).astype(dtype))
    weight = xp.asarray(rng.standard_normal((4, 5)).astype(dtype)) if affine else None
    bias = xp.asarray(rng.standard_normal((4, 5)).astype(dtype)) if affine else None
    ours = naive.layer_norm_forward(x, (4, 5), weight, bias, 1e-3)
    theirs = primitives.layer_norm_forward(x, (4, 5), weight, bias, 1e-3)
    for name, a, b in zip(("y", "mean", "invstd"), ours, theirs):
        assert a.dtype == dtype
        assert_close(a, b, rtol=rtol, atol=rtol, name=name)
    grads = naive.layer_norm_backward(dy, x, (4, 5), weight, *theirs[1:])
    for name, a, b in zip(("dx", "dweight", "dbias"), grads,
                          primitives.layer_norm_backward(dy, x, (4, 5), weight, *theirs[1:])):
        assert a.dtype == dtype
        assert_close(a, b, rtol=10 * rtol, atol=10 * rtol, name=name)
