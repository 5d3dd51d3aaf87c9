"""Rule: in-memory data is read in-process, image files by worker processes (minidnn/data/loader.py, train.py build_loader).

The DataLoader's batches per second on the CPU, with nothing else running: shapes10 (in memory) read
sample by sample through the per-sample pipeline (the path train.py had), through the batch transform
(one gather, CropFlipNormalize's NumPy twin), and through worker processes; the same with CIFAR's
augmentation (RandomCrop(32, padding=4), flip); and an image folder of JPEG files decoded in this
process or in 1 and 2 worker processes. Also the per-sample generators' cost, one batch of 128 drawn
one sample at a time against drawn batched (minidnn/data/sample_random.py).

    PYTHONPATH=. python benchmarks/probes/loader_throughput.py --out benchmarks/results/<date>-cpu-input-pipeline
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import numpy as np
from PIL import Image

from minidnn.data import ArrayDataset, DataLoader, ImageFolder, load_shapes, sample_random
from minidnn.data import transforms as T

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def batches_per_second(loader: DataLoader, batches: int, passes: int = 2) -> dict:
    """Batches/s over ``batches`` batches after one untimed batch (workers started, first fetch done),
    best of ``passes`` passes (each a new epoch)."""
    rates = []
    for _ in range(passes):
        iterator = iter(loader)
        next(iterator)
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        rates.append(batches / (time.perf_counter() - start))
        iterator.close()
    loader.close()
    return {"batches_per_second": max(rates), "images_per_second": max(rates) * loader.batch_size,
            "passes": [round(r, 2) for r in rates]}


def image_folder(root: str, count: int, side: int) -> str:
    """``count`` random JPEG images of side ``side`` in two class folders."""
    rng = np.random.default_rng(0)
    for index in range(count):
        folder = os.path.join(root, f"class{index % 2}")
        os.makedirs(folder, exist_ok=True)
        pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{index:05d}.jpg"), quality=90)
    return root


def draw_costs(batch: int, repeats: int = 20) -> dict:
    """ms to draw one batch's crop offsets and flips: a NumPy generator per sample, and batched."""
    calls = [("integers", 9), ("integers", 9), ("random",)]
    indices = np.arange(batch)
    sample_random.draw(0, 0, indices, calls)  # the one-time check against NumPy, untimed
    start = time.perf_counter()
    for repeat in range(repeats):
        sample_random._numpy_draws(0, repeat, indices, calls)
    per_sample = (time.perf_counter() - start) / repeats * 1e3
    start = time.perf_counter()
    for repeat in range(repeats):
        sample_random.draw(0, repeat, indices, calls)
    batched = (time.perf_counter() - start) / repeats * 1e3
    return {"batch": batch, "per_sample_ms": per_sample, "batched_ms": batched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for loader-throughput.json and .md")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--batches", type=int, default=40, help="timed batches per configuration (in-memory)")
    parser.add_argument("--folder-images", type=int, default=1536)
    parser.add_argument("--folder-side", type=int, default=64, help="JPEG side in pixels (cropped to 32 after a resize)")
    args = parser.parse_args()
    load_before = [round(v, 2) for v in os.getloadavg()]

    images, labels = load_shapes("train", train_size=20000, test_size=4000)
    mean = tuple(images.reshape(-1, 3).mean(axis=0) / 255)
    std = tuple(images.reshape(-1, 3).std(axis=0) / 255)
    per_sample = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
    cifar_per_sample = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                                  T.Normalize(CIFAR_MEAN, CIFAR_STD)])
    options = dict(batch_size=args.batch, shuffle=True, drop_last=True, seed=0)
    rows = []

    def measure(data: str, path: str, loader: DataLoader, batches: int) -> None:
        result = batches_per_second(loader, batches)
        rows.append({"data": data, "path": path, **result})
        print(f"{data:28s} {path:58s} {result['batches_per_second']:8.1f} batches/s "
              f"{result['images_per_second']:9.0f} img/s", flush=True)

    for data, sample_pipeline, batch in (
            ("shapes10 (no augmentation)", per_sample, T.CropFlipNormalize(mean, std)),
            ("shapes10, CIFAR augmentation", cifar_per_sample,
             T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=32, padding=4, flip=0.5))):
        measure(data, "per-sample pipeline, in-process", DataLoader(
            ArrayDataset(images, labels, sample_pipeline, seed=1), **options), args.batches)
        measure(data, "batch transform, in-process (train.py)", DataLoader(
            ArrayDataset(images, labels, seed=1), batch_transform=batch, **options), args.batches)
        measure(data, "batch transform, 2 worker processes", DataLoader(
            ArrayDataset(images, labels, seed=1), batch_transform=batch, num_workers=2, persistent_workers=True,
            **options), args.batches)

    with tempfile.TemporaryDirectory(prefix="minidnn-probe-folder-") as root:
        image_folder(root, args.folder_images, args.folder_side)
        crops = T.Compose([T.Resize(32), T.RandomCrop(32), T.RandomHorizontalFlip()])
        normalise = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD)
        folder_batches = args.folder_images // args.batch - 2
        for workers in (0, 1, 2):
            path = "in-process" if workers == 0 else f"{workers} worker process{'es' if workers > 1 else ''}"
            measure(f"image folder ({args.folder_side}px JPEG)", f"decode + crop per sample, {path}", DataLoader(
                ImageFolder(root, transform=crops, seed=1), batch_transform=normalise, num_workers=workers,
                persistent_workers=workers > 0, **options), folder_batches)

    draws = draw_costs(args.batch)
    print(f"crop and flip draws of {args.batch} samples: {draws['per_sample_ms']:.2f} ms one generator at a time, "
          f"{draws['batched_ms']:.2f} ms batched")
    load = [round(v, 2) for v in os.getloadavg()]  # other work on the machine slows every row alike
    record = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version(), "numpy": np.__version__,
                          "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_average_after": load,
                          "load_average_before": load_before},
              "batch": args.batch, "rows": rows, "draws": draws}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "loader-throughput.json.tmp"), "w") as file:
        json.dump(record, file, indent=1)
    os.replace(os.path.join(args.out, "loader-throughput.json.tmp"), os.path.join(args.out, "loader-throughput.json"))
    lines = [f"# DataLoader throughput on the CPU ({os.cpu_count()} cores), batch {args.batch}", "",
             f"{record['machine']['date']}; load average {load_before[0]} before, {load[0]} after (1 minute): "
             f"other processes share the cores, so compare rows with each other.", "",
             "| data | path | batches/s | images/s |", "|---|---|---|---|"]
    lines += [f"| {r['data']} | {r['path']} | {r['batches_per_second']:.1f} | {r['images_per_second']:.0f} |"
              for r in rows]
    lines += ["", f"Crop offsets and flips of {args.batch} samples from their (seed, epoch, index) generators: "
                  f"{draws['per_sample_ms']:.2f} ms one NumPy generator at a time, {draws['batched_ms']:.2f} ms "
                  f"batched (the same numbers)."]
    with open(os.path.join(args.out, "loader-throughput.md.tmp"), "w") as file:
        file.write("\n".join(lines) + "\n")
    os.replace(os.path.join(args.out, "loader-throughput.md.tmp"), os.path.join(args.out, "loader-throughput.md"))


if __name__ == "__main__":
    main()
