"""A convolution problem: shapes and parameters, validated once, in the cuDNN paper's notation.

x is (N, C, H, W), w is (K, C/groups, R, S), y is (N, K, P, Q), with
P = (H + 2·pad_h − dilation_h·(R − 1) − 1) // stride_h + 1 (Q likewise). The same problem
describes all three directions: forward (x, w → y), backward-data (dy, w → dx) and
backward-filter (x, dy → dw).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ... import backend
from .._checks import FLOAT_DTYPES, check_rank, check_same_dtype, pair
from ..convert import stored_half_type

DIRECTIONS = ("forward", "backward_data", "backward_filter")


def check_conv_dtype(array: Any, name: str) -> None:
    """``array`` must hold float32, float64 or a half type (float16; bfloat16 as ml_dtypes on the CPU, uint16
    words on the GPU)."""
    dtype = getattr(array, "dtype", None)
    # `dtype is None` first: NumPy compares np.dtype("float64") == None as True.
    if dtype is not None and (dtype in FLOAT_DTYPES or
                              stored_half_type(dtype, backend.is_cuda_array(array))):
        return
    raise TypeError(f"{name} must be a float32, float64, float16 or bfloat16 array (bfloat16: ml_dtypes.bfloat16 on "
                    f"the CPU, uint16 words on the GPU), got {dtype if dtype is not None else type(array).__name__}")


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: np.dtype
    device: str  # "cpu" or "cuda": which implementation family runs it
    # The call's activations are channels-last (primitives/layout.py): ``find`` times each algorithm on operands
    # so laid out, the copies of one without channels-last kernels counted.
    channels_last: bool = False

    @property
    def P(self) -> int:
        return (self.H + 2 * self.padding[0] - self.dilation[0] * (self.R - 1) - 1) // self.stride[0] + 1

    @property
    def Q(self) -> int:
        return (self.W + 2 * self.padding[1] - self.dilation[1] * (self.S - 1) - 1) // self.stride[1] + 1

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.C, self.H, self.W)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.K, self.C // self.groups, self.R, self.S)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.K, self.P, self.Q)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @functools.cached_property  # read on every launch: worked out once per problem
    def half_type(self) -> str | None:
        """``"float16"`` or ``"bfloat16"`` for a half-precision problem (float32 arithmetic on half storage),
        else None."""
        return stored_half_type(self.dtype, self.device == "cuda")

    @property
    def is_1x1(self) -> bool:
        """A 1x1, stride-1, unpadded convolution: im2col would be the identity (Caffe's ``is_1x1_``)."""
        return (self.R, self.S, self.stride, self.padding) == (1, 1, (1, 1), (0, 0))

    def with_batch(self, n: int) -> "ConvProblem":
        """The same problem on a micro-batch of ``n`` images."""
        return dataclasses.replace(self, N=n)

    def laid_out(self, channels_last: bool) -> "ConvProblem":
        """The same problem on activations of that layout (itself when they already are)."""
        return self if channels_last == self.channels_last else dataclasses.replace(self, channels_last=channels_last)

    def flops(self) -> int:
        """Multiply-adds × 2 of one direction (all three directions cost the same)."""
        return 2 * self.N * self.K * self.P * self.Q * (self.C // self.groups) * self.R * self.S

    def describe(self) -> str:
        """``[128,64,56,56] -> [128,64,56,56] (3x3, stride 1x1, pad 1x1, ...)`` as μ-cuDNN logs it."""
        extra = f", dilation {self.dilation[0]}x{self.dilation[1]}" if self.dilation != (1, 1) else ""
        extra += f", groups {self.groups}" if self.groups != 1 else ""
        extra += ", channels-last" if self.channels_last else ""
        return (f"[{self.N},{self.C},{self.H},{self.W}] -> [{self.N},{self.K},{self.P},{self.Q}] "
                f"({self.R}x{self.S}, stride {self.stride[0]}x{self.stride[1]}, "
                f"pad {self.padding[0]}x{self.padding[1]}{extra}, {self.half_type or self.dtype.name})")


def conv_arguments(stride: Any, padding: Any, dilation: Any, groups: Any) -> tuple[tuple[int, int], tuple[int, int],
                                                                                 tuple[int, int], int]:
    """A convolution's hyper-parameters validated, as (stride, padding, dilation) pairs and ``groups``: the one
    check that :class:`minidnn.nn.Conv2d` and every convolution call share. Each error names the argument."""
    stride = pair(stride, "stride", minimum=1)
    padding = pair(padding, "padding", minimum=0)
    dilation = pair(dilation, "dilation", minimum=1)
    if not isinstance(groups, int) or isinstance(groups, bool):
        raise TypeError(f"groups must be an int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    return stride, padding, dilation, groups


def check_channels(C: int, K: int, groups: int) -> None:
    """``groups`` must divide both the input channels C and the output channels K."""
    if C % groups:
        raise ValueError(f"groups={groups} must divide the input channels C={C}")
    if K % groups:
        raise ValueError(f"groups={groups} must divide the output channels K={K} (weight.shape[0])")


def make_problem(x_shape: tuple, w_shape: tuple, stride: Any, padding: Any, dilation: Any, groups: Any,
                 dtype: np.dtype, device: str) -> ConvProblem:
    """Validate shapes and parameters; every error names the argument at fault.

    Layers ask for the same problems every step, so answers are cached (errors are not).
    """
    # The key holds the arguments' types too: 1.0 == 1 and True == 1, but only ints are valid.
    types = tuple(tuple(map(type, v)) if isinstance(v, tuple) else type(v) for v in (stride, padding, dilation, groups))
    try:
        return _cached_problem(tuple(x_shape), tuple(w_shape), stride, padding, dilation, groups, np.dtype(dtype),
                               device, types)
    except TypeError as error:
        if "unhashable" not in str(error):
            raise
        return _validated_problem(x_shape, w_shape, stride, padding, dilation, groups, dtype, device)


@functools.lru_cache(maxsize=4096)
def _cached_problem(*args: Any) -> ConvProblem:
    return _validated_problem(*args[:-1])


def _validated_problem(x_shape: tuple, w_shape: tuple, stride: Any, padding: Any, dilation: Any, groups: Any,
                       dtype: np.dtype, device: str) -> ConvProblem:
    if len(x_shape) != 4:
        raise ValueError(f"conv2d: input must be 4-D (N, C, H, W), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"conv2d: weight must be 4-D (K, C/groups, R, S), got shape {tuple(w_shape)}")
    stride, padding, dilation, groups = conv_arguments(stride, padding, dilation, groups)
    N, C, H, W = (int(v) for v in x_shape)
    K, C_per_group, R, S = (int(v) for v in w_shape)
    check_channels(C, K, groups)
    if C_per_group * groups != C:
        raise ValueError(f"channel mismatch: input has C={C} channels, weight expects "
                         f"{C_per_group} per group x groups={groups} = {C_per_group * groups}")
    if min(N, C, H, W, K, R, S) < 1:
        raise ValueError(f"conv2d: empty input {tuple(x_shape)} or weight {tuple(w_shape)}")
    problem = ConvProblem(N, C, H, W, K, R, S, stride, padding, dilation, groups, np.dtype(dtype), device)
    effective_r = dilation[0] * (R - 1) + 1
    effective_s = dilation[1] * (S - 1) + 1
    if effective_r > H + 2 * padding[0] or effective_s > W + 2 * padding[1]:
        raise ValueError(f"kernel size {R}x{S} (dilated {effective_r}x{effective_s}) is larger than the "
                         f"padded input {H + 2 * padding[0]}x{W + 2 * padding[1]}")
    return problem


def forward_problem(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: Any, device: str) -> ConvProblem:
    check_conv_dtype(x, "input")
    check_conv_dtype(w, "weight")
    check_rank(x, 4, "input", "(N, C, H, W)")
    check_rank(w, 4, "weight", "(K, C/groups, R, S)")
    check_same_dtype(x, w, "input", "weight")
    return make_problem(x.shape, w.shape, stride, padding, dilation, groups, x.dtype, device)


def check_output_grad(dy: Any, problem: ConvProblem) -> None:
    check_conv_dtype(dy, "grad_output")
    if tuple(dy.shape) != problem.y_shape:
        raise ValueError(f"grad_output must have the output's shape {problem.y_shape}, got {tuple(dy.shape)}")
    if dy.dtype != problem.dtype:
        raise TypeError(f"grad_output must be {problem.dtype}, got {dy.dtype}")
