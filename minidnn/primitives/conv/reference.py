"""The reference algorithm: direct convolution in float64, the ground truth for every other one.

Vectorised over pixels with a sliding-window view of the padded input (N, C, P, Q, R, S) and
``einsum``; only the backward-data scatter loops, over the R·S filter taps. It computes in float64
whatever the input dtype and rounds once at the end, so for float64 inputs it is exact up to the
order of summation. It supports every problem and declares no workspace, but it is no
workspace-bounded algorithm: its float64 copies and window matrix, (N, C, P, Q, R, S) doubles,
are its own temporaries (800 MiB for CaffeNet's conv3 at batch 256). So it runs only when asked
for by name, or when nothing else fits: ``find`` leaves it out otherwise (on a GPU with float64
tensor cores its GEMMs can outrun float32 kernels, and picking it by time would cost that memory).
Works on NumPy and CuPy arrays alike.
"""
from __future__ import annotations

from typing import Any

from ... import backend
from .problem import ConvProblem
from .registry import ConvAlgorithm, register, store_filter_gradient


def padded(x: Any, problem: ConvProblem, dtype: Any = None) -> Any:
    """x zero-padded by the problem's padding, optionally cast: (N, C, H + 2·pad_h, W + 2·pad_w)."""
    xp = backend.get_array_module(x)
    x = x if dtype is None else x.astype(dtype, copy=False)
    (ph, pw) = problem.padding
    return xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x


def windows(x_padded: Any, problem: ConvProblem) -> Any:
    """View of every filter window of the padded input: (N, C, P, Q, R, S), no copy."""
    xp = backend.get_array_module(x_padded)
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    span = (dh * (problem.R - 1) + 1, dw * (problem.S - 1) + 1)
    view = xp.lib.stride_tricks.sliding_window_view(x_padded, span, axis=(2, 3))
    return view[:, :, ::sh, ::sw, ::dh, ::dw]


def tap_slices(problem: ConvProblem, r: int, s: int) -> tuple[slice, slice]:
    """Rows and columns of the padded input that filter tap (r, s) touches, one per output pixel."""
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    top, left = r * dh, s * dw
    return (slice(top, top + sh * (problem.P - 1) + 1, sh), slice(left, left + sw * (problem.Q - 1) + 1, sw))


def _grouped(array: Any, groups: int) -> Any:
    """Split axis 1 into (groups, per_group): (N, C, ...) -> (N, G, C/G, ...)."""
    return array.reshape(array.shape[0], groups, array.shape[1] // groups, *array.shape[2:])


class Reference(ConvAlgorithm):
    name = "reference"
    automatic = False  # the ground truth, not a fast path: see the module docstring

    def supports(self, problem: ConvProblem, direction: str) -> bool:
        return True

    def workspace_bytes(self, problem: ConvProblem, direction: str) -> int:
        return 0

    def forward(self, x: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        xp = backend.get_array_module(x)
        G = problem.groups
        view = _grouped(windows(padded(x, problem, xp.float64), problem), G)     # N G Cg P Q R S
        w_grouped = w.astype(xp.float64).reshape(G, problem.K // G, *w.shape[1:])  # G Kg Cg R S
        y = xp.einsum("ngcpqrs,gkcrs->ngkpq", view, w_grouped, optimize=True)
        out[...] = y.reshape(problem.y_shape)

    def backward_data(self, dy: Any, w: Any, problem: ConvProblem, out: Any, workspace: Any) -> None:
        xp = backend.get_array_module(dy)
        G, (ph, pw) = problem.groups, problem.padding
        dy_grouped = _grouped(dy.astype(xp.float64), G)                            # N G Kg P Q
        w_grouped = w.astype(xp.float64).reshape(G, problem.K // G, *w.shape[1:])  # G Kg Cg R S
        dx = xp.zeros((problem.N, G, problem.C // G, problem.H + 2 * ph, problem.W + 2 * pw), xp.float64)
        for r in range(problem.R):
            for s in range(problem.S):
                rows, cols = tap_slices(problem, r, s)
                dx[..., rows, cols] += xp.einsum("ngkpq,gkc->ngcpq", dy_grouped, w_grouped[..., r, s])
        out[...] = dx[..., ph:ph + problem.H, pw:pw + problem.W].reshape(problem.x_shape)

    def backward_filter(self, x: Any, dy: Any, problem: ConvProblem, out: Any, accumulate: bool,
                        workspace: Any) -> None:
        xp = backend.get_array_module(x)
        G = problem.groups
        view = _grouped(windows(padded(x, problem, xp.float64), problem), G)  # N G Cg P Q R S
        dy_grouped = _grouped(dy.astype(xp.float64), G)                       # N G Kg P Q
        dw = xp.einsum("ngkpq,ngcpqrs->gkcrs", dy_grouped, view, optimize=True)
        store_filter_gradient(dw.reshape(problem.w_shape), out, accumulate)


register(Reference())
