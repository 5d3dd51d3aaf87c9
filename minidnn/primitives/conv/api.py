"""The three convolution entry points: forward, backward-data and backward-filter.

Each validates its arguments into a :class:`ConvProblem` once, gets a :class:`~.plans.Plan` for it
(made on the first call of each shape, then reused every step) and runs the plan. A plan is a list of
segments, (images, algorithm), that together cover the batch: one segment when the whole batch
runs in one call, several for micro-batches. Segments run in order on views of the batch,
writing disjoint slices of the output (forward, backward-data) or adding into one weight
gradient (backward-filter: the first segment writes, or adds when the caller asks to accumulate,
the rest add), with one workspace shared by all of them and no host synchronisation in between.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ... import backend
from .. import _cuda, convert, layout
from .._checks import check_rank
from . import plans, registry, selection, step_choice, workspace
from .plans import Plan, even_split, single
from .problem import ConvProblem, check_conv_dtype, check_output_grad, forward_problem, make_problem


# Plans already made: (problem, direction, algo, limit, every setting make_plan reads) -> Plan.
_plans: dict[tuple, Plan] = {}
registry.cache_clearers.append(_plans.clear)
_warned_out_of_memory: set = set()

# The steady state: a call seen before (the same direction, shapes, dtypes, array types, hyper-parameters,
# algo and limit, under the same settings generation and math mode) -> its (problem, plan), so that it
# neither validates nor chooses again. Only plain ints and pairs of ints are cached as hyper-parameters
# (1.0 == 1 would otherwise let a float through unchecked); anything else takes the checking path.
_calls: dict[tuple, tuple[ConvProblem, Plan]] = {}
registry.cache_clearers.append(_calls.clear)

# Further, for a GPU call whose plan is one segment: the call's key -> (the GPU it was made on, its ready form, or None
# when it has none), so that a repeated call with C-contiguous operands and no ``out`` goes from its key to its work.
# The ready form is the algorithm's ready launch (implicit GEMM's: the output allocated, one launch), or for a
# ``replayable`` algorithm (Winograd's transforms and GEMMs) the first call's recording, replayed on the next call's
# operands, output and workspace (_cuda.ReadyCall). The key holds everything either was worked out from but the
# device, which is compared.
_ready: dict[tuple, tuple[int, Any]] = {}
registry.cache_clearers.append(_ready.clear)


def _plain(value: Any) -> bool:
    kind = type(value)
    return kind is int or (kind is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int)


def _call_key(direction: str, first: Any, second: Any, shape: Any, stride: Any, padding: Any, dilation: Any,
              groups: Any, algo: Any, workspace_limit: Any, channels_last: bool) -> tuple | None:
    """The call cache's key, or None when the call must take the checking path."""
    if not (_plain(stride) and _plain(padding) and _plain(dilation) and type(groups) is int):
        return None
    try:
        return (direction, first.shape, second.shape, shape, first.dtype, second.dtype, type(first), type(second),
                stride, padding, dilation, groups, algo, workspace_limit, registry._Settings.generation,
                _cuda.allow_tf32(), channels_last)
    except AttributeError:  # not arrays: the checks say what is wrong
        return None


def _problem_and_plan(direction: str, key: tuple | None, check: Any, algo: str | None,
                      workspace_limit: int | None) -> tuple[ConvProblem, Plan]:
    """The call's (problem, plan): from the call cache, or ``check()``'s problem and a plan for it (then cached).
    The observer sees every call either way."""
    try:
        hit = None if key is None else _calls.get(key)
    except TypeError:  # an unhashable shape argument (a list): the checking path
        hit = None
    problem = None
    if step_choice.trial is not None and step_choice.trial.running:  # a whole-step trial counts the steps
        problem = check() if hit is None else hit[0]
        changed = step_choice.saw(problem, direction)
        if changed:  # the step begun here runs another set of choices
            _forget(changed)
            hit = None if key is None else _calls.get(key)
    if hit is None:
        problem = check() if problem is None else problem
        plan = _plan(problem, direction, algo, workspace_limit)
        if key is not None:
            _calls[key] = (problem, plan)
        return problem, plan
    if plans.call_observer is not None:
        plans.call_observer(direction, *hit)
    return hit


