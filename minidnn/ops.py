"""Graph nodes of the tensor's own operations: arithmetic, reductions, shapes, indexing, joins,
and the element-wise activations and softmax that tensors have as methods.

Each class is one :class:`~minidnn.autograd.Function` working on plain arrays; :mod:`minidnn.tensor`
gives them their PyTorch names (``a + b``, ``x.sum()``, ``x.relu()``) and :mod:`minidnn.functional`
adds the neural-network operations. Activations and softmax compute through the current engine
(``library``), like every neural-network operation.

In-place forms (``add_``, ``mul_``, ``relu_``) run the same nodes with ``out=`` the target's array
(:meth:`~minidnn.autograd.Function.apply_in_place`); a node whose backward would need the values it
overwrites saves a copy of them.
"""
from __future__ import annotations

import operator
import warnings
from typing import Any

import numpy as np

from . import backend
from .autograd import Function, half_tensors, is_half, unbroadcast
from .engine import library
from .primitives import blas, convert, layout


def _xp(*arrays: Any):
    return backend.get_array_module(*arrays)


# ----------------------------------------------------------------------------------------------
# Arithmetic
# ----------------------------------------------------------------------------------------------
class AddFunction(Function):
    def forward(self, a, b, out=None):
        return layout.elementwise(operator.add, a, b) if out is None else _xp(a).add(a, b, out=out)

    def backward(self, grad):
        return grad, grad


class SubFunction(Function):
    def forward(self, a, b, out=None):
        return layout.elementwise(operator.sub, a, b) if out is None else _xp(a).subtract(a, b, out=out)

    def backward(self, grad):
        return grad, -grad


class MulFunction(Function):
    def forward(self, a, b, out=None):
        # Written over a (a.mul_(b)), a's old values are kept for b's gradient as a copy.
        kept_a = (a if out is not a else a.copy()) if self.needs_input_grad[1] else None
        self.save_for_backward(kept_a, b if self.needs_input_grad[0] else None)
        return layout.elementwise(operator.mul, a, b) if out is None else _xp(a).multiply(a, b, out=out)

    def backward(self, grad):
        a, b = self.saved
        return (grad * b if self.needs_input_grad[0] else None), (grad * a if self.needs_input_grad[1] else None)


class DivFunction(Function):
    def forward(self, a, b, out=None):
        kept_a = (a if out is not a else a.copy()) if self.needs_input_grad[1] else None
        self.save_for_backward(kept_a, b)
        return layout.elementwise(operator.truediv, a, b) if out is None else _xp(a).divide(a, b, out=out)

    def backward(self, grad):
        a, b = self.saved
        grad_a = grad / b if self.needs_input_grad[0] else None
        grad_b = -grad * a / (b * b) if self.needs_input_grad[1] else None
        return grad_a, grad_b


class PowFunction(Function):
    def forward(self, base, exponent):
        out = layout.elementwise(operator.pow, base, exponent)
        self.save_for_backward(base, exponent, out)
        return out

    def backward(self, grad):
        base, exponent, out = self.saved
        xp = _xp(grad)
        grad_base = grad * exponent * base ** (exponent - 1) if self.needs_input_grad[0] else None
        grad_exponent = grad * out * xp.log(base) if self.needs_input_grad[1] else None
        return grad_base, grad_exponent


class NegFunction(Function):
    def forward(self, a):
        return layout.elementwise(operator.neg, a)

    def backward(self, grad):
        return -grad


class MatMulFunction(Function):
    """a @ b with NumPy's rules (1-D operands, batched broadcasting). float16 and bfloat16 operands go to
    the half-precision GEMMs (float32 sums, one rounding): 2-D, or 3-D with one batch size."""

    half_inputs = True

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return _matmul(a, b)

    def backward(self, grad):
        a, b = self.saved
        xp = _xp(grad)
        # Promote 1-D operands to matrices as matmul does; the engine sums away broadcast batch axes.
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        g = grad.reshape(batch + (a2.shape[-2], b2.shape[-1]))
        grad_a = grad_b = None
        if self.needs_input_grad[0]:
            grad_a = _matmul(g, xp.swapaxes(b2, -1, -2))
            grad_a = grad_a[..., 0, :] if a.ndim == 1 else grad_a
        if self.needs_input_grad[1]:
            grad_b = _matmul(xp.swapaxes(a2, -1, -2), g)
            grad_b = grad_b[..., 0] if b.ndim == 1 else grad_b
        return grad_a, grad_b


