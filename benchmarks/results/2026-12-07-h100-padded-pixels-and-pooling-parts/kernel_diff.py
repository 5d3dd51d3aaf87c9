"""The kernels whose summed time or launch count differs between two runs of one ab.py cell (bench.json's
kernel_names, the profiled step), and each run's GPU-busy total. Usage: python kernel_diff.py CALL/AB-DIR A B."""
import glob
import json
import sys


def kernels(cell: str, tree: str) -> dict[str, tuple[float, float]]:
    record = next(r for r in json.load(open(glob.glob(f"{cell}/*-{tree}-1/bench.json")[0]))["records"]
                  if r.get("kernel_names"))
    return {name: (ms, count) for name, ms, count in record["kernel_names"]}


cell, first, second = sys.argv[1:4]
a, b = kernels(cell, first), kernels(cell, second)
print(f"| kernel | {first} ms (launches) | {second} ms (launches) |\n|---|---|---|")
print(f"| all | {sum(v[0] for v in a.values()):.3f} | {sum(v[0] for v in b.values()):.3f} |")
for name in sorted(set(a) | set(b), key=lambda n: -abs(a.get(n, (0, 0))[0] - b.get(n, (0, 0))[0])):
    (ms_a, n_a), (ms_b, n_b) = a.get(name, (0, 0)), b.get(name, (0, 0))
    if abs(ms_a - ms_b) > 0.01 or n_a != n_b:
        print(f"| {name[:90]} | {ms_a:.3f} ({n_a:.0f}) | {ms_b:.3f} ({n_b:.0f}) |")