def plans_in_use() -> list[tuple[str, ConvProblem, Plan]]:
    """(direction, problem, plan) of every convolution call in the steady state, once per direction and problem (the
    plan its latest call made), in the order first seen: which algorithms a model's step runs now, and on which layout
    (a channels-last problem says so). What μ-cuDNN logs, for a profile to set beside its kernels."""
    current: dict[tuple[str, ConvProblem], Plan] = {}
    for key, (problem, plan) in _calls.items():
        current[(key[0], problem)] = plan
    return [(direction, problem, plan) for (direction, problem), plan in current.items()]


def _forget(kernels: set) -> None:
    """Drop the plans, cached calls and ready forms of these (problem, direction) kernels: their next calls plan
    again (the whole-step choice moved them to another algorithm)."""
    for key in [key for key, (problem, _) in _calls.items() if (problem, key[0]) in kernels]:
        del _calls[key]
        _ready.pop(key, None)
    for key in [key for key in _plans if (key[0], key[1]) in kernels]:
        del _plans[key]


def _ready_launch(key: tuple | None, first: Any, second: Any) -> Any:
    """The call's ready form (see ``_ready``), or None when it has none or its operands need the full path (a strided
    operand, another GPU, an observer watching the calls)."""
    if key is None:
        return None
    try:
        ready = _ready.get(key)
    except TypeError:  # an unhashable shape argument (a list)
        return None
    if ready is None or plans.call_observer is not None or not (first.flags.c_contiguous and second.flags.c_contiguous) \
            or ready[0] != _cuda.current_device():
        return None
    return ready[1]


def _run_and_keep(plan: Plan, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
                  key: tuple | None, keep: bool, accumulate: bool = False) -> Any:
    """:func:`_run`, and for a GPU call that may be kept (``keep``: it allocated its output; see ``_ready``) and is not
    yet, its ready form kept: the algorithm's ready launch, or its recording."""
    try:
        kept = not keep or key is None or problem.device != "cuda" or key in _ready
    except TypeError:  # an unhashable shape argument (a list)
        kept = True
    if kept or plans.call_observer is not None or not (first.flags.c_contiguous and second.flags.c_contiguous) \
            or step_choice.holds(problem, direction):
        return _run(plan, direction, first, second, problem, out, accumulate)
    device, algorithm, ready = _cuda.current_device(), plan.segments[0][1], None
    if len(plan.segments) == 1 and plan.arena is None and not key[-1]:  # channels-last operands take the full path
        if algorithm.replayable:
            return _run_recorded(plan, direction, first, second, problem, out, key, device)
        if not plan.workspace_bytes:
            ready = algorithm.ready_launch(direction, problem)
    _run(plan, direction, first, second, problem, out, accumulate)
    _ready[key] = (device, ready)
    return out


def _run_recorded(plan: Plan, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any, key: tuple,
                  device: int) -> Any:
    """Run a replayable algorithm's one-segment plan under a recording, and keep it as a ready call."""
    fallback, buffer = _workspace(plan, problem, direction, backend.cupy())
    if fallback is not plan:  # no memory for the workspace: the fallback runs, nothing is kept
        return _run(fallback, direction, first, second, problem, out)
    ready_call = plan.segments[0][1].recorded_call(direction, first, second, problem, out, buffer)
    if ready_call is None:  # a step on memory of its own making: not kept
        _ready[key] = (device, None)
        return out
    # The replay allocates its output before the workspace, as here: a captured step's memory plan follows the order
    # of a step's allocations.
    nbytes, shared, empty, shape, dtype = plan.workspace_bytes, workspace.workspace, backend.cupy().empty, out.shape, \
        out.dtype

    def replay(first: Any, second: Any) -> Any:
        result = empty(shape, dtype)
        try:
            buffer = shared(nbytes) if nbytes else None
        except MemoryError:  # the shared workspace was let go and no memory is left for it: the full path's fallback
            return _run(plan, direction, first, second, problem, result)
        ready_call(first, second, result, buffer)
        return result

    _ready[key] = (device, replay)
    return out


