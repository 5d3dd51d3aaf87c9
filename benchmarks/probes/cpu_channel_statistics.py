# Times shapes10's normalisation constants two ways on the CPU, NumPy's float64 mean and std of every pixel against transforms.channel_statistics' per-channel histograms: the rule that train.py takes them from the histograms.
"""One process, the 20,000 training images of shapes10 (uint8, 32 x 32 x 3): each way's seconds (median of 5) and
the two results' largest differences.

    PYTHONPATH=. python benchmarks/probes/cpu_channel_statistics.py --out DIR

Writes DIR/channel-statistics.json.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from minidnn import data
from minidnn.data import transforms as T


def seconds(call, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    images, _ = data.load_shapes("train")
    pixels = images.reshape(-1, 3)
    numpy_mean, numpy_std = pixels.mean(axis=0), pixels.std(axis=0)
    mean, std = T.channel_statistics(images)
    record = {"images": list(images.shape), "numpy_seconds": seconds(lambda: (pixels.mean(axis=0), pixels.std(axis=0))),
              "histogram_seconds": seconds(lambda: T.channel_statistics(images)),
              "largest_mean_difference": float(np.abs(mean - numpy_mean).max()),
              "largest_std_difference": float(np.abs(std - numpy_std).max()), "numpy": np.__version__}
    print(record)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=args.out, delete=False) as file:
        json.dump(record, file, indent=1)
    os.replace(file.name, os.path.join(args.out, "channel-statistics.json"))


if __name__ == "__main__":
    main()
