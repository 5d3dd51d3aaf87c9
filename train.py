"""Train a model with minidnn, the way PyTorch's examples do it.

    python train.py                                  # small CNN on the built-in shapes10 data, CPU
    python train.py --model resnet20 --epochs 3      # a CIFAR ResNet on shapes10
    python train.py --model resnet20 --data ~/data/cifar-10-batches-bin --device cuda
    python train.py --resume runs/shapes_cnn/last.npz  # continue exactly where a run stopped

Each epoch evaluates on the test split; --out gets metrics.jsonl (one JSON line per epoch),
curves.png (loss and accuracy), last.npz and best.npz (checkpoints). Ctrl-C saves last.npz and
exits; --resume continues from it, bit for bit as if the run had not stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

import minidnn
import minidnn.functional as F
import models
from minidnn import data, optim
from minidnn.checkpoint import atomic_write
from minidnn.data import transforms as T


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------
def _number(kind: type, low: float, inclusive: bool = True):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {low}, got {text}")
        return value
    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train.py", description="Train a CNN with minidnn (small CNN on built-in data by default).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    what = parser.add_argument_group("model and data")
    what.add_argument("--model", default="shapes_cnn", choices=list(models.MODELS), help="architecture")
    what.add_argument("--data", default="shapes10",
                      help="'shapes10' (built in, no download) or a path to a dataset in --format")
    what.add_argument("--format", default="auto", choices=["auto", "cifar10", "cifar100", "mnist", "fashion-mnist",
                                                            "imagefolder"],
                      help="format of the --data path; auto looks at the files")
    what.add_argument("--image-size", type=_number(int, 8), default=None,
                      help="input side in pixels (default: the model's own, e.g. 32, 224 or 227)")
    what.add_argument("--train-size", type=_number(int, 10), default=20000, help="shapes10 training images")
    what.add_argument("--test-size", type=_number(int, 10), default=4000, help="shapes10 test images")
    how = parser.add_argument_group("optimisation")
    how.add_argument("--epochs", type=_number(int, 1), default=3)
    how.add_argument("--batch-size", type=_number(int, 1), default=64)
    how.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
    how.add_argument("--lr", type=_number(float, 0.0, inclusive=False), default=None,
                     help="peak learning rate (default: 0.05 for sgd, 1e-3 for adam/adamw)")
    how.add_argument("--momentum", type=_number(float, 0.0), default=0.9, help="SGD momentum")
    how.add_argument("--weight-decay", type=_number(float, 0.0), default=5e-4)
    how.add_argument("--schedule", default="cosine", choices=["cosine", "step", "constant"],
                     help="learning-rate schedule over all steps (step: x0.1 at 50%% and 75%%)")
    how.add_argument("--warmup", type=_number(float, 0.0), default=0.0, help="linear warm-up, in epochs")
    how.add_argument("--label-smoothing", type=_number(float, 0.0), default=0.0)
    run = parser.add_argument_group("running")
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    run.add_argument("--tf32", action="store_true", help="let float32 GEMMs use TF32 tensor cores (GPU)")
    run.add_argument("--seed", type=_number(int, 0), default=0, help="seeds weights, shuffling, dropout")
    run.add_argument("--workers", type=_number(int, 0), default=2, help="threads decoding samples")
    run.add_argument("--out", default=None, help="output directory (default: runs/<model>)")
    run.add_argument("--resume", default=None, metavar="PATH", help="checkpoint to continue from")
    run.add_argument("--eval-only", action="store_true", help="evaluate (the --resume checkpoint) and exit")
    run.add_argument("--max-steps", type=_number(int, 1), default=None,
                     help="stop after this many steps in total, saving a resumable checkpoint")
    run.add_argument("--log-every", type=_number(int, 1), default=20, help="steps between progress updates")
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = 0.05 if args.optimizer == "sgd" else 1e-3
    args.out = args.out or os.path.join("runs", args.model)
    return args


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _detect_format(path: str) -> str:
    names = set(os.listdir(path))
    everything = " ".join(names)
    if "cifar-10-batches-bin" in names or "data_batch_1.bin" in names:
        return "cifar10"
    if "cifar-100-binary" in names or {"train.bin", "test.bin"} <= names:
        return "cifar100"
    if "idx3-ubyte" in everything or "MNIST" in names or "raw" in names:
        return "mnist"
    return "imagefolder"


def build_datasets(args: argparse.Namespace, image_size: int) -> tuple[Any, Any, int]:
    """(train set, test set, number of classes) with each dataset's usual normalisation."""
    if args.data == "shapes10":
        train_images, train_labels = data.load_shapes("train", train_size=args.train_size, test_size=args.test_size)
        test_images, test_labels = data.load_shapes("test", train_size=args.train_size, test_size=args.test_size)
        mean = tuple(train_images.reshape(-1, 3).mean(axis=0) / 255)
        std = tuple(train_images.reshape(-1, 3).std(axis=0) / 255)
        pipeline = _pipeline(image_size, 32, mean, std, augment=[])
        return (data.ArrayDataset(train_images, train_labels, pipeline, seed=args.seed),
                data.ArrayDataset(test_images, test_labels, pipeline), len(data.SHAPES_CLASSES))
    if not os.path.isdir(args.data):
        raise FileNotFoundError(f"--data {args.data!r} is neither 'shapes10' nor an existing directory")
    kind = _detect_format(args.data) if args.format == "auto" else args.format
    if kind in ("cifar10", "cifar100"):
        flips = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
        train_t = _pipeline(image_size, 32, CIFAR_MEAN, CIFAR_STD, flips)
        test_t = _pipeline(image_size, 32, CIFAR_MEAN, CIFAR_STD, [])
        cls = data.CIFAR10 if kind == "cifar10" else data.CIFAR100
        train, test = cls(args.data, train=True, transform=train_t, seed=args.seed), cls(args.data, train=False,
                                                                                         transform=test_t)
        return train, test, len(train.classes)
    if kind in ("mnist", "fashion-mnist"):
        gray = (0.1307,) * 3 if kind == "mnist" else (0.2860,) * 3
        spread = (0.3081,) * 3 if kind == "mnist" else (0.3530,) * 3
        pipe = T.Compose([_GrayToRGB(), _pipeline(image_size, 28, gray, spread, [])])
        cls = data.MNIST if kind == "mnist" else data.FashionMNIST
        return cls(args.data, train=True, transform=pipe, seed=args.seed), cls(args.data, train=False, transform=pipe), 10
    folder = [os.path.join(args.data, split) for split in ("train", "val")]
    if not all(os.path.isdir(f) for f in folder):
        raise FileNotFoundError(f"an image-folder dataset needs {folder[0]!r} and {folder[1]!r}, one sub-folder per class")
    train_t = T.Compose([T.Resize(image_size), T.RandomCrop(image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                         T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    test_t = T.Compose([T.Resize(image_size), T.CenterCrop(image_size), T.ToTensor(),
                        T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    train = data.ImageFolder(folder[0], transform=train_t, seed=args.seed)
    return train, data.ImageFolder(folder[1], transform=test_t), len(train.classes)


class _GrayToRGB:
    """HW grey images (MNIST) to HWC with three equal channels, so every model takes RGB."""

    def __call__(self, image: Any, rng: Any = None) -> np.ndarray:
        return np.repeat(np.asarray(image)[:, :, None], 3, axis=2)


def _pipeline(image_size: int, native: int, mean: Sequence[float], std: Sequence[float], augment: list) -> T.Compose:
    resize = [] if image_size == native else [T.Resize((image_size, image_size))]
    return T.Compose([*augment, *resize, T.ToTensor(), T.Normalize(mean, std)])


# ----------------------------------------------------------------------------------------------
# Model, optimiser, schedule
# ----------------------------------------------------------------------------------------------
def build_optimizer(args: argparse.Namespace, model: Any, steps_per_epoch: int):
    if args.optimizer == "sgd":
        optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    else:
        kind = optim.Adam if args.optimizer == "adam" else optim.AdamW
        optimizer = kind(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    total = args.epochs * steps_per_epoch
    warmup = min(int(round(args.warmup * steps_per_epoch)), total - 1)
    decay_steps = max(total - warmup, 1)
    if args.schedule == "cosine":
        decay = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=decay_steps)
    elif args.schedule == "step":
        decay = optim.lr_scheduler.MultiStepLR(optimizer, [decay_steps // 2, decay_steps * 3 // 4], gamma=0.1)
    else:
        decay = optim.lr_scheduler.StepLR(optimizer, step_size=decay_steps + 1, gamma=1.0)
    if warmup == 0:
        return optimizer, decay
    ramp = optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup, total_iters=warmup)
    return optimizer, optim.lr_scheduler.SequentialLR(optimizer, [ramp, decay], milestones=[warmup])


# ----------------------------------------------------------------------------------------------
# Training and evaluation
# ----------------------------------------------------------------------------------------------
class Meter:
    """Sums of loss and correct predictions kept on the device: reading them is the only host sync."""

    def __init__(self) -> None:
        self.loss, self.correct, self.count = None, None, 0

    def add(self, logits: minidnn.Tensor, labels: minidnn.Tensor, loss: minidnn.Tensor) -> None:
        batch = labels.shape[0]
        loss_sum = loss.detach() * batch
        correct = (logits.detach().argmax(1) == labels).sum()
        self.loss = loss_sum if self.loss is None else self.loss + loss_sum
        self.correct = correct if self.correct is None else self.correct + correct
        self.count += batch

    def read(self) -> tuple[float, float]:
        if not self.count:
            return float("nan"), float("nan")
        return self.loss.item() / self.count, self.correct.item() / self.count

    def state(self) -> dict[str, float]:
        loss, accuracy = self.read()
        return {"loss_sum": loss * self.count, "correct": accuracy * self.count, "count": self.count}

    @classmethod
    def from_state(cls, state: dict[str, float]) -> "Meter":
        meter = cls()
        if state["count"]:
            meter.loss, meter.correct = minidnn.tensor(state["loss_sum"]), minidnn.tensor(state["correct"])
            meter.count = int(state["count"])
        return meter


def evaluate(model: Any, loader: data.DataLoader, device: str) -> tuple[float, float]:
    model.eval()
    meter = Meter()
    with minidnn.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            meter.add(logits, labels, F.cross_entropy(logits, labels))
    model.train()
    return meter.read()


class StopRequest:
    """First Ctrl-C: finish the current step, save, exit. A second one interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, self.previous)
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self.previous)


def write_metrics(out: str, history: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(row) + "\n" for row in history)
    atomic_write(os.path.join(out, "metrics.jsonl"), lambda f: f.write(text.encode()))
    try:
        import matplotlib  # noqa: PLC0415 - optional: the `plot` extra

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError:
        return
    epochs = [row["epoch"] for row in history]
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, [row["train_loss"] for row in history], "o-", label="train")
    left.plot(epochs, [row["test_loss"] for row in history], "o-", label="test")
    right.plot(epochs, [100 * row["train_accuracy"] for row in history], "o-", label="train")
    right.plot(epochs, [100 * row["test_accuracy"] for row in history], "o-", label="test")
    for axes, title in ((left, "cross-entropy loss"), (right, "accuracy (%)")):
        axes.set_xlabel("epoch")
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    atomic_write(os.path.join(out, "curves.png"), lambda f: figure.savefig(f, format="png", dpi=100))
    pyplot.close(figure)


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Everything a run needs; a setting that makes no sense is a ``SystemExit`` with a one-line message."""
    try:
        device = str(minidnn.device(args.device))
        if device.startswith("cuda") and not minidnn.cuda.is_available():
            raise RuntimeError("--device cuda: CUDA is not available on this machine (a GPU and a CUDA build of "
                               "CuPy are needed: pip install -e '.[cuda13]')")
        minidnn.backend.set_allow_tf32(args.tf32)
        train_set, test_set, num_classes = build_datasets(args, args.image_size or models.input_size(args.model))
        minidnn.manual_seed(args.seed)
        model = models.create(args.model, num_classes=num_classes).to(device)
        train_loader = data.DataLoader(train_set, args.batch_size, shuffle=True, drop_last=True, seed=args.seed,
                                       num_workers=args.workers)
        if len(train_loader) == 0:
            raise ValueError(f"--batch-size {args.batch_size} is larger than the training set ({len(train_set)} images)")
        test_loader = data.DataLoader(test_set, max(args.batch_size, 128), num_workers=args.workers)
        optimizer, scheduler = build_optimizer(args, model, len(train_loader))
        run = dict(device=device, model=model, train_loader=train_loader, test_loader=test_loader,
                   optimizer=optimizer, scheduler=scheduler, step=0, history=[], best=0.0, meter=Meter())
        if args.resume:
            checkpoint = minidnn.load_checkpoint(args.resume, model, optimizer, scheduler)
            if checkpoint.extra.get("model") != args.model:
                raise ValueError(f"checkpoint {args.resume!r} is of model {checkpoint.extra.get('model')!r}, "
                                 f"not --model {args.model}")
            run.update(step=checkpoint.step, history=checkpoint.extra["history"], best=checkpoint.extra["best"],
                       meter=Meter.from_state(checkpoint.extra["meter"]))
        return run
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise SystemExit(f"train.py: error: {error}") from None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    run = prepare(args)
    device, model, optimizer, scheduler = run["device"], run["model"], run["optimizer"], run["scheduler"]
    train_loader, test_loader = run["train_loader"], run["test_loader"]
    step, history, best, meter = run["step"], run["history"], run["best"], run["meter"]
    if args.eval_only:
        loss, accuracy = evaluate(model, test_loader, device)
        print(f"test loss {loss:.4f}, test accuracy {100 * accuracy:.2f}% ({len(test_loader.dataset)} images)")
        return {"test_loss": loss, "test_accuracy": accuracy}

    os.makedirs(args.out, exist_ok=True)
    steps_per_epoch = len(train_loader)

    def save(name: str) -> None:
        minidnn.save_checkpoint(os.path.join(args.out, name), model, optimizer, scheduler, step,
                                extra=dict(model=args.model, history=history, best=best, meter=meter.state(),
                                           args=vars(args)))

    stop = StopRequest()
    try:
        for epoch in range(step // steps_per_epoch, args.epochs):
            train_loader.set_epoch(epoch)
            first = step - epoch * steps_per_epoch
            started, images_seen = time.perf_counter(), 0
            bar = tqdm(train_loader.iterate(first), total=steps_per_epoch, initial=first, unit="step",
                       desc=f"epoch {epoch + 1}/{args.epochs}", dynamic_ncols=True, leave=True)
            for images, labels in bar:
                images, labels = images.to(device), labels.to(device)
                logits = model(images)
                loss = F.cross_entropy(logits, labels, label_smoothing=args.label_smoothing)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
                meter.add(logits, labels, loss)
                step += 1
                images_seen += labels.shape[0]
                if step % args.log_every == 0 or step % steps_per_epoch == 0:
                    train_loss, train_accuracy = meter.read()
                    rate = images_seen / (time.perf_counter() - started)
                    bar.set_postfix(loss=f"{train_loss:.3f}", acc=f"{100 * train_accuracy:.1f}%",
                                    lr=f"{scheduler.get_last_lr()[0]:.3g}", img_s=f"{rate:.0f}")
                if stop.requested or (args.max_steps is not None and step >= args.max_steps):
                    bar.close()
                    save("last.npz")
                    print(f"stopped after step {step}; resume with --resume {os.path.join(args.out, 'last.npz')}")
                    return {"step": step, "stopped": True}
            bar.close()
            train_loss, train_accuracy = meter.read()
            test_loss, test_accuracy = evaluate(model, test_loader, device)
            history.append({"epoch": epoch + 1, "step": step, "train_loss": train_loss,
                            "train_accuracy": train_accuracy, "test_loss": test_loss, "test_accuracy": test_accuracy,
                            "lr": scheduler.get_last_lr()[0], "seconds": round(time.perf_counter() - started, 2),
                            "images_per_second": round(images_seen / (time.perf_counter() - started), 1)})
            meter = Meter()
            write_metrics(args.out, history)
            print(f"epoch {epoch + 1}: train loss {train_loss:.4f} acc {100 * train_accuracy:.2f}% | "
                  f"test loss {test_loss:.4f} acc {100 * test_accuracy:.2f}%")
            if test_accuracy > best:
                best = test_accuracy
                save("best.npz")
            save("last.npz")
    finally:
        stop.restore()
    print(f"best test accuracy {100 * best:.2f}%; metrics, curves and checkpoints in {args.out}")
    return {"step": step, "best_test_accuracy": best, "history": history}


if __name__ == "__main__":
    main()