def make_plan(problem: ConvProblem, direction: str, algo: str, limit: int) -> Plan:
    """The plan for one call, from the settings (see :mod:`.registry`)."""
    if algo != "auto":
        algorithm = registry.get(algo)
        if not registry.supports(algorithm, problem, direction):
            raise ValueError(f"algo {algo!r} does not support {direction} of {problem.describe()} on {problem.device}")
        registry.check_forced(algorithm, problem, direction)
        return even_split(algorithm, problem, direction, limit)
    mode = registry.microbatch_mode()
    if mode != "off":
        from . import planner  # noqa: PLC0415 - only micro-batching needs it

        return planner.plan(problem, direction, limit, mode, registry.batch_policy())
    if not registry.benchmark(problem.device):
        return selection.get_plan(problem, direction, limit)
    measured = selection.find(problem, direction, limit)
    eager = not registry.planning_for_graph()
    name = selection.fastest(measured, eager=eager).algorithm
    if eager:  # the whole step's choice, once its trial has timed the step
        name = step_choice.offer(problem, direction, limit, name)
    return selection.whole_or_divided(registry.get(name), problem, direction, limit)


def _plan(problem: ConvProblem, direction: str, algo: str | None, workspace_limit: int | None) -> Plan:
    limit = registry.workspace_limit() if workspace_limit is None else registry.check_limit(workspace_limit)
    algo = registry.default_algorithm() if algo is None else algo
    key = (problem, direction, algo, limit, registry.microbatch_mode(), registry.batch_policy(),
           registry.benchmark(problem.device), registry.planning_for_graph(), selection.math_mode(problem),
           registry.are_deterministic_algorithms_enabled(), registry.is_deterministic_algorithms_warn_only_enabled())
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = make_plan(problem, direction, algo, limit)
    if plans.call_observer is not None:
        plans.call_observer(direction, problem, plan)
    return plan


def _workspace(plan: Plan, problem: ConvProblem, direction: str, xp: Any) -> tuple[Plan, Any]:
    """The plan's workspace buffer (its arena, the GPU stream's shared one, or a new CPU array); if the device
    has no memory left for it, the zero-workspace plan."""
    if plan.workspace_bytes == 0:
        return plan, None
    if plan.arena is not None:
        return plan, plan.arena
    try:
        if xp is np:
            return plan, np.empty(plan.workspace_bytes, dtype=np.uint8)
        return plan, workspace.workspace(plan.workspace_bytes)
    except MemoryError:
        fallback = selection.get(problem, direction, 0)
        if (problem, direction) not in _warned_out_of_memory:
            _warned_out_of_memory.add((problem, direction))
            warnings.warn(f"conv2d {direction}: no memory for a {plan.workspace_bytes}-byte workspace on "
                          f"{problem.describe()}; running {fallback.name}, which needs none", RuntimeWarning,
                          stacklevel=4)
        return single(fallback, problem, direction), None