def _matmul(a: Any, b: Any) -> Any:
    """a @ b; half-precision operands through the half GEMMs, which take 2-D or same-batch 3-D operands."""
    if not (is_half(a) or is_half(b)):
        return a @ b
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: both operands must have one dtype, got {a.dtype} and {b.dtype}")
    if a.ndim == b.ndim == 2:
        return blas.gemm(a, b)
    if a.ndim == b.ndim == 3 and a.shape[0] == b.shape[0]:
        return blas.gemm_batched(a, b)
    raise ValueError(f"matmul of float16 or bfloat16 operands takes 2-D ones or 3-D ones of one batch size, got "
                     f"shapes {tuple(a.shape)} and {tuple(b.shape)}")


class ExpFunction(Function):
    def forward(self, a):
        out = layout.elementwise(_xp(a).exp, a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        return grad * self.saved[0]


class LogFunction(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return layout.elementwise(_xp(a).log, a)

    def backward(self, grad):
        return grad / self.saved[0]


class SqrtFunction(Function):
    def forward(self, a):
        out = layout.elementwise(_xp(a).sqrt, a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        return grad / (2 * self.saved[0])


class AbsFunction(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return layout.elementwise(_xp(a).abs, a)

    def backward(self, grad):
        return grad * _xp(grad).sign(self.saved[0])


class ClampFunction(Function):
    """min(max(a, low), high), either bound a number, an array (broadcast against a) or None.

    The gradients are PyTorch's, ties and crossed bounds included: a's flows where
    low <= a <= high; low's where a < low < high; high's where a > high or high < low (the output
    is then high everywhere)."""

    def forward(self, a, low, high):
        xp = _xp(a)
        out = a if low is None else layout.elementwise(xp.maximum, a, low)
        out = out if high is None else layout.elementwise(xp.minimum, out, high)
        inside = None
        if self.needs_input_grad[0]:
            inside = xp.ones(a.shape, dtype=bool) if low is None else a >= low
            inside = inside if high is None else inside & (a <= high)
        below = above = None
        if self.needs_input_grad[1]:
            below = a < low if high is None else (a < low) & (low < high)
        if self.needs_input_grad[2]:
            above = a > high if low is None else (a > high) | (high < low)
        self.save_for_backward(inside, below, above)
        return out if out is not a else a.copy()

    def backward(self, grad):
        zero = grad.dtype.type(0)
        xp = _xp(grad)
        return tuple(None if mask is None else xp.where(mask, grad, zero) for mask in self.saved)


class WhereFunction(Function):
    def forward(self, condition, a, b):
        self.save_for_backward(condition)
        return layout.elementwise(_xp(condition, a, b).where, condition, a, b)

    def backward(self, grad):
        (condition,) = self.saved
        zero = grad.dtype.type(0)
        xp = _xp(grad)
        return None, xp.where(condition, grad, zero), xp.where(condition, zero, grad)


class CloneFunction(Function):
    """A copy of a, in the graph: the gradient passes through unchanged."""

    half_inputs = True  # moves values, never computes on them

    def forward(self, a):
        return a.copy()

    def backward(self, grad):
        return grad


class GradientHookFunction(Function):
    """The identity in the forward (the output is a view of a: one memory, one version counter); in
    the backward ``hook(grad)`` runs and what it returns, unless None, becomes the gradient passed on.
    The seam module hooks use to see (and replace) the gradients at a module's inputs and outputs."""

    half_inputs = True  # moves values, never computes on them

    def forward(self, a, hook):
        self.hook = hook
        return a.view()

    def backward(self, grad):
        replaced = self.hook(grad)
        return grad if replaced is None else replaced


class CastFunction(Function):
    """``a`` as ``dtype`` (a NumPy dtype or ``ml_dtypes.bfloat16``); the gradient is cast back to a's."""

    half_inputs = True

    def forward(self, a, dtype):
        self.source_dtype = _logical_dtype(a)
        out = convert.cast(a, dtype)
        half_tensors.made = half_tensors.made or is_half(out)
        self.rounds_float32_to_bfloat16 = self.source_dtype == np.float32 and convert.half_type_of(out) == "bfloat16"
        return out

    def backward(self, grad):
        if grad.dtype == self.source_dtype:  # already widened by its producer (takes_float32_gradient)
            return grad
        return convert.cast(grad, self.source_dtype)


class LayoutFunction(Function):
    """``a`` laid out channels-last or C-contiguous (the same values); the gradient comes back in a's layout
    (autograd lays every gradient out as its tensor)."""

    half_inputs = True

    def forward(self, a, channels_last):
        return layout.like(a, channels_last)

    def backward(self, grad):
        return grad


def takes_float32_gradient(parent: Any) -> bool:
    """Whether ``parent`` (the node an input came from) is a cast of a float32 tensor to bfloat16, whose backward
    widens the gradient back to float32: a producer that sums the gradient in float32 may then hand it over
    as it is, unrounded and one conversion fewer (autocast's weight casts). Not for float16: its narrow range
    is what a loss scaler's overflow check looks at, so its gradients keep their rounding."""
    return type(parent) is CastFunction and parent.rounds_float32_to_bfloat16


def add_gradients(a: Any, b: Any) -> Any:
    """The sum of two gradients of one half-precision tensor: of one dtype, :func:`convert.add`; a float32 one
    (see :func:`takes_float32_gradient`) and a half one, in float32."""
    if a.dtype == b.dtype:
        return convert.add(a, b)
    return (a if a.dtype == np.float32 else convert.half_to_float(a, convert.half_type_of(a))) + \
        (b if b.dtype == np.float32 else convert.half_to_float(b, convert.half_type_of(b)))


def _logical_dtype(array: Any) -> np.dtype:
    """The dtype ``array`` holds: bfloat16 for GPU words (convert.py's storage), else its own."""
    return convert.bfloat16() if convert.is_bfloat16_words(array) else array.dtype


def widen_to_float32(tensor: Any) -> Any:
    """A half-precision tensor as float32, in the graph: how operations without half kernels take one."""
    return CastFunction.apply(tensor, dtype=np.dtype(np.float32))


half_tensors.widen, half_tensors.add = widen_to_float32, add_gradients


class ToDeviceFunction(Function):
    half_inputs = True

    def forward(self, a, target):
        self.source = backend.device_of(a)
        return convert.to_device(a, target)

    def backward(self, grad):
        return convert.to_device(grad, self.source)


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------
class SumFunction(Function):
    def forward(self, a, axes=None, keepdim=False):
        self.shape, self.axes, self.keepdim = a.shape, axes, keepdim
        return a.sum(axis=axes, keepdims=keepdim)

    def backward(self, grad):
        xp = _xp(grad)
        if not self.keepdim and self.axes is not None:
            grad = xp.expand_dims(grad, self.axes)
        return xp.broadcast_to(grad, self.shape)


class MeanFunction(Function):
    def forward(self, a, axes=None, keepdim=False):
        self.shape, self.axes, self.keepdim = a.shape, axes, keepdim
        out = a.mean(axis=axes, keepdims=keepdim)
        self.count = a.size // max(out.size, 1) if a.size else 1  # elements averaged per output
        return out

    def backward(self, grad):
        xp = _xp(grad)
        if not self.keepdim and self.axes is not None:
            grad = xp.expand_dims(grad, self.axes)
        return xp.broadcast_to(grad / self.count, self.shape)


class VarFunction(Function):
    """Σ(a − mean)² / max(0, count − correction) over ``axes`` (all when None): the variance with
    PyTorch's ``correction`` (1: Bessel's, the unbiased estimate; 0: the population variance). No
    degrees of freedom left gives inf (or NaN for 0/0), as in PyTorch."""

    def forward(self, a, axes=None, correction=1.0, keepdim=False):
        xp = _xp(a)
        centered = a - a.mean(axis=axes, keepdims=True)
        count = a.size if axes is None else int(np.prod([a.shape[axis] for axis in axes]))
        self.axes, self.keepdim = axes, keepdim
        self.divisor = max(count - correction, 0)
        self.save_for_backward(centered if self.needs_input_grad[0] else None)
        if self.divisor <= 0:
            warnings.warn("var(): degrees of freedom is <= 0: correction should be strictly less than the number "
                          "of elements reduced", UserWarning, stacklevel=4)
        squares = (centered * centered).sum(axis=axes, keepdims=keepdim)
        with np.errstate(divide="ignore", invalid="ignore"):  # x/0: inf or NaN, as PyTorch
            return xp.true_divide(squares, squares.dtype.type(self.divisor))

    def backward(self, grad):
        (centered,) = self.saved
        xp = _xp(grad)
        if not self.keepdim and self.axes is not None:
            grad = xp.expand_dims(grad, self.axes)
        with np.errstate(divide="ignore", invalid="ignore"):
            return grad * centered * grad.dtype.type(2.0 / self.divisor if self.divisor else np.inf)


class TopKFunction(Function):
    """The k largest (or smallest) values of a along ``axis``, in order; their indices go to
    ``indices_out`` (a list the caller reads). The gradient goes back to the chosen elements."""

    def forward(self, a, k, axis, largest, indices_out):
        xp = _xp(a)
        order = xp.argsort(a, axis=axis)  # ascending, NaN last (the largest, as PyTorch ranks it)
        if largest:
            order = xp.flip(order, axis=axis)
        self.index = xp.take(order, xp.arange(k), axis=axis)
        self.shape, self.axis = a.shape, axis
        indices_out.append(self.index)
        return xp.take_along_axis(a, self.index, axis=axis)

    def backward(self, grad):
        xp = _xp(grad)
        out = xp.zeros(self.shape, dtype=grad.dtype)
        xp.put_along_axis(out, self.index, grad, axis=self.axis)
        return out


class MaxReduceFunction(Function):
    """max (or min) over one axis or all; the gradient goes to the first extreme element."""


    def forward(self, a, axis=None, keepdim=False, use_min=False):
        xp = _xp(a)
        flat = a.reshape(-1) if axis is None else a
        index = (xp.argmin if use_min else xp.argmax)(flat, axis=0 if axis is None else axis)
        self.shape, self.axis, self.keepdim, self.index = a.shape, axis, keepdim, index
        if axis is None:
            return flat[index]
        values = xp.take_along_axis(a, xp.expand_dims(index, axis), axis=axis)
        return values if keepdim else values.squeeze(axis)

    def backward(self, grad):
        xp = _xp(grad)
        out = xp.zeros(self.shape, dtype=grad.dtype)
        if self.axis is None:
            out.reshape(-1)[self.index] = grad
            return out
        grad = grad if self.keepdim else xp.expand_dims(grad, self.axis)
        xp.put_along_axis(out, xp.expand_dims(self.index, self.axis), grad, axis=self.axis)
        return out


# ----------------------------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------------------------
class ReshapeFunction(Function):
    half_inputs = True  # moves values, never computes on them

    def forward(self, a, shape):
        self.shape = a.shape
        return a.reshape(shape)

    def backward(self, grad):
        return grad.reshape(self.shape)


class PermuteFunction(Function):
    half_inputs = True  # moves values, never computes on them

    def forward(self, a, dims):
        self.inverse = tuple(np.argsort(dims))
        return a.transpose(dims)

    def backward(self, grad):
        return grad.transpose(self.inverse)


class ExpandFunction(Function):
    def forward(self, a, shape):
        self.shape = a.shape
        return _xp(a).broadcast_to(a, shape)

    def backward(self, grad):
        return unbroadcast(grad, self.shape)


class RepeatFunction(Function):
    """a tiled ``repeats[i]`` times along each axis (PyTorch's ``repeat``, NumPy's ``tile``); a gets
    leading axes of size 1 when ``repeats`` is longer. The gradient sums the copies."""

    def forward(self, a, repeats):
        self.shape, self.repeats = a.shape, repeats
        self.padded = (1,) * (len(repeats) - a.ndim) + tuple(a.shape)
        return _xp(a).tile(a.reshape(self.padded), repeats)

    def backward(self, grad):
        # (r0·s0, r1·s1, ...) -> (r0, s0, r1, s1, ...), summed over the r axes.
        split = tuple(n for pair in zip(self.repeats, self.padded) for n in pair)
        return grad.reshape(split).sum(axis=tuple(range(0, len(split), 2))).reshape(self.shape)


# ----------------------------------------------------------------------------------------------
# Indexing and joins
# ----------------------------------------------------------------------------------------------
def _is_basic_index(index: Any) -> bool:
    """Whether ``index`` is basic indexing (ints, slices, Ellipsis, None), which reaches no element twice."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(part is None or part is Ellipsis or isinstance(part, slice)
               or (isinstance(part, (int, np.integer)) and not isinstance(part, (bool, np.bool_))) for part in parts)


class GetItemFunction(Function):
    def forward(self, a, index):
        self.shape, self.dtype, self.index = a.shape, a.dtype, index
        return a[index]

    def backward(self, grad):
        xp = _xp(grad)
        out = xp.zeros(self.shape, dtype=self.dtype)
        if _is_basic_index(self.index):  # each element reached once: a copy, not a scatter-add
            out[self.index] = grad
        else:
            backend.add_at(out, self.index, grad)
        return out


class PadFunction(Function):
    """y = a with ``pad`` (before, after) per axis, last axis first as torch.nn.functional.pad takes them, filled
    with ``value``; a negative width crops. The gradient is y's gradient over a's part (zero where a was cropped)."""

    def forward(self, a, pad, value):
        widths = [(0, 0)] * (a.ndim - len(pad) // 2) + [(pad[i], pad[i + 1]) for i in range(len(pad) - 2, -1, -2)]
        shape = tuple(n + before + after for n, (before, after) in zip(a.shape, widths))
        if any(n < 0 for n in shape):
            raise ValueError(f"pad {tuple(pad)} crops a tensor of shape {tuple(a.shape)} to the negative size {shape}")
        # Where a's kept part comes from and where it lands in y.
        self.source = tuple(slice(max(0, -before), n - max(0, -after)) for n, (before, after) in zip(a.shape, widths))
        self.target = tuple(slice(max(0, before), max(0, before) + part.stop - part.start)
                            for (before, _), part in zip(widths, self.source))
        self.shape, self.dtype = a.shape, a.dtype
        xp = _xp(a)
        out = xp.zeros(shape, dtype=a.dtype) if value == 0 else xp.full(shape, value, dtype=a.dtype)
        out[self.target] = a[self.source]
        return out

    def backward(self, grad):
        part = grad[self.target]
        if part.shape == tuple(self.shape):  # nothing cropped
            return _xp(grad).ascontiguousarray(part)
        out = _xp(grad).zeros(self.shape, dtype=self.dtype)
        out[self.source] = part
        return out


class ConcatenateFunction(Function):
    def forward(self, *arrays, axis=0):
        self.axis = axis
        self.sizes = [a.shape[axis] for a in arrays]
        return _xp(*arrays).concatenate(arrays, axis=axis)

    def backward(self, grad):
        bounds = np.cumsum(self.sizes)[:-1]
        return tuple(_xp(grad).split(grad, bounds, axis=self.axis))


# ----------------------------------------------------------------------------------------------
# Activations and softmax (through the current engine)
# ----------------------------------------------------------------------------------------------
class _ActivationFunction(Function):
    """y = f(x); the backward needs only y (ReLU, sigmoid and tanh all can), so x is not kept.

    ``primitive`` names the engine's pair ``<primitive>_forward`` / ``<primitive>_backward``, looked
    up at each call (never bound at import, so the engine chosen at run time is the one used).
    """

    primitive = ""

    def forward(self, x, out=None):
        forward = getattr(library, f"{self.primitive}_forward")
        y = forward(x) if out is None else forward(x, out=out)
        self.save_for_backward(y)
        return y

    def backward(self, dy):
        return getattr(library, f"{self.primitive}_backward")(dy, self.saved[0])


class ReLUFunction(_ActivationFunction):
    primitive = "relu"
    half_inputs = True  # relu_forward and relu_backward take half arrays (exact: values pass or become 0)
    sums_gradient_parts = True  # relu_backward sums a gradient's two parts in its own pass

    def backward(self, dy, dy_other=None):
        return library.relu_backward(dy, self.saved[0], dy_other)


class SigmoidFunction(_ActivationFunction):
    primitive = "sigmoid"


class TanhFunction(_ActivationFunction):
    primitive = "tanh"


class _SoftmaxFunction(Function):
    """y = (log-)softmax(x) along ``axis``; like the activations, the backward needs only y, and
    ``primitive`` names the engine's pair, looked up at each call."""

    primitive = ""

    def forward(self, x, axis):
        self.axis = axis
        y = getattr(library, f"{self.primitive}_forward")(x, axis)
        self.save_for_backward(y)
        return y

    def backward(self, dy):
        return getattr(library, f"{self.primitive}_backward")(dy, self.saved[0], self.axis)


class SoftmaxFunction(_SoftmaxFunction):
    primitive = "softmax"


class LogSoftmaxFunction(_SoftmaxFunction):
    primitive = "log_softmax"
