"""A first read: classify image files with a model train.py trained, in one call to rebuild it.

A train.py checkpoint describes its model, the input preprocessing and the class names, so
models.load_pretrained gives back a model ready to predict and the transform its images need.

    python examples/predict.py cat.png dog.jpg --checkpoint runs/shapes_cnn/best.npz
    python examples/predict.py photos/*.jpg --checkpoint runs/resnet18/best.npz --top-k 3 --device cuda
"""
import argparse
import os
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minidnn  # noqa: E402
import minidnn.functional as F  # noqa: E402
import models  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description="Print the most likely classes of each image file.")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (anything Pillow opens)")
    parser.add_argument("--checkpoint", required=True, help="a checkpoint of train.py (last.npz or best.npz)")
    parser.add_argument("--top-k", type=int, default=5, help="how many classes to print per image (default: 5)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    args = parser.parse_args()

    try:
        pretrained = models.load_pretrained(args.checkpoint, device=args.device)  # eval mode, weights loaded
        inputs = []
        for path in args.images:
            with Image.open(path) as image:
                inputs.append(pretrained.transform(image))  # resize, crop, normalise as the test split was
    except (OSError, ValueError) as error:  # a missing or damaged file: one line, no traceback
        raise SystemExit(f"predict.py: error: {error}") from None

    batch = minidnn.tensor(np.stack(inputs), device=args.device)  # (N, 3, size, size)
    with minidnn.no_grad():
        probabilities = F.softmax(pretrained.model(batch), dim=1).numpy()  # (N, classes)

    k = min(args.top_k, len(pretrained.classes))
    for path, row in zip(args.images, probabilities):
        best = np.argsort(-row, kind="stable")[:k]
        print(f"{path}: " + ", ".join(f"{pretrained.classes[i]} {row[i]:.4f}" for i in best))


if __name__ == "__main__":
    main()