def _run(plan: Plan, direction: str, first: Any, second: Any, problem: ConvProblem, out: Any,
         accumulate: bool = False) -> Any:
    """Run the plan's segments on consecutive slices of the batch (see the module docstring)."""
    xp = backend.get_array_module(first)
    if out.dtype != problem.dtype and not all(a.float32_weight_gradient for _, a in plan.segments):
        # A float32 weight gradient of a half problem from an algorithm that writes only the half type: its
        # rounded result, widened.
        wide = convert.half_to_float(_run(plan, direction, first, second, problem, xp.empty(problem.w_shape,
                                                                                            problem.dtype)),
                                     problem.half_type)
        registry.store_filter_gradient(wide, out, accumulate)
        return out
    plan, workspace = _workspace(plan, problem, direction, xp)
    if len(plan.segments) == 1:  # the whole batch in one call (the common plan): no views of it to make
        plan.segments[0][1].run_in_layout(direction, first, second, problem, out, accumulate, workspace)
        return out
    start = 0
    for images, algorithm in plan.segments:
        part = problem if images == problem.N else problem.with_batch(images)
        stop = start + images
        if direction == "backward_filter":  # slices of x and dy, all adding into the one dw
            algorithm.run_in_layout(direction, first[start:stop], second[start:stop], part, out,
                                    accumulate or start > 0, workspace)
        else:  # slices of x (dy) and of y (dx); w whole
            algorithm.run_in_layout(direction, first[start:stop], second, part, out[start:stop], False, workspace)
        start = stop
    return out


def _device(*arrays: Any) -> str:
    """``"cpu"`` or ``"cuda"``; arrays on different devices are a ``ValueError``."""
    return "cpu" if backend.get_array_module(*arrays) is np else "cuda"


def _check_accumulate(accumulate: Any, out: Any) -> None:
    """backward-filter adds into ``out`` only when there is one."""
    if not isinstance(accumulate, bool):
        raise TypeError(f"accumulate must be a bool, got {accumulate!r}")
    if accumulate and out is None:
        raise ValueError("accumulate=True needs an out array to add into")


def _output(out: Any, shape: tuple, problem: ConvProblem, xp: Any, dtype: Any = None,
            channels_last: bool | None = None) -> Any:
    """``out`` checked, or a new array; ``channels_last`` (forward, backward-data): a new one in that layout,
    and a given one may be channels-last too. None (backward-filter): C-contiguous only."""
    dtype = problem.dtype if dtype is None else dtype
    if out is None:
        return layout.empty(shape, dtype, xp, bool(channels_last))
    dense = out.flags.c_contiguous or (channels_last is not None and layout.is_channels_last(out))
    if tuple(out.shape) != shape or out.dtype != dtype or not dense:
        form = "C-contiguous" if channels_last is None else "C-contiguous or channels-last"
        raise ValueError(f"out must be a {form} {dtype} array of shape {shape}, "
                         f"got {out.dtype} {tuple(out.shape)}")
    return out


def gradient_dtype(dtype: Any, problem: ConvProblem) -> np.dtype:
    """The weight gradient's dtype for :func:`conv2d_backward_filter`'s ``dtype``: the problem's by default, or
    float32 for a half-precision problem (the gradient before its rounding to the half type)."""
    if dtype is None:
        return problem.dtype
    try:
        wanted = np.dtype(dtype)
    except TypeError:
        wanted = None
    if wanted == problem.dtype or (wanted == np.float32 and problem.half_type is not None):
        return wanted
    allowed = "the input's dtype" + (" or float32" if problem.half_type is not None else "")
    raise ValueError(f"dtype must be {allowed} ({problem.dtype}), got {dtype!r}")


def conv2d_forward(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
                   algo: str | None = None, workspace_limit: int | None = None, out: Any = None) -> Any:
    """y = x ⋆ w (cross-correlation, as every DL framework calls convolution).

    x: (N, C, H, W); w: (K, C/groups, R, S); returns y: (N, K, P, Q) of x's dtype (written into
    ``out`` when given). ``algo`` is ``"auto"``, an algorithm's name, or None for the default. y is
    channels-last when x or w is (PyTorch's rule; primitives/layout.py), else C-contiguous.
    """
    last = layout.is_channels_last(x) or layout.is_channels_last(w)

    def check() -> ConvProblem:
        return forward_problem(x, w, stride, padding, dilation, groups, _device(x, w)).laid_out(last)

    key = _call_key("forward", x, w, None, stride, padding, dilation, groups, algo, workspace_limit, last)
    if out is None:
        launch = _ready_launch(key, x, w)
        if launch is not None:
            return launch(x, w)
    problem, plan = _problem_and_plan("forward", key, check, algo, workspace_limit)
    xp = backend.get_array_module(x, w)
    y = _output(out, problem.y_shape, problem, xp, channels_last=last)
    return _run_and_keep(plan, "forward", x, w, problem, y, key, out is None)


