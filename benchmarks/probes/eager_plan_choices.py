# Lists, for every convolution call of one eager training step, find's GPU and host time for each algorithm and what algo="auto" runs there in an eager step and in a CUDA graph: the rule that eager calls choose by max(GPU, host) (selection.fastest), and how many launches it takes out of a small model's step.
"""One eager step of the benchmark's minidnn engine (find on), its convolution calls seen through
``plans.call_observer``, then ``selection.find`` for each distinct call (answered from find's cache: the step
measured them). Writes DIR/plan-choices.json and DIR/plan-choices.md.

    PYTHONPATH=. python benchmarks/probes/eager_plan_choices.py --model resnet20 --batch 128 --precision fp32 --out DIR
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import measure
from benchmarks.bench import SUITE
from minidnn.primitives.conv import plans, registry, selection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    architecture, side, _ = SUITE[args.model]
    spec = {"engine": "minidnn", "architecture": architecture, "image_size": side, "batch": args.batch,
            "num_classes": 1000 if side > 32 else 10, "device": "cuda", "precision": args.precision}
    engine = measure.ENGINES["minidnn"](spec)
    calls: dict[tuple, int] = {}
    with measure.measurement_state("minidnn", args.precision):
        engine.step()  # find measures here
        engine.synchronize()
        plans.call_observer = lambda direction, problem, plan: calls.__setitem__(
            (direction, problem), calls.get((direction, problem), 0) + 1)
        try:
            engine.step()
            engine.synchronize()
        finally:
            plans.call_observer = None
        limit = registry.workspace_limit()
        rows = []
        for (direction, problem), count in calls.items():
            measured = selection.find(problem, direction, limit)
            rows.append({"direction": direction, "problem": problem.describe(), "calls": count,
                         "eager": selection.fastest(measured, eager=True).algorithm,
                         "graph": selection.fastest(measured, eager=False).algorithm,
                         "algorithms": [{"name": p.algorithm, "gpu_ms": p.time_ms, "host_ms": p.host_ms}
                                        for p in measured]})
    with open(os.path.join(args.out, "plan-choices.json"), "w") as file:
        json.dump({"settings": vars(args), "rows": rows}, file, indent=1)
    lines = [f"# {args.model} b{args.batch} {args.precision}: each convolution call's choice", "",
             "| direction | problem | calls | eager | graph | algorithms: GPU ms / host ms |", "|---|---|---|---|---|---|"]
    for row in rows:
        menu = "; ".join(f"{a['name']} {a['gpu_ms']:.3f}/{a['host_ms']:.3f}" for a in row["algorithms"])
        lines.append(f"| {row['direction']} | {row['problem']} | {row['calls']} | {row['eager']} | {row['graph']} | {menu} |")
    differ = sum(row["calls"] for row in rows if row["eager"] != row["graph"])
    lines += ["", f"Calls whose eager choice differs from the graph's: {differ} of {sum(r['calls'] for r in rows)}."]
    with open(os.path.join(args.out, "plan-choices.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]))


if __name__ == "__main__":
    main()
