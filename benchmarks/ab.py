"""Two or more trees of the library, alternated cell by cell on one machine: which one's step is faster, by how much.

    python benchmarks/ab.py --tree head=scratch/head --tree new=. --cells resnet20:128:fp32,resnet18:128:bf16 \\
        --rounds 3 --torch --out benchmarks/results/DATE-MACHINE-QUESTION
    python benchmarks/ab.py ... --bench-args="--device cpu --quick --steps 2"     # the bench's own arguments

Host time on a shared machine swings between processes of one tree by more than most changes move it, so one pair
of runs says little. Here every round runs each tree once per cell, each run ``benchmarks/bench.py`` of that tree in
a process of its own, with that tree first on ``PYTHONPATH`` and a find cache of its own (``MINIDNN_CACHE_DIR``); the
trees' order is reversed every other round (head, new, new, head, ...), so that a drift of the machine falls on both
alike. ``--torch`` adds PyTorch's step once per round and cell, in the first tree's bench. Writes
``<out>/<cell>-<tree>-<round>/`` (bench.json and the others, and the run's log), ``ab.json`` (every run's figures)
and ``ab.md``: per cell and tree the median, least and greatest wall, host and GPU-busy time and kernels a step, and
each tree's medians over the first tree's and (with ``--torch``) over PyTorch's. ``--cpus`` runs every process on the
same CPUs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from minidnn.checkpoint import atomic_write

BENCH_ARGS = "--no-layers --no-agreement --warmup 3 --steps 20 --profile-steps 1"
FIGURES = (("wall_ms", "wall ms"), ("host_ms", "host ms"), ("gpu_busy_ms", "GPU-busy ms"),
           ("kernels_per_step", "kernels"))
TORCH = "torch"  # the name PyTorch's runs go under, beside the trees'
NAME = re.compile(r"[A-Za-z0-9_.-]+")


def parse_tree(text: str) -> tuple[str, str]:
    """``NAME=PATH`` -> (name, absolute path of a checkout holding benchmarks/bench.py)."""
    name, _, path = text.partition("=")
    if not NAME.fullmatch(name) or not path or name == TORCH:
        raise argparse.ArgumentTypeError(f"--tree must be NAME=PATH with NAME of letters, digits, '_', '.' or '-' "
                                         f"(not {TORCH!r}), got {text!r}")
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "benchmarks", "bench.py")):
        raise argparse.ArgumentTypeError(f"--tree {name}: {path} holds no benchmarks/bench.py")
    return name, path


def parse_cells(text: str) -> list[tuple[str, int, str]]:
    """``model:batch:precision,...`` -> [(model, batch, precision), ...]."""
    cells = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not NAME.fullmatch(parts[0]) or not parts[1].isdigit() or int(parts[1]) < 1 \
                or not NAME.fullmatch(parts[2]):
            raise argparse.ArgumentTypeError(f"--cells must be model:batch:precision,... with a batch >= 1 "
                                             f"(e.g. resnet20:128:fp32), got {item!r}")
        cells.append((parts[0], int(parts[1]), parts[2]))
    return cells


def schedule(trees: list[str], cells: list[tuple[str, int, str]], rounds: int, torch: bool
             ) -> list[tuple[tuple[str, int, str], str, int]]:
    """(cell, tree or TORCH, round) in run order: round by round, cell by cell, the trees in their order on odd
    rounds and reversed on even ones, PyTorch after them."""
    runs = []
    for round_ in range(1, rounds + 1):
        order = trees if round_ % 2 else trees[::-1]
        for cell in cells:
            runs.extend((cell, tree, round_) for tree in order)
            if torch:
                runs.append((cell, TORCH, round_))
    return runs


def cell_name(cell: tuple[str, int, str]) -> str:
    model, batch, precision = cell
    return f"{model}-{batch}-{precision}"


def parse_cpus(text: str) -> frozenset[int]:
    """``0-3,8`` -> the CPUs {0, 1, 2, 3, 8}."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or (last and int(last) < int(first)):
            raise argparse.ArgumentTypeError(f"--cpus must be CPU numbers and ranges such as 0-3,8, got {text!r}")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def run_one(tree_path: str, cell: tuple[str, int, str], engine: str, directory: str, bench_args: list[str],
            cache: str, timeout: float, cpus: frozenset[int] | None = None) -> dict[str, Any]:
    """One bench run in a process of its own (on ``cpus`` only, when given); its figures from
    ``directory/bench.json`` (None where missing)."""
    model, batch, precision = cell
    command = [sys.executable, os.path.join(tree_path, "benchmarks", "bench.py"), *bench_args, "--models", model,
               "--batch", str(batch), "--precision", precision, "--engines", engine, "--out", directory]
    environment = dict(os.environ, MINIDNN_CACHE_DIR=cache,
                       PYTHONPATH=os.pathsep.join(p for p in (tree_path, os.environ.get("PYTHONPATH")) if p))
    os.makedirs(directory, exist_ok=True)
    started = time.perf_counter()
    with open(os.path.join(directory, "run.log"), "w") as log:
        try:
            status = subprocess.run(command, cwd=tree_path, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=timeout, check=False,
                                    preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus)).returncode
        except subprocess.TimeoutExpired:
            status = None
    record = _record(os.path.join(directory, "bench.json"), engine)
    return {"rc": status, "seconds": round(time.perf_counter() - started, 1), "pid": record.get("pid"),
            **{key: record.get(key) for key, _ in FIGURES}}


