"""Training curves of several train.py runs side by side in one PNG: loss and accuracy per epoch, train and
test, one colour per run (e.g. the same model in fp32 and under --amp bf16).

    python tools/compare_curves.py runs/fp32/metrics.jsonl runs/bf16/metrics.jsonl --labels fp32,bf16 --out both.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from minidnn.checkpoint import atomic_write  # noqa: E402


def read_history(path: str) -> list[dict]:
    """The epoch rows of a metrics.jsonl (train.py's), or a ``ValueError`` naming the file."""
    with open(path, encoding="utf-8") as file:
        rows = [json.loads(line) for line in file if line.strip()]
    needed = {"epoch", "train_loss", "test_loss", "train_accuracy", "test_accuracy"}
    if not rows or any(needed - set(row) for row in rows):
        raise ValueError(f"{path} is not a train.py metrics.jsonl (epoch rows with {', '.join(sorted(needed))})")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files of train.py runs")
    parser.add_argument("--labels", default=None, help="comma-separated names of the runs (default: their folders)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.dirname(os.path.abspath(p)))
                                                          for p in args.metrics]
    if len(labels) != len(args.metrics):
        parser.error(f"--labels names {len(labels)} runs, {len(args.metrics)} metrics files are given")
    try:
        histories = [read_history(path) for path in args.metrics]
    except (OSError, ValueError) as error:
        parser.error(str(error))
    import matplotlib  # noqa: PLC0415 - the `plot` extra

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4))
    for index, (label, history) in enumerate(zip(labels, histories)):
        colour, epochs = f"C{index}", [row["epoch"] for row in history]
        for split, style in (("train", "o--"), ("test", "o-")):
            left.plot(epochs, [row[f"{split}_loss"] for row in history], style, color=colour, label=f"{label} {split}")
            right.plot(epochs, [100 * row[f"{split}_accuracy"] for row in history], style, color=colour,
                       label=f"{label} {split}")
    left.set_yscale("log")
    for axes, title in ((left, "cross-entropy loss (log scale)"), (right, "accuracy (%)")):
        axes.set_xlabel("epoch")
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    try:
        atomic_write(args.out, lambda file: figure.savefig(file, format="png", dpi=100))
    finally:
        pyplot.close(figure)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
