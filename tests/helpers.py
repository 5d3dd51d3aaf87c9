"""Test helpers: device transfer, tolerances and central-difference gradients."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from minidnn import backend


# Central differences with step 1e-6 carry a rounding error of about 1e-16·|f| / 1e-6 ≈ 1e-10·|f|, and the
# summed losses reach |f| ~ 10: tolerances a real bug (errors of 1e-3 and more) cannot hide in.
FD_TOLERANCE = dict(rtol=1e-6, atol=1e-7)


def float32_tolerance(xp, rtol: float, atol: float) -> dict:
    """A float32 comparison's tolerances, widened on the GPU to at least rtol 1e-5, atol 1e-6: CUDA's
    float exp, log and tanh are accurate to 1-2 ulp where NumPy's are nearly correctly rounded, and
    the kernels sum in another order."""
    if xp is np:
        return dict(rtol=rtol, atol=atol)
    return dict(rtol=max(rtol, 1e-5), atol=max(atol, 1e-6))


def to_numpy(array: Any) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return backend.to_device(array, "cpu")


def assert_close(actual: Any, expected: Any, rtol: float = 1e-10, atol: float = 1e-12, name: str = "") -> None:
    actual, expected = to_numpy(actual), to_numpy(expected)
    assert actual.shape == expected.shape, f"{name} shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name)


def numerical_gradient(f: Callable[..., Any], inputs: list[np.ndarray], index: int, weights: np.ndarray,
                       eps: float = 1e-6) -> np.ndarray:
    """∂/∂inputs[index] of sum(f(*inputs) · weights) by central differences, in float64 on NumPy.

    ``f`` maps NumPy arrays to one NumPy array. Cost: two calls of ``f`` per input element, so keep
    the perturbed input small.
    """
    inputs = [np.array(a, dtype=np.float64, copy=True) if i == index else a for i, a in enumerate(inputs)]
    x = inputs[index]
    grad = np.zeros_like(x)
    flat, grad_flat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        original = flat[i]
        flat[i] = original + eps
        plus = np.sum(np.asarray(f(*inputs)) * weights)
        flat[i] = original - eps
        minus = np.sum(np.asarray(f(*inputs)) * weights)
        flat[i] = original
        grad_flat[i] = (plus - minus) / (2 * eps)
    return grad


def gradcheck(f: Callable[..., Any], *inputs: np.ndarray, seed: int = 0, eps: float = 1e-6, rtol: float = 1e-6,
              atol: float = 1e-7, device: str = "cpu") -> None:
    """Autograd gradients of ``f`` (Tensors -> Tensor) against central differences, all in float64.

    Each input array becomes a float64 tensor requiring grad; the output is contracted with fixed
    random weights so every output element's gradient is checked. The default atol allows for the
    differences' rounding error, about 1e-16·|sum| / eps.
    """
    import minidnn  # noqa: PLC0415 - helpers are imported by primitive tests that do not need it

    inputs = [np.asarray(a, dtype=np.float64) for a in inputs]
    tensors = [minidnn.tensor(a, device=device, requires_grad=True) for a in inputs]
    out = f(*tensors)
    weights = np.random.default_rng(seed).standard_normal(out.shape)
    out.backward(minidnn.tensor(weights, device=device))

    def plain(*arrays: np.ndarray) -> np.ndarray:
        with minidnn.no_grad():
            return f(*(minidnn.tensor(a, device=device) for a in arrays)).numpy()

    for index, tensor in enumerate(tensors):
        expected = numerical_gradient(plain, inputs, index, weights, eps)
        assert tensor.grad is not None, f"input {index} got no gradient"
        np.testing.assert_allclose(tensor.grad.numpy(), expected, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {index}")


def cuda_constants(source: str, dtype: Any, defines: tuple[tuple[str, int], ...] = ()) -> dict[str, int]:
    """The ``constexpr int``/``bool`` constants of a ``.cu`` file of the primitives (``source`` as
    :func:`minidnn.primitives._cuda.read_source` takes it), evaluated for a build on ``dtype`` (the size of
    its ``scalar_t``), with ``defines`` and otherwise the file's ``#define`` defaults: so that a test can tie
    the Python launch code to the kernels' tiles."""
    import re  # noqa: PLC0415

    from minidnn.primitives import _cuda  # noqa: PLC0415

    def python(expression: str) -> str:  # C's a ? b : c (nested in its last part), || and && as Python
        ternary = re.match(r"^(.+?)\s*\?\s*(.+?)\s*:\s*(.+)$", expression)
        if ternary:
            condition, then, otherwise = ternary.groups()
            return f"({python(then)}) if ({python(condition)}) else ({python(otherwise)})"
        return expression.replace("||", " or ").replace("&&", " and ").replace("/", "//")

    text = _cuda.read_source(source).replace("sizeof(scalar_t)", str(np.dtype(dtype).itemsize))
    text = text.replace("sizeof(float)", "4")
    values: dict[str, Any] = {"true": True, "false": False, **dict(defines)}
    for name, value in re.findall(r"^#define\s+(\w+)\s+(\d+)\b", text, flags=re.MULTILINE):
        values.setdefault(name, int(value))
    for declaration in re.findall(r"^constexpr\s+(?:int|bool)\s+([^;]+);", text, flags=re.MULTILINE):
        for assignment in declaration.split(","):
            name, expression = (part.strip() for part in assignment.split("=", 1))
            values[name] = eval(python(expression), {}, dict(values))  # noqa: S307 - our own source
    return {name: value for name, value in values.items() if name not in ("true", "false")}