def _record(path: str, engine: str) -> dict[str, Any]:
    """The timed record of ``engine`` in a bench.json, or {} when the run wrote none."""
    try:
        with open(path) as file:
            records = json.load(file).get("records", [])
    except (OSError, ValueError):
        return {}
    timed = [r for r in records if r.get("engine") == engine and r.get("wall_ms") is not None]
    return timed[0] if timed else {}


def _ratios(row: dict[str, Any], other: dict[str, Any] | None) -> dict[str, float]:
    """``row``'s wall and host medians over ``other``'s, where both have them."""
    if other is None:
        return {}
    return {key: row[key]["median"] / other[key]["median"] for key in ("wall_ms", "host_ms")
            if row[key] is not None and other[key] is not None and other[key]["median"]}


def summarise(runs: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """Per cell and name (the trees', then PyTorch's): the runs measured, and of each figure the median, least and
    greatest; each tree's medians over the first tree's, and over PyTorch's where it ran (issue 22's bars)."""
    rows = []
    for cell in dict.fromkeys(r["cell"] for r in runs):
        first = None
        for name in names:
            mine = [r for r in runs if r["cell"] == cell and r["name"] == name and r.get("wall_ms") is not None]
            if not any(r["cell"] == cell and r["name"] == name for r in runs):
                continue
            row: dict[str, Any] = {"cell": cell, "name": name, "runs": len(mine)}
            for key, _ in FIGURES:
                values = [r[key] for r in mine if r.get(key) is not None]
                row[key] = {"median": statistics.median(values), "least": min(values), "greatest": max(values)} \
                    if values else None
            if name != TORCH:
                first = first or row
                row["over_first"] = _ratios(row, first)
            rows.append(row)
        torch = next((row for row in rows if row["cell"] == cell and row["name"] == TORCH), None)
        for row in rows:
            if row["cell"] == cell and row["name"] != TORCH and torch is not None:
                row["over_torch"] = _ratios(row, torch)
    return rows


def markdown(rows: list[dict[str, Any]], names: list[str]) -> str:
    with_torch = TORCH in names
    lines = ["| cell | tree | runs | " + " | ".join(f"{label}: median (least-greatest)" for _, label in FIGURES)
             + f" | wall, host median / {names[0]}'s |" + (" wall, host median / PyTorch's |" if with_torch else ""),
             "|" + "---|" * (len(FIGURES) + 4 + with_torch)]
    for row in rows:
        cells = []
        for key, _ in FIGURES:
            figure = row[key]
            digits = 0 if key == "kernels_per_step" else 2
            cells.append("-" if figure is None else f"{figure['median']:.{digits}f} "
                         f"({figure['least']:.{digits}f}-{figure['greatest']:.{digits}f})")
        columns = [row.get("over_first", {})] + ([row.get("over_torch", {})] if with_torch else [])
        ratios = " | ".join(", ".join(f"{ratio[key]:.2f}" for key in ("wall_ms", "host_ms") if key in ratio) or "-"
                            for ratio in columns)
        lines.append(f"| {row['cell']} | {row['name']} | {row['runs']} | " + " | ".join(cells) + f" | {ratios} |")
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all."""
    atomic_write(path, lambda file: file.write(text.encode()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tree", action="append", type=parse_tree, required=True, metavar="NAME=PATH",
                        help="a checkout to measure (repeat; the first is the baseline the ratios divide by)")
    parser.add_argument("--cells", type=parse_cells, required=True, help="model:batch:precision,... (bench's names)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree per cell, alternating")
    parser.add_argument("--engine", default="minidnn", choices=["minidnn", "minidnn-graph", "naive"],
                        help="the engine the trees run (bench's --engines)")
    parser.add_argument("--torch", action="store_true", help="PyTorch's step too, once per round and cell")
    parser.add_argument("--bench-args", default=BENCH_ARGS, help="arguments for every bench run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take before it is stopped")
    parser.add_argument("--budget-seconds", type=float, default=None, help="start no run once this much time has "
                        "passed (those left are recorded as skipped)")
    parser.add_argument("--cpus", type=parse_cpus, default=None, help="run every process (the trees' and PyTorch's) "
                        "on these CPUs only, e.g. 0-3 (Linux): one placement for all, against the host time's swings "
                        "between processes")
    parser.add_argument("--out", required=True, help="directory for the runs, ab.json and ab.md")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.tree]
    if len(set(names)) != len(names):
        parser.error(f"--tree names must differ, got {names}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    if args.cpus is not None:
        if not hasattr(os, "sched_setaffinity"):
            parser.error("--cpus needs os.sched_setaffinity (Linux)")
        if not args.cpus <= os.sched_getaffinity(0):
            parser.error(f"--cpus {sorted(args.cpus)} are not all among this process's CPUs "
                         f"{sorted(os.sched_getaffinity(0))}")
    try:
        args.bench_args = shlex.split(args.bench_args)
    except ValueError as error:
        parser.error(f"--bench-args: {error}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    trees = dict(args.tree)
    names = list(trees) + ([TORCH] if args.torch else [])
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    caches = tempfile.mkdtemp(prefix="minidnn-ab-")  # a find cache per tree, shared by its runs
    started, runs = time.perf_counter(), []
    for cell, name, round_ in schedule(list(trees), args.cells, args.rounds, args.torch):
        run = {"cell": cell_name(cell), "name": name, "round": round_}
        if args.budget_seconds is not None and time.perf_counter() - started > args.budget_seconds:
            runs.append({**run, "rc": None, "skipped": "out of time"})
            continue
        tree_path = trees[name] if name != TORCH else next(iter(trees.values()))
        run.update(run_one(tree_path, cell, "torch" if name == TORCH else args.engine,
                           os.path.join(out, f"{run['cell']}-{name}-{round_}"), args.bench_args,
                           os.path.join(caches, name), args.timeout, args.cpus))
        runs.append(run)
        figures = ", ".join(f"{label} {run[key]:.2f}" for key, label in FIGURES[:3] if run.get(key) is not None)
        print(f"{run['cell']} {name} round {round_}: {figures or 'no record'} (rc {run['rc']}, {run['seconds']} s)",
              flush=True)
    rows = summarise(runs, names)
    result = {"trees": trees, "cells": [cell_name(c) for c in args.cells], "rounds": args.rounds,
              "engine": args.engine, "bench_args": args.bench_args,
              "cpus": None if args.cpus is None else sorted(args.cpus), "runs": runs, "summary": rows}
    _write(os.path.join(out, "ab.json"), json.dumps(result, indent=1) + "\n")
    _write(os.path.join(out, "ab.md"), markdown(rows, names))
    print(markdown(rows, names), end="")
    return result


if __name__ == "__main__":
    main()