def conv2d_backward_data(dy: Any, w: Any, x_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                         groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None,
                         out: Any = None) -> Any:
    """dx = ∂L/∂x from dy = ∂L/∂y.

    dy: (N, K, P, Q); w: (K, C/groups, R, S); x_shape: (N, C, H, W); returns dx: x_shape, channels-last when
    dy or w is.
    """
    last = layout.is_channels_last(dy) or layout.is_channels_last(w)

    def check() -> ConvProblem:
        check_conv_dtype(w, "weight")
        check_rank(w, 4, "weight", "(K, C/groups, R, S)")
        problem = make_problem(tuple(x_shape), tuple(w.shape), stride, padding, dilation, groups, w.dtype,
                               _device(dy, w))
        check_output_grad(dy, problem)
        return problem.laid_out(last)

    key = _call_key("backward_data", dy, w, x_shape, stride, padding, dilation, groups, algo, workspace_limit, last)
    if out is None:
        launch = _ready_launch(key, dy, w)
        if launch is not None:
            return launch(dy, w)
    problem, plan = _problem_and_plan("backward_data", key, check, algo, workspace_limit)
    xp = backend.get_array_module(dy, w)
    dx = _output(out, problem.x_shape, problem, xp, channels_last=last)
    return _run_and_keep(plan, "backward_data", dy, w, problem, dx, key, out is None)


def conv2d_backward_filter(x: Any, dy: Any, w_shape: tuple, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                           groups: int = 1, *, algo: str | None = None, workspace_limit: int | None = None,
                           out: Any = None, accumulate: bool = False, dtype: Any = None) -> Any:
    """dw = ∂L/∂w from the input x and dy = ∂L/∂y.

    x: (N, C, H, W); dy: (N, K, P, Q); w_shape: (K, C/groups, R, S); returns dw: w_shape, of x's dtype, or of
    ``dtype`` float32 for a float16 or bfloat16 x: the gradient as the kernels sum it, never rounded to the half
    type (what a float32 master weight's gradient wants). With ``out`` (of that dtype) the result is written
    there, or added to it when ``accumulate`` (cuDNN's beta = 1): the seam a caller uses to sum weight
    gradients over its own micro-batches.
    """
    last = layout.is_channels_last(x) or layout.is_channels_last(dy)

    def check() -> ConvProblem:
        check_conv_dtype(x, "input")
        check_rank(x, 4, "input", "(N, C, H, W)")
        problem = make_problem(x.shape, tuple(w_shape), stride, padding, dilation, groups, x.dtype, _device(x, dy))
        check_output_grad(dy, problem)
        return problem.laid_out(last)

    _check_accumulate(accumulate, out)
    key = _call_key("backward_filter", x, dy, w_shape, stride, padding, dilation, groups, algo, workspace_limit,
                    last)
    plain = out is None and dtype is None  # the ready launch writes a new dw of the problem's dtype
    if plain:
        launch = _ready_launch(key, x, dy)
        if launch is not None:
            return launch(x, dy)
    problem, plan = _problem_and_plan("backward_filter", key, check, algo, workspace_limit)
    xp = backend.get_array_module(x, dy)
    dw = _output(out, problem.w_shape, problem, xp, gradient_dtype(dtype, problem))
    return _run_and_keep(plan, "backward_filter", x, dy, problem, dw, key, plain, accumulate)