# ----------------------------------------------------------------------------------------------
# Half precision (float16, bfloat16 storage with float32 sums): the bound of tests/test_conv_half.py's docstring
# ----------------------------------------------------------------------------------------------
HALF_UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# Below the smallest normal the rounding error is absolute: half the subnormal step.
HALF_SUBNORMAL_ROUNDOFF = {"float16": 2.0 ** -25, "bfloat16": 2.0 ** -134}
FLOAT32_UNIT = 2.0 ** -24


def half_operand(xp: Any, rng: np.random.Generator, shape: tuple, name: str, scale: float = 1.0,
                 transposed: bool = False) -> tuple[Any, np.ndarray]:
    """(half storage on xp's device, its exact values as float64 on the CPU) of random normal values times
    ``scale``; with ``transposed`` both are the transposes of arrays of the reversed shape (views)."""
    from minidnn.primitives import convert  # noqa: PLC0415

    values = (rng.standard_normal(shape[::-1] if transposed else shape) * scale).astype(np.float32)
    stored = convert.float_to_half(xp.asarray(values), name)
    exact = to_numpy(convert.half_to_float(stored, name)).astype(np.float64)
    return (stored.T, exact.T) if transposed else (stored, exact)


def half_values(stored: Any, name: str) -> np.ndarray:
    """The float64 values of half storage ``stored`` (any layout), on the CPU."""
    from minidnn.primitives import convert  # noqa: PLC0415

    contiguous = stored if stored.flags.c_contiguous else stored.copy()
    return to_numpy(convert.half_to_float(contiguous, name)).astype(np.float64)


def assert_within_half_bound(got: Any, exact: np.ndarray, magnitude: np.ndarray, name: str, length: int,
                             label: str = "") -> None:
    """``got`` (half storage) within u·|exact| + (1 + u)·length·2⁻²⁴·magnitude + half the subnormal step of the float64
    ``exact``: one rounding to the half type after a float32 sum of ``length`` exact products."""
    values = half_values(got, name)
    u = HALF_UNIT_ROUNDOFF[name]
    bound = u * np.abs(exact) + (1 + u) * length * FLOAT32_UNIT * magnitude + HALF_SUBNORMAL_ROUNDOFF[name]
    error = np.abs(values - exact)
    assert np.all(np.isfinite(values)), f"{label}: {np.count_nonzero(~np.isfinite(values))} elements not finite"
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), (f"{label}: error {error[worst]:.3g} over the bound {bound[worst]:.3g} at {worst} "
                                    f"(exact {exact[worst]:.6g})")


def assert_half_twins_agree(on_gpu: Any, on_cpu: Any, name: str, sums_apart: np.ndarray) -> None:
    """The GPU's and the NumPy twin's half results: the same float32 sums in another order, rounded once each,
    so at most one unit in the last place of the larger apart plus what the two sums may differ by
    (``sums_apart``), and equal nearly everywhere."""
    gpu, cpu = half_values(on_gpu, name), half_values(on_cpu, name)
    larger = np.maximum(np.abs(gpu), np.abs(cpu))
    ulp = np.spacing(larger.astype(np.float16 if name == "float16" else np.float32)).astype(np.float64)
    if name == "bfloat16":
        ulp *= 2.0 ** 16  # bfloat16 keeps 7 of float32's 23 fraction bits
    assert np.all(np.abs(gpu - cpu) <= ulp + sums_apart)
    assert np.mean(gpu == cpu) > 0.9


class StandInArray:
    """What a packed launch (``_cuda.PackedLaunch``) reads of a CuPy array: its type and its address."""

    def __init__(self, address: int) -> None:
        self.data = SimpleNamespace(ptr=address)


def stand_in_driver(monkeypatch: Any) -> SimpleNamespace:
    """A stand-in CuPy (arrays: :class:`StandInArray`) whose driver records each launch with the bytes its parameter
    pointers point at: set the returned state's ``sizes`` to the parameters' sizes in bytes before launching. Its
    ``context`` is the current CUDA context; ``launches`` holds (function, grid, block, shared bytes, stream,
    parameters' bytes, extra) per launch. (A fixture: ``driver = pytest.fixture(name="driver")(stand_in_driver)``.)"""
    state = SimpleNamespace(context=7, launches=[], sizes=None)

    def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, parameters, extra):
        pointers = (ctypes.c_uint64 * len(state.sizes)).from_address(parameters)
        values = [ctypes.string_at(pointers[i], size) for i, size in enumerate(state.sizes)]
        state.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, values, extra))

    stand_in = SimpleNamespace(ndarray=StandInArray, cuda=SimpleNamespace(
        driver=SimpleNamespace(launchKernel=launch_kernel, ctxGetCurrent=lambda: state.context),
        stream=SimpleNamespace(get_current_stream_ptr=lambda: 4242)))
    monkeypatch.setattr(backend, "cupy", lambda: stand_in)
    return state
