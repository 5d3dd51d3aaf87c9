"""Plan a model's convolutions as micro-batches (μ-cuDNN's WR or WD) and print the plan.

    python tools/plan.py resnet50 --batch 256 --workspace-limit 512MiB --microbatch wd
    python tools/plan.py tiny_cnn --batch 8 --workspace-limit 1MiB --microbatch wr --device cpu --image-size 16
    python tools/plan.py resnet18 --batch 64 --workspace-limit 64MiB --microbatch wd --png conv1.png --layer conv1

It builds the model, runs one forward and backward pass on random data under those settings (the
planner times every algorithm at every candidate micro-batch size with ``find``, cached on disk),
solves the whole network (WD: the limit is the total budget) or takes each call's plan (WR: the
limit is per call), and prints, per layer and direction, the micro-batches and algorithms, their
predicted time and workspace, the totals, and the undivided plan's time under the same limit for
comparison. ``--png`` draws one layer's time/workspace trade-off (needs the ``plot`` extra).
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys
from typing import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minidnn  # noqa: E402
import minidnn.functional as F  # noqa: E402
import minidnn.nn as nn  # noqa: E402
import models  # noqa: E402
from minidnn import backend  # noqa: E402
from minidnn.primitives import conv  # noqa: E402
from minidnn.primitives.conv import planner, plans, registry  # noqa: E402
from minidnn.primitives.conv.problem import DIRECTIONS, ConvProblem  # noqa: E402

Kernel = planner.Kernel


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tools/plan.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=list(models.MODELS), help="a model of models.MODELS")
    parser.add_argument("--batch", type=_positive, required=True, help="mini-batch size B")
    parser.add_argument("--workspace-limit", required=True,
                        help="bytes, or KiB/MiB/GiB with no space (e.g. 64MiB): per call (wr) or in total (wd)")
    parser.add_argument("--microbatch", choices=("wr", "wd"), required=True,
                        help="wr: the fastest split of each call within the limit; wd: one budget for the network")
    parser.add_argument("--batch-policy", choices=registry.BATCH_POLICIES, default="powers_of_two",
                        help="the micro-batch sizes a plan may use")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when there is a GPU")
    parser.add_argument("--image-size", type=_positive, default=None, help="input side (default: the model's)")
    parser.add_argument("--png", default=None, help="draw one layer's time/workspace trade-off here (with --layer)")
    parser.add_argument("--layer", default=None, help="the convolution layer --png draws, e.g. layer1.0.conv2")
    return parser.parse_args(argv)


def run_network(model: nn.Module, x: minidnn.Tensor, labels: minidnn.Tensor) -> tuple[list[tuple[str, ConvProblem]],
                                                                                         collections.Counter]:
    """One forward and backward pass; returns the convolution layers in forward order with their
    problem, and how many calls of each kernel (problem, direction) the pass made."""
    names = {id(module): name for name, module in model.named_modules()}
    running: list[str] = []  # the Conv2d whose forward is running
    layers: list[tuple[str, ConvProblem]] = []
    calls: collections.Counter = collections.Counter()

    def observe(direction: str, problem: ConvProblem, plan: plans.Plan) -> None:
        calls[(problem, direction)] += 1
        if direction == "forward":
            layers.append((running[-1] if running else "(functional conv2d)", problem))

    def forward(self: nn.Conv2d, inputs: minidnn.Tensor) -> minidnn.Tensor:
        running.append(names[id(self)])
        try:
            return original(self, inputs)
        finally:
            running.pop()

    original, observer = nn.Conv2d.forward, plans.call_observer
    nn.Conv2d.forward, plans.call_observer = forward, observe
    try:
        F.cross_entropy(model(x), labels).backward()
    finally:
        nn.Conv2d.forward, plans.call_observer = original, observer
    return layers, calls


def plan_network(kernels: Sequence[Kernel], counts: Sequence[int], mode: str, limit: int,
                 policy: str) -> list[planner.Option]:
    """Each kernel's option: WD's choice (solving the network, which also installs its plans) or the WR plan."""
    if mode == "wd":
        chosen = planner.solve_network(limit, dict(zip(kernels, counts)))
        return [chosen[kernel] for kernel in kernels]
    return [planner.wr_plan(planner.cost_table(p, d, limit, policy), p.N, limit) for p, d in kernels]


def undivided(kernels: Sequence[Kernel], counts: Sequence[int], mode: str, limit: int) -> list[planner.Option]:
    """The whole batch in one call per kernel under the same limit (for WD: the same budget, solved alike)."""
    tables = [planner.cost_table(p, d, limit, "undivided") for p, d in kernels]
    if mode == "wd":
        return planner.wd_solve([planner.wd_front(t, p.N, limit) for t, (p, _) in zip(tables, kernels)], limit,
                                counts)
    return [planner.wr_plan(t, p.N, limit) for t, (p, _) in zip(tables, kernels)]


def starved(kernel: Kernel, limit: int) -> bool:
    """Whether every algorithm that needs workspace needs more than ``limit`` even for one image."""
    problem, direction = kernel[0].with_batch(1), kernel[1]
    needs = [a.workspace_bytes(problem, direction) for a in registry.algorithms().values()
             if a.supports(problem, direction)]
    return any(needs) and all(n > limit for n in needs if n)


def size_text(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def print_table(args: argparse.Namespace, limit: int, layers: list[tuple[str, ConvProblem]],
                kernels: list[Kernel], counts: list[int], chosen: list[planner.Option],
                baseline: list[planner.Option]) -> None:
    index = {kernel: k for k, kernel in enumerate(kernels)}
    rows = [("layer", "direction", "plan (micro-batches x images algorithm)", "ms", "workspace",
             "undivided", "ms")]
    for name, problem in layers:
        for direction in DIRECTIONS:
            k = index.get((problem, direction))
            if k is not None:
                rows.append((name, direction, chosen[k].describe(), f"{chosen[k].time_ms:.3f}",
                             size_text(chosen[k].workspace_bytes), baseline[k].describe(),
                             f"{baseline[k].time_ms:.3f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.rjust(w) if i in (3, 4, 6) else cell.ljust(w) for i, (cell, w) in
                        enumerate(zip(row, widths))).rstrip())
    total = planner.total_time(chosen, counts)
    total_undivided = planner.total_time(baseline, counts)
    workspaces = [option.workspace_bytes for option in chosen]
    print(f"total: {total:.3f} ms predicted per step, undivided {total_undivided:.3f} ms "
          f"({total_undivided / total if total else 1:.2f}x)")
    if args.microbatch == "wd":
        used = sum(count * w for count, w in zip(counts, workspaces))
        print(f"workspace: {size_text(used)} summed over calls of the {size_text(limit)} budget; "
              f"one shared arena of {size_text(max(workspaces))}")
    else:
        print(f"workspace: at most {size_text(max(workspaces))} per call (limit {size_text(limit)})")
    hungry = [kernel for kernel in kernels if starved(kernel, limit)]
    if hungry:
        print(f"note: for {len(hungry)} of {len(kernels)} kernels no algorithm that needs workspace fits "
              f"{size_text(limit)} even for one image; they run zero-workspace algorithms")


def draw(path: str, layer: str, problem: ConvProblem, kernels: list[Kernel], chosen: list[planner.Option],
         limit: int, policy: str) -> None:
    """Per direction: every (micro-batch size, algorithm) measured, at its pace for the whole batch;
    the front of all splits (WD's D(B)); the plan chosen."""
    import matplotlib  # noqa: PLC0415 - optional

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    directions = [d for d in DIRECTIONS if (problem, d) in kernels]
    figure, axes = plt.subplots(1, len(directions), figsize=(5.5 * len(directions), 4.5), squeeze=False)
    for axis, direction in zip(axes[0], directions):
        costs = planner.cost_table(problem, direction, limit, policy)
        for name in sorted({p.algorithm for perfs in costs.values() for p in perfs}):
            points = [(p.workspace_bytes / 2**20, p.time_ms * problem.N / size)
                      for size, perfs in costs.items() for p in perfs if p.algorithm == name]
            axis.scatter(*zip(*points), s=18, alpha=0.7, label=f"{name} at size b, time x B/b")
        front = planner.wd_front(costs, problem.N, limit)
        axis.step([o.workspace_bytes / 2**20 for o in front], [o.time_ms for o in front], where="post", color="black",
                  marker="o", markersize=3, label="Pareto front of all splits")
        option = chosen[kernels.index((problem, direction))]
        axis.scatter([option.workspace_bytes / 2**20], [option.time_ms], marker="*", s=220, color="red", zorder=3,
                     label=f"plan: {option.describe()}")
        axis.set_yscale("log")
        for ticks in (axis.yaxis.set_major_formatter, axis.yaxis.set_minor_formatter):
            ticks(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_xlabel("workspace (MiB)")
        axis.set_ylabel(f"time for the batch of {problem.N} (ms)")
        axis.set_title(f"{layer} {direction}", fontsize=10)
        axis.legend(fontsize=7)
    figure.suptitle(problem.describe(), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def fail(message: str) -> int:
    print(f"tools/plan.py: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    try:
        limit = conv.parse_size(args.workspace_limit)
    except ValueError as error:
        return fail(f"--workspace-limit: {error}")
    device = args.device or ("cuda" if backend.cuda_is_available() else "cpu")
    if device == "cuda" and not backend.cuda_is_available():
        return fail("--device cuda: no CUDA GPU with CuPy here; use --device cpu")
    if args.png and importlib.util.find_spec("matplotlib") is None:
        return fail("--png needs matplotlib: pip install 'minidnn[plot]'")
    if bool(args.png) != bool(args.layer):
        return fail("--png and --layer go together: --png PATH --layer NAME")
    model = models.create(args.model, num_classes=10).to(device)
    convolutions = [name for name, module in model.named_modules() if isinstance(module, nn.Conv2d)]
    if args.layer and args.layer not in convolutions:
        return fail(f"--layer: {args.model} has no convolution {args.layer!r}; it has {', '.join(convolutions)}")
    side = args.image_size or models.input_size(args.model)
    rng = np.random.default_rng(0)
    x = minidnn.tensor(rng.standard_normal((args.batch, 3, side, side)).astype(np.float32), device=device)
    labels = minidnn.tensor(rng.integers(0, 10, args.batch), device=device)
    planner.reset_network()
    with conv.settings(algo="auto", workspace_limit=limit, microbatch=args.microbatch, batch_policy=args.batch_policy):
        layers, calls = run_network(model, x, labels)
        kernels, counts = list(calls), list(calls.values())
        chosen = plan_network(kernels, counts, args.microbatch, limit, args.batch_policy)
        baseline = undivided(kernels, counts, args.microbatch, limit)
    print(f"{args.model}, batch {args.batch}, {side}x{side} images, {device}, float32: {args.microbatch.upper()} "
          f"micro-batching, policy {args.batch_policy}, workspace limit {size_text(limit)}"
          f"{' in total' if args.microbatch == 'wd' else ' per call'} (times predicted from find)")
    print_table(args, limit, layers, kernels, counts, chosen, baseline)
    if args.png:
        problem = next(problem for name, problem in layers if name == args.layer)
        draw(args.png, args.layer, problem, kernels, chosen, limit, args.batch_policy)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
