"""The three convolution entry points: forward, backward-data and backward-filter.

Each validates its arguments into a :class:`ConvProblem`, chooses an algorithm (``algo="auto"``
or a name) under the workspace limit, and runs it, splitting the batch into micro-batches when
the whole batch's workspace would not fit. Forward and backward-data write disjoint slices of
their output; backward-filter adds the micro-batches' weight gradients into one array (the first
writes, the rest accumulate), so no micro-batch needs a temporary or a host synchronisation.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ... import backend
from .._checks import check_float, check_rank
from . import registry
from .problem import ConvProblem, check_output_grad, forward_problem, make_problem

# A hook the profiler and the benchmark set to see every call: (direction, problem, algorithm,
# micro-batch size, workspace bytes per micro-batch). None costs one test per call.
call_observer: Callable[[str, ConvProblem, registry.ConvAlgorithm, int, int], None] | None = None


def _plan(problem: ConvProblem, direction: str, algo: str | None, workspace_limit: int | None):
    """Choose the algorithm and the micro-batch size for one call (cached: a training step asks the
    same questions every time, and answering them costs more host time than a small kernel)."""
    limit = registry.workspace_limit() if workspace_limit is None else registry._check_limit(workspace_limit)
    key = (problem, direction, registry.default_algorithm() if algo is None else algo, limit)
    plan = registry.plans.get(key)
    if plan is None:
        plan = registry.plans[key] = _make_plan(*key)
    if call_observer is not None:
        call_observer(direction, problem, *plan)
    return plan[0], plan[1]


def _make_plan(problem: ConvProblem, direction: str, algo: str, limit: int):
    """(algorithm, micro-batch size, workspace bytes per micro-batch)."""
    algorithm = registry.choose(problem, direction, algo, limit)
    per_image = algorithm.workspace_bytes(problem.with_batch(1), direction)
    batch = problem.N if per_image == 0 else max(1, min(problem.N, limit // per_image))
    # Workspace need not be linear in the batch: step down until the micro-batch really fits.
    while batch > 1 and algorithm.workspace_bytes(problem.with_batch(batch), direction) > limit:
        batch -= 1
    return algorithm, batch, algorithm.workspace_bytes(problem.with_batch(batch), direction)


def _device(*arrays: Any) -> str:
    """``"cpu"`` or ``"cuda"``; arrays on different devices are a ``ValueError``."""
    return "cpu" if backend.get_array_module(*arrays) is np else "cuda"


def conv2d_forward(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
                   algo: str | None = None, workspace_limit: int | None = None) -> Any:
    """y = x ⋆ w (cross-correlation, as every DL framework calls convolution).

    x: (N, C, H, W); w: (K, C/groups, R, S); returns y: (N, K, P, Q) of x's dtype.
    ``algo`` is ``"auto"``, an algorithm name, or None for the current default.
    """
    problem = forward_problem(x, w, stride, padding, dilation, groups, _device(x, w))
    algorithm, batch = _plan(problem, "forward", algo, workspace_limit)
    return _by_micro_batches(algorithm.forward, x, w, problem, batch, problem.y_shape)


def conv2d_backward_data(dy: Any, w: Any, x_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                         groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None) -> Any:
    """dx = ∂L/∂x from dy = ∂L/∂y.

    dy: (N, K, P, Q); w: (K, C/groups, R, S); x_shape: (N, C, H, W); returns dx: x_shape.
    """
    problem = make_problem(tuple(x_shape), tuple(w.shape), stride, padding, dilation, groups, w.dtype,
                           _device(dy, w))
    check_output_grad(dy, problem)
    algorithm, batch = _plan(problem, "backward_data", algo, workspace_limit)
    return _by_micro_batches(algorithm.backward_data, dy, w, problem, batch, problem.x_shape)


def _by_micro_batches(compute: Callable, batched: Any, w: Any, problem: ConvProblem, batch: int,
                      out_shape: tuple) -> Any:
    """``compute(batched, w, problem)``, run on slices of ``batch`` images written into one output
    (forward and backward-data: each image's result depends on that image alone)."""
    if batch == problem.N:
        return compute(batched, w, problem)
    out = backend.get_array_module(batched).empty(out_shape, dtype=problem.dtype)
    for start in range(0, problem.N, batch):
        stop = min(start + batch, problem.N)
        out[start:stop] = compute(batched[start:stop], w, problem.with_batch(stop - start))
    return out


def conv2d_backward_filter(x: Any, dy: Any, w_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                           groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None,
                           out: Any = None, accumulate: bool = False) -> Any:
    """dw = ∂L/∂w from the input x and dy = ∂L/∂y.

    x: (N, C, H, W); dy: (N, K, P, Q); w_shape: (K, C/groups, R, S); returns dw: w_shape.
    With ``out`` the result is written there, or added to it when ``accumulate`` (cuDNN's
    beta = 1): the seam a caller uses to sum weight gradients over its own micro-batches.
    """
    check_float(x, "input")
    check_rank(x, 4, "input", "(N, C, H, W)")
    problem = make_problem(x.shape, tuple(w_shape), stride, padding, dilation, groups, x.dtype, _device(x, dy))
    check_output_grad(dy, problem)
    if out is not None and (tuple(out.shape) != problem.w_shape or out.dtype != problem.dtype):
        raise ValueError(f"out must be a {problem.dtype} array of shape {problem.w_shape}, "
                         f"got {out.dtype} {tuple(out.shape)}")
    algorithm, batch = _plan(problem, "backward_filter", algo, workspace_limit)
    for start in range(0, problem.N, batch):
        stop = min(start + batch, problem.N)
        out = algorithm.backward_filter(x[start:stop], dy[start:stop], problem.with_batch(stop - start),
                                        out, accumulate or start > 0)
    return out

