"""Train a model with minidnn, the way PyTorch's examples do it.

    python train.py                                  # small CNN on the built-in shapes10 data, CPU
    python train.py --model resnet20 --epochs 3      # a CIFAR ResNet on shapes10
    python train.py --model resnet20 --data ~/data/cifar-10-batches-bin --device cuda
    python train.py --resume runs/shapes_cnn/last.npz  # continue exactly where a run stopped
    python train.py --init-from runs/shapes_cnn/best.npz --data ~/data/my-images --out runs/tuned  # fine-tune

Each epoch evaluates on the test split; --out gets metrics.jsonl (one JSON line per epoch),
curves.png (loss and accuracy), last.npz and best.npz (checkpoints, which also describe the model,
its input preprocessing and its classes: models.load_pretrained rebuilds a ready model from one, and
examples/predict.py classifies image files with it). Ctrl-C or SIGTERM saves last.npz and exits with
130 or 143; --resume continues from it, bit for bit as if the run had not stopped, with the run's own
settings; --init-from starts a new run from its weights. One run at a time holds --out (a lock file,
train.lock). What a user can rely on is written down in docs/training.md.

    python train.py --device cuda --gpus 4 --batch-size 64   # data-parallel: 4 processes, global batch 256
    python -m minidnn.distributed.run --nproc-per-node 4 train.py --device cuda --batch-size 64   # the same

Data-parallel (docs/distributed.md): one process per GPU (or CPU rank, --device cpu), each with the whole
model (DistributedDataParallel) and its shard of every batch; rank 0 alone writes --out and prints.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

import minidnn
import minidnn.distributed as dist
import minidnn.functional as F
import models
from minidnn import data, optim
from minidnn.checkpoint import Checkpoint, atomic_write, remove_orphans
from minidnn.serialization import load_weights
from minidnn.cuda import graphs
from minidnn.distributed.parallel import broadcast_coalesced
from minidnn.primitives import conv as conv_settings
from minidnn.primitives.conv import planner
from minidnn.data import transforms as T
from minidnn.data.folder import UnreadableImageError

# The files a run writes in --out (their temporaries are <name>.minidnn-<hex>.tmp, see checkpoint.py).
RUN_FILES = ("last.npz", "best.npz", "metrics.jsonl", "curves.png")
# The lock a run holds on --out (see OutLock); it is not a file of the run, and it stays there.
LOCK_FILE = "train.lock"

# Settings that define what a run computes. A resumed run takes them from its checkpoint; given
# again with another value they are refused, because they would change what the saved position
# means: the learning-rate schedule spans all --epochs (more epochs would restart the cosine from
# its end), and --batch-size, --seed and the data settings fix which images each step sees.
FIXED = ("model", "epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "schedule", "warmup",
         "label_smoothing", "seed", "format", "image_size", "train_size", "test_size")
# Taken from the checkpoint unless given: the data may have moved (to a node's local disk), and
# skipping unreadable images may be switched on to get past a bad file. --sync-batchnorm changes what
# a data-parallel step computes, so a resumed run keeps it unless told otherwise; so does --amp, the
# precision the run trains in (which may be changed on resume: the weights are float32 either way).
CARRIED = ("data", "skip_corrupt", "sync_batchnorm", "amp")


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------
def _number(kind: type, low: float, inclusive: bool = True, below: float | None = None):
    """An argparse type: a ``kind`` (int or float) >= ``low`` (> if not ``inclusive``), < ``below``.
    Floats must be finite: ``float("nan")`` parses, and NaN passes every ``<`` test."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < low or (value == low and not inclusive) or (below is not None and value >= below):
            bounds = f"{'>=' if inclusive else '>'} {low}" + ("" if below is None else f" and < {below}")
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value
    return parse


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where there is none to show (None, a
    switch that is off) or the help text says it in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS)) or "default" in text:
            return text
        return super()._get_help_string(action)


def _size(text: str) -> int:
    try:
        return conv_settings.parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    """train.py's options, each with its range check (see :func:`parse_args`)."""
    parser = argparse.ArgumentParser(
        prog="train.py", description="Train a CNN with minidnn (small CNN on built-in data by default).",
        formatter_class=_HelpFormatter)
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
    what.add_argument("--skip-corrupt", action=argparse.BooleanOptionalAction, default=False,
                      help="image folders: skip unreadable images (each named in a warning) instead of stopping")
    how = parser.add_argument_group("optimisation")
    how.add_argument("--epochs", type=_number(int, 1), default=3, help="passes over the training set")
    how.add_argument("--batch-size", type=_number(int, 1), default=64, help="images per training step")
    how.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"], help="update rule")
    how.add_argument("--lr", type=_number(float, 0.0, inclusive=False), default=None,
                     help="peak learning rate (default: 0.05 for sgd, 1e-3 for adam/adamw)")
    how.add_argument("--momentum", type=_number(float, 0.0, below=1.0), default=0.9, help="SGD momentum")
    how.add_argument("--weight-decay", type=_number(float, 0.0), default=5e-4, help="L2 penalty (decoupled for adamw)")
    how.add_argument("--schedule", default="cosine", choices=["cosine", "step", "constant"],
                     help="learning-rate schedule over all steps (step: x0.1 at 50%% and 75%%)")
    how.add_argument("--warmup", type=_number(float, 0.0), default=0.0,
                     help="linear warm-up, in epochs (less than --epochs)")
    how.add_argument("--label-smoothing", type=_number(float, 0.0, below=1.0), default=0.0,
                     help="cross-entropy label smoothing, in [0, 1)")
    run = parser.add_argument_group("running")
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    run.add_argument("--tf32", action="store_true", help="let float32 GEMMs use TF32 tensor cores (GPU)")
    run.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"],
                     help="mixed precision: convolutions and linear layers in bfloat16 or float16 under autocast "
                          "(fp16 with dynamic loss scaling); weights and optimizer state stay float32")
    run.add_argument("--channels-last", action="store_true",
                     help="lay the convolution weights and each batch out channels-last (NHWC; PyTorch's "
                          "memory_format=torch.channels_last), the layout the half-precision convolutions read "
                          "without copies (docs/training.md, Channels-last tensors)")
    run.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                     help="capture the training step as one CUDA graph after its first step and replay it "
                          "(default: on with --device cuda; --no-cuda-graph runs every step eagerly)")
    conv = parser.add_argument_group("convolution algorithms (docs/convolution.md, docs/microbatching.md)")
    conv.add_argument("--workspace-limit", type=_size, default=None,
                      help="workspace bytes one convolution may use, e.g. 8MiB, 64MiB, 512MiB (default 64MiB)")
    conv.add_argument("--microbatch", default="off", choices=["off", "wr", "wd"],
                      help="split a convolution's batch to fit faster algorithms: per layer (wr) or under one "
                           "budget for the network (wd, budget = limit x convolution calls per step)")
    conv.add_argument("--batch-policy", default="powers_of_two", choices=["undivided", "powers_of_two", "all"],
                      help="micro-batch sizes wr and wd may use")
    run.add_argument("--gpus", type=_number(int, 1), default=1,
                     help="data-parallel processes on this machine, one per GPU (or CPU ranks with --device cpu): "
                          "train.py starts them through python -m minidnn.distributed.run; --batch-size is per "
                          "process, so the global batch is N x --batch-size")
    run.add_argument("--sync-batchnorm", action=argparse.BooleanOptionalAction, default=False,
                     help="data-parallel runs: batch norm with the global batch's statistics (SyncBatchNorm) instead "
                          "of each process's own")
    run.add_argument("--seed", type=_number(int, 0), default=0, help="seeds weights, shuffling, dropout")
    run.add_argument("--deterministic", action="store_true",
                     help="bitwise-identical runs: only algorithms whose results do not depend on scheduling")
    run.add_argument("--workers", type=_number(int, 0), default=2,
                     help="worker processes decoding image files (in-memory data is read in-process)")
    run.add_argument("--out", default=None,
                     help="output directory (default: the --resume checkpoint's directory, else runs/<model>)")
    run.add_argument("--overwrite", action="store_true", help="replace the run that --out holds")
    run.add_argument("--resume", default=None, metavar="PATH",
                     help="checkpoint to continue from, with its settings (see docs/training.md)")
    run.add_argument("--init-from", default=None, metavar="PATH",
                     help="start a new run (epoch 0, fresh optimizer and schedule) from the weights of a checkpoint "
                          "or a minidnn.save'd state dict; a classifier of another number of classes is "
                          "re-initialised for the data's classes (fine-tuning); --model defaults to the checkpoint's")
    run.add_argument("--eval-only", action="store_true", help="evaluate the --resume checkpoint and exit")
    run.add_argument("--max-steps", type=_number(int, 1), default=None,
                     help="stop after this many steps in total, saving a resumable checkpoint")
    run.add_argument("--log-every", type=_number(int, 1), default=20, help="steps between progress updates")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options, range-checked; ``args.given`` is the set of options given on the command line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.eval_only and not args.resume:
        parser.error("--eval-only needs --resume PATH, the checkpoint to evaluate (without one the weights are random)")
    if args.init_from and args.resume:
        parser.error("--init-from starts a new run from a checkpoint's weights and --resume continues a run: give one")
    # Which options were given (a resumed run takes the others from its checkpoint): parse again
    # into a namespace filled with a marker; argparse writes defaults only where nothing is set.
    unset = object()
    probe = parser.parse_args(argv, argparse.Namespace(**{name: unset for name in vars(args)}))
    args.given = {name for name, value in vars(probe).items() if value is not unset}
    if args.lr is None:
        args.lr = 0.05 if args.optimizer == "sgd" else 1e-3
    if args.gpus > 1 and args.device.startswith("cuda"):
        if args.device != "cuda":
            parser.error(f"--gpus {args.gpus} runs one process per GPU, each on its own (GPU LOCAL_RANK): give "
                         f"--device cuda, not --device {args.device}")
        visible = minidnn.cuda.device_count()
        if args.gpus > visible:
            parser.error(f"--gpus {args.gpus} is more than the {visible} CUDA GPU(s) this machine shows")
    return args


class World:
    """This process's place in a data-parallel run, from the launcher's environment (torchrun's variables):
    ``rank``, ``size`` (the world size), ``local_rank``, ``local_size``. ``launched``: started by a launcher
    (``RANK`` and ``WORLD_SIZE`` are set), so the run is data-parallel, also with one process. ``main``: rank 0,
    the one that writes --out and prints."""

    def __init__(self, environment: Any = None) -> None:
        environment = os.environ if environment is None else environment
        self.launched = "RANK" in environment and "WORLD_SIZE" in environment
        get = (lambda name, default: int(environment.get(name, default))) if self.launched else (lambda _, d: d)
        self.rank, self.size = get("RANK", 0), get("WORLD_SIZE", 1)
        self.local_rank, self.local_size = get("LOCAL_RANK", 0), get("LOCAL_WORLD_SIZE", self.size)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device(self, args: argparse.Namespace) -> str:
        """The device of this process: --device, and under the launcher with --device cuda, GPU LOCAL_RANK."""
        device = minidnn.device(args.device)
        if not self.launched or device.type != "cuda":
            return str(device)
        if args.device != "cuda" and device.index != self.local_rank:
            raise ValueError(f"--device {args.device}: under the launcher each process drives GPU LOCAL_RANK "
                             f"(cuda:{self.local_rank} here); give --device cuda")
        return f"cuda:{self.local_rank}"


def launch(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """--gpus N > 1 outside a launcher: start N copies of this script through ``python -m minidnn.distributed.run``
    with the same arguments (each sees the launcher's environment, so it trains as one rank) and wait for them;
    a rank that fails ends the job, and the launcher's exit code (the dead rank's) is this one's."""
    from minidnn.distributed import run as launcher  # noqa: PLC0415 - only for this path

    port = os.environ.get("MASTER_PORT") or str(launcher.free_port())
    arguments = list(sys.argv[1:] if argv is None else argv)
    code = launcher.main(["--nproc-per-node", str(args.gpus), "--master-port", port, os.path.abspath(__file__),
                          *arguments])
    if code:
        raise SystemExit(code)
    return {"world_size": args.gpus, "exit_code": 0}


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
    """(train set, test set, number of classes) with each dataset's usual augmentation and normalisation.

    In-memory images at their native size (shapes10, CIFAR) come raw, uint8 HWC, and their pipeline is
    a batch transform in ``dataset.batch_transform`` (transforms.CropFlipNormalize, which the loader runs
    on the batch's device: the same draws and the same images as the per-sample RandomCrop, flip,
    ToTensor and Normalize, one kernel on the GPU). Image folders decode and crop per sample (in worker
    processes) and normalise as a batch the same way; MNIST and resized data keep per-sample pipelines.
    """
    if args.data == "shapes10":
        train_images, train_labels = data.load_shapes("train", train_size=args.train_size, test_size=args.test_size)
        test_images, test_labels = data.load_shapes("test", train_size=args.train_size, test_size=args.test_size)
        mean, std = (tuple(statistic / 255) for statistic in T.channel_statistics(train_images))
        if image_size == 32:  # no augmentation, as before: layout and normalisation only
            train = data.ArrayDataset(train_images, train_labels, seed=args.seed)
            test = data.ArrayDataset(test_images, test_labels)
            train.batch_transform = test.batch_transform = T.CropFlipNormalize(mean, std)
            return train, test, len(data.SHAPES_CLASSES)
        pipeline = _pipeline(image_size, 32, mean, std, augment=[])
        return (data.ArrayDataset(train_images, train_labels, pipeline, seed=args.seed),
                data.ArrayDataset(test_images, test_labels, pipeline), len(data.SHAPES_CLASSES))
    if not os.path.isdir(args.data):
        raise FileNotFoundError(f"--data {args.data!r} is neither 'shapes10' nor an existing directory")
    kind = _detect_format(args.data) if args.format == "auto" else args.format
    if kind in ("cifar10", "cifar100"):
        cls = data.CIFAR10 if kind == "cifar10" else data.CIFAR100
        if image_size == 32:
            train, test = cls(args.data, train=True, seed=args.seed), cls(args.data, train=False)
            train.batch_transform = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD, crop=32, padding=4, flip=0.5)
            test.batch_transform = T.CropFlipNormalize(CIFAR_MEAN, CIFAR_STD)
            return train, test, len(train.classes)
        flips = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
        train_t = _pipeline(image_size, 32, CIFAR_MEAN, CIFAR_STD, flips)
        test_t = _pipeline(image_size, 32, CIFAR_MEAN, CIFAR_STD, [])
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
    train_t = T.Compose([T.Resize(image_size), T.RandomCrop(image_size), T.RandomHorizontalFlip()])
    test_t = T.Compose([T.Resize(image_size), T.CenterCrop(image_size)])
    train = data.ImageFolder(folder[0], transform=train_t, seed=args.seed, skip_corrupt=args.skip_corrupt)
    # val/ takes train/'s class indices: sorted on its own, a missing or an extra class would shift
    # them, and every validation image would be scored against another class's label.
    test = data.ImageFolder(folder[1], transform=test_t, skip_corrupt=args.skip_corrupt, classes=train.classes)
    train.batch_transform = test.batch_transform = T.CropFlipNormalize(IMAGENET_MEAN, IMAGENET_STD)  # ToTensor, Normalize
    return train, test, len(train.classes)


def build_loader(args: argparse.Namespace, dataset: Any, device: str, train: bool,
                 world: World | None = None) -> data.DataLoader:
    """The loader of one split: batches on ``device`` (on a GPU: pinned, copied on a side stream, augmented
    there), image files decoded by --workers worker processes (in-memory data is read in this process:
    a batch is one gather), the training split reshuffled every epoch.

    Data-parallel (``world.launched``), this rank's share. Training: a DistributedSampler of the same
    permutation as one process's loader (seed --seed, reshuffled per epoch through its ``set_epoch``),
    without padding (``drop_last``): global batch k is then elements k·G..(k+1)·G of the epoch's
    permutation (G = world size x --batch-size) whatever the world size, which is what lets a run resume
    with another one. Test: every world-size-th image from the rank's own on, unpadded, so the summed
    metrics count each test image once, as one process does."""
    files = isinstance(dataset, data.ImageFolder)
    workers = args.workers if files else 0
    options = dict(num_workers=workers, persistent_workers=workers > 0,
                   batch_transform=getattr(dataset, "batch_transform", None),
                   device=device if device.startswith("cuda") else None)
    batch = args.batch_size if train else max(args.batch_size, 128)
    if world is None or not world.launched:
        return data.DataLoader(dataset, batch, shuffle=train, drop_last=train, seed=args.seed if train else None,
                               **options)
    if train:
        sampler = dist.DistributedSampler(dataset, world.size, world.rank, shuffle=True, seed=args.seed,
                                          drop_last=True)
        return data.DataLoader(dataset, batch, drop_last=True, sampler=sampler, **options)
    return data.DataLoader(dataset, batch, sampler=range(world.rank, len(dataset), world.size), **options)


class _GrayToRGB:
    """HW grey images (MNIST) to HWC with three equal channels, so every model takes RGB."""

    def __call__(self, image: Any, rng: Any = None) -> np.ndarray:
        return np.repeat(np.asarray(image)[:, :, None], 3, axis=2)


def sample_pipeline(dataset: Any) -> Any:
    """What one image of ``dataset`` goes through on its way into the model: its per-sample transform,
    then the per-sample twin of its batch transform (in-memory data has only the latter, image folders
    both: a crop per sample, the normalisation per batch)."""
    transform, batch = getattr(dataset, "transform", None), getattr(dataset, "batch_transform", None)
    if batch is None:
        return transform
    return batch.per_sample() if transform is None else T.Compose([transform, batch.per_sample()])


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
class TrainingError(Exception):
    """Training cannot go on (a non-finite loss, an unreadable image); the message says what was saved."""


class Meter:
    """Sums of loss and correct predictions, and the epoch's training time, so that a resumed epoch reports the
    same numbers as one never stopped. Each batch's loss, logits and labels stay on the device until the sums are
    read (a host sync, which the progress bar makes every --log-every steps anyway, and at least every
    ``GATHER_AFTER`` batches): an eager batch costs no kernel here, and the argmax is the host's at the read.

    Data-parallel, each rank adds its own batches and :meth:`all_reduce` (called by every rank at the
    same step) moves every rank's sums since the last call into ``reduced_loss``/``reduced_correct``
    (host numbers, the same on every rank): ``count`` then counts every rank's images, and the means
    are over the global batches, as one process's are."""

    GATHER_AFTER = 64  # unread batches at most: an evaluation's logits are not all held on the device

    def __init__(self) -> None:
        self.count, self.seconds = 0, 0.0
        self.loss_sum = self.correct_sum = 0.0  # this rank's sums, as far as they have been read
        self.reduced_loss = self.reduced_correct = 0.0
        self.pending = 0  # this rank's images not yet all-reduced
        self._losses: list[minidnn.Tensor] = []  # each unread batch's mean loss, on the device
        self._batches: list[int] = []  # and its size
        self._logits: list[minidnn.Tensor] = []  # and its logits
        self._labels: list[minidnn.Tensor] = []  # and its labels

    def add(self, logits: minidnn.Tensor, labels: minidnn.Tensor, loss: minidnn.Tensor, copy: bool = False) -> None:
        """``loss``, ``logits``, ``labels``: arrays the meter may keep until it is read. ``copy``: the logits are an
        array a later step writes again (a replayed CUDA graph's output), so a copy is kept. The loss must not be
        such an array: train.py passes what LossWatch.add kept (its copy of a replayed step's loss)."""
        batch = labels.shape[0]
        self._losses.append(loss.detach())
        self._batches.append(batch)
        self._logits.append(minidnn.tensor(logits.detach()) if copy else logits.detach())
        self._labels.append(labels)
        self.count += batch
        self.pending += batch
        if len(self._losses) >= self.GATHER_AFTER:
            self._gather()

    def _gather(self) -> None:
        """Add the unread batches into the host sums: one transfer each of their losses, logits and labels, summed
        on the host (a CuPy reduction over however many batches were unread would be a kernel compiled anew for each
        new size class of that count, in the middle of a first run)."""
        if not self._losses:
            return
        losses = minidnn.stack(self._losses).numpy().astype(np.float64)
        self.loss_sum += float(losses @ np.asarray(self._batches, dtype=np.float64))
        predicted = minidnn.cat(self._logits).numpy().astype(np.float32).argmax(1)  # half logits widened exactly
        self.correct_sum += float(np.count_nonzero(predicted == minidnn.cat(self._labels).numpy()))
        self._losses, self._batches, self._logits, self._labels = [], [], [], []

    def read(self) -> tuple[float, float]:
        if not self.count:
            return float("nan"), float("nan")
        self._gather()
        return (self.reduced_loss + self.loss_sum) / self.count, (self.reduced_correct + self.correct_sum) / self.count

    def all_reduce(self, device: str, flags: Sequence[float] = ()) -> list[float]:
        """Sum every rank's sums since the last call into the reduced ones (a collective: every rank calls it at
        the same step); ``flags``, numbers summed over the ranks in the same collective, come back summed."""
        self._gather()
        local = [self.loss_sum, self.correct_sum, float(self.pending), *flags]
        total = minidnn.tensor(np.array(local, dtype=np.float64), device=device)
        dist.all_reduce(total)
        values = total.numpy().tolist()
        self.reduced_loss += values[0]
        self.reduced_correct += values[1]
        self.count += int(round(values[2])) - self.pending
        self.loss_sum = self.correct_sum = 0.0
        self.pending = 0
        return values[3:]

    def state(self) -> dict[str, float]:
        loss, accuracy = self.read()
        return {"loss_sum": loss * self.count, "correct": accuracy * self.count, "count": self.count,
                "seconds": self.seconds}

    @classmethod
    def from_state(cls, state: dict[str, float], reduced: bool = False) -> "Meter":
        """The meter of a saved state; ``reduced`` (data-parallel): as every rank's sums, on every rank."""
        meter = cls()
        if state["count"]:
            if reduced:
                meter.reduced_loss, meter.reduced_correct = float(state["loss_sum"]), float(state["correct"])
            else:
                meter.loss_sum, meter.correct_sum = float(state["loss_sum"]), float(state["correct"])
            meter.count = int(state["count"])
        meter.seconds = float(state.get("seconds", 0.0))
        return meter


class LossWatch:
    """The training losses since the last check, left on the device. Reading a loss makes the host
    wait for the GPU, so they are read together: where the progress bar reads the meter anyway, at
    the end of an epoch and before anything is saved. A NaN is therefore found up to --log-every
    steps late; the weights are lost by then anyway (NaN gradients), and they are never saved."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, minidnn.Tensor]] = []

    def add(self, step: int, loss: minidnn.Tensor, copy: bool = True) -> minidnn.Tensor:
        """Keep the step's loss; returns the loss kept, which the meter may keep too. ``copy``: the loss is an array
        a later step writes again (a replayed CUDA graph writes each step's loss into the same one), so a copy is
        kept; an eager step's loss is its own."""
        kept = minidnn.tensor(loss.detach()) if copy else loss.detach()
        self.pending.append((step, kept))
        return kept

    def first_non_finite(self) -> tuple[int, float] | None:
        """(step, loss) of the first non-finite loss since the last call, or None."""
        if not self.pending:
            return None
        values = minidnn.stack([loss for _, loss in self.pending]).numpy()  # one transfer
        steps, self.pending = [step for step, _ in self.pending], []
        bad = np.flatnonzero(~np.isfinite(values))
        return (steps[bad[0]], float(values[bad[0]])) if bad.size else None


def laid_out(images: minidnn.Tensor, channels_last: bool) -> minidnn.Tensor:
    """A batch as the model takes it: channels-last with --channels-last (a transpose on the device), else as is."""
    return images.to(memory_format=minidnn.channels_last) if channels_last else images


def evaluate(model: Any, loader: data.DataLoader, device: str, stop: "StopRequest | None" = None,
             world: World | None = None, channels_last: bool = False) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over ``loader``, in eval mode (the train mode is restored); with
    ``stop``, a signal ends the evaluation at the next batch (see :class:`StopRequest`). Data-parallel
    (``world.launched``), every rank evaluates its shard and the sums are all-reduced: the metrics are the
    whole test set's, on every rank. ``channels_last``: each batch is laid out channels-last first."""
    model.eval()
    meter = Meter()
    try:
        with minidnn.no_grad():
            for images, labels in (loader if stop is None else stop.batches(loader)):
                images, labels = images.to(device), labels.to(device)
                logits = model(laid_out(images, channels_last))
                meter.add(logits, labels, F.cross_entropy(logits, labels))
    finally:
        model.train()
    if world is not None and world.launched:
        meter.all_reduce(device)
    return meter.read()


# How long train.py's own process may take to exit after a stop before it is ended: the exit joins the
# loader's threads, and a thread blocked in the kernel on a read (a named pipe, a hung network mount)
# cannot be interrupted from Python, so that join would never return.
EXIT_GRACE_SECONDS = 1.0


def exit_within(seconds: float, code: int | str | None) -> None:
    """Make sure this process ends with ``code`` (SystemExit's meaning: None 0, a message 1) within
    ``seconds``: a daemon thread flushes the output and calls ``os._exit`` unless the normal exit has
    ended the process by then. The normal exit goes first, so its clean-up runs whenever it can."""
    status = 0 if code is None else code if isinstance(code, int) else 1

    def end() -> None:
        time.sleep(seconds)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)

    threading.Thread(target=end, name="train.py-exit", daemon=True).start()


class StopRequest:
    """The first SIGINT (Ctrl-C) or SIGTERM (schedulers, ``docker stop``) asks to stop: the work in
    flight (a training step, an evaluation batch) finishes, last.npz is saved where the run stands,
    and the run exits with 128 + the signal's number. Work not yet started is not started: iterating
    :meth:`batches`, the main thread either computes on a batch it has, or waits for the next one,
    and a signal that comes while it waits stops the run at once, from the handler. That wait is
    where a stuck reader (a file that never yields data) would hold the run forever, and nothing is
    half done there. A second signal exits at once: the save in progress is abandoned, its temporary
    file removed (an interrupted save never replaces last.npz, see minidnn/checkpoint.py).

    ``stop_now(signum)`` saves last.npz and reports the stop; in train.py's own process
    (``own_process``) every exit after a signal is bounded by :func:`exit_within`.

    ``deferred`` (data-parallel): the ranks must stop after the same step, so a signal is only recorded
    here; the training loop stops where the ranks agree on it (:meth:`Run.synchronise`, every --log-every
    steps and at the end of each epoch). ``quiet``: say nothing (the ranks other than 0)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, stop_now: Callable[[int], Any], own_process: bool = False, deferred: bool = False,
                 quiet: bool = False) -> None:
        self.signum: int | None = None
        self.waiting = False  # the main thread waits for a batch: no work is in flight
        self.stop_now, self.own_process, self.deferred, self.quiet = stop_now, own_process, deferred, quiet
        self.previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self.restore()
            os.write(2, f"\ntrain.py: second {name}: stopping at once\n".encode())
            self.exit(128 + signum)
        self.signum = signum
        # os.write, not print: a handler may interrupt a print (the progress bar's) on the same stream.
        if self.deferred:
            if not self.quiet:
                os.write(2, f"\ntrain.py: {name}: saving last.npz where the ranks next meet (within --log-every "
                         f"steps; {name} again stops at once)\n".encode())
            return
        if not self.waiting:
            os.write(2, f"\ntrain.py: {name}: saving last.npz after this step ({name} again stops at once)\n".encode())
            return
        os.write(2, f"\ntrain.py: {name}: saving last.npz now, no step is in flight ({name} again stops at once)\n"
                 .encode())
        self.stop()

    def stop(self) -> None:
        """Save and exit with 128 + the signal's number (after a signal)."""
        self.stop_now(self.signum)
        self.exit(128 + self.signum)

    def exit(self, code: int) -> None:
        if self.own_process:
            exit_within(EXIT_GRACE_SECONDS, code)
        raise SystemExit(code)

    def batches(self, iterable: Any) -> Iterator[Any]:
        """The items of ``iterable``, marking the waits for them (see the class); after a signal, the
        next item is not started: the run stops."""
        iterator = iter(iterable)
        while True:
            if self.signum is not None and not self.deferred:
                self.stop()
            self.waiting = True
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.waiting = False
            yield item

    def restore(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``path`` (a full disk, a read-only or vanished --out) into a
    one-line ``TrainingError`` naming the file and the error. Every file is written by
    ``atomic_write``, so the previous one is still whole."""
    try:
        yield
    except OSError as error:
        raise TrainingError(f"cannot write {path} ({error.strerror or error}); the previous one, if any, is "
                            f"intact") from None


def write_metrics(out: str, history: list[dict[str, Any]]) -> None:
    """Write --out/metrics.jsonl and (with matplotlib) --out/curves.png; a failed write is a ``TrainingError``."""
    text = "".join(json.dumps(row) + "\n" for row in history)
    path = os.path.join(out, "metrics.jsonl")
    with writing(path):
        atomic_write(path, lambda f: f.write(text.encode()))
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
    path = os.path.join(out, "curves.png")
    try:
        with writing(path):
            atomic_write(path, lambda f: figure.savefig(f, format="png", dpi=100))
    finally:
        pyplot.close(figure)


# ----------------------------------------------------------------------------------------------
# Setting up: everything that can be checked before the first step is
# ----------------------------------------------------------------------------------------------
_quiet = False  # the ranks other than 0 of a data-parallel run print nothing but their errors (see main)


def _warn(message: str) -> None:
    if not _quiet:
        print(f"train.py: warning: {message}", file=sys.stderr)


def _same_file(a: str | None, b: str) -> bool:
    return a is not None and os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def resume_settings(args: argparse.Namespace, checkpoint: Checkpoint, world_size: int = 1) -> None:
    """Take the run's settings from its checkpoint: those not given are carried over (and named),
    a FIXED one given with another value is a ``ValueError`` naming both values.

    The global batch (--batch-size x the run's world size) is what is fixed: resumed by ``world_size``
    processes, the per-process --batch-size is the global batch divided among them, so the steps, the
    schedule and the images of each step stay the saved run's (a ``ValueError`` if it does not divide)."""
    saved = checkpoint.extra.get("args")
    if not isinstance(saved, dict) or "history" not in checkpoint.extra:
        raise ValueError(f"{args.resume!r} is a minidnn checkpoint, but not one of train.py (it holds no run settings)")
    check_saved_settings(saved, args.resume)
    saved_world = checkpoint.extra.get("world_size", 1)
    if not isinstance(saved_world, int) or isinstance(saved_world, bool) or saved_world < 1:
        raise ValueError(f"{args.resume!r} is damaged: its world size {saved_world!r} is not a positive int")
    if "batch_size" in saved and saved_world != world_size:
        global_batch = saved["batch_size"] * saved_world
        if global_batch % world_size:
            raise ValueError(f"the checkpoint's global batch of {global_batch} ({saved['batch_size']} per process x "
                             f"{saved_world}) does not divide among {world_size} processes; resume with a number of "
                             f"processes that divides it")
        saved = {**saved, "batch_size": global_batch // world_size}
        print(f"train.py: a run of {saved_world} process(es) goes on with {world_size}: --batch-size "
              f"{saved['batch_size']} per process keeps its global batch of {global_batch}")
    carried = []
    for name in FIXED + CARRIED:
        if name not in saved:  # a checkpoint of an older train.py
            continue
        flag, old, new = "--" + name.replace("_", "-"), saved[name], getattr(args, name)
        if name not in args.given:
            if new != old:
                carried.append(f"{flag} {old}")
            setattr(args, name, old)
        elif new != old and name in FIXED:
            raise ValueError(f"{flag} {new} differs from the checkpoint's {flag} {old}: a resumed run keeps the "
                             f"settings that shape its schedule and data order; leave {flag} out to keep {old}, or "
                             f"start a new run with another --out")
        elif new != old:
            _warn(f"{flag} {new} replaces the checkpoint's {old}; it must give the same training images")
    print(f"train.py: {'evaluating' if args.eval_only else 'resuming'} {args.resume} at step {checkpoint.step}"
          + (f" with its settings {' '.join(carried)}" if carried else ""))


def check_saved_settings(saved: dict[str, Any], path: str) -> None:
    """A ``ValueError`` naming ``path`` unless each FIXED and CARRIED setting in ``saved`` is one the
    command line could have given: the parser's own choices and range checks, applied to the saved
    value (a damaged checkpoint would otherwise fail deep inside the run, or train with nonsense)."""
    actions = {action.dest: action for action in build_parser()._actions}
    for name in FIXED + CARRIED:
        if name not in saved or (saved[name] is None and actions[name].default is None):
            continue
        value, action = saved[name], actions[name]
        if isinstance(action, argparse.BooleanOptionalAction):
            good = isinstance(value, bool)
        elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
            good = False
        elif action.choices is not None:
            good = value in action.choices
        else:
            try:
                good = action.type is None or action.type(str(value)) == value
            except argparse.ArgumentTypeError:
                good = False
        if not good:
            raise ValueError(f"{path!r} is damaged: its setting {name} = {value!r} is not a value of "
                             f"--{name.replace('_', '-')}")


class OutLock:
    """One run at a time in a folder: an exclusive ``flock`` on ``<out>/train.lock``, taken before the
    run touches any other file there and held until it ends. The kernel releases the lock when the
    process ends, however it ends (``kill -9`` too), so it is never stale. The file itself stays:
    removing it would let a run waiting on the old file and a run creating a new one both hold "the"
    lock. It holds the process id of its holder, for the message of a run it refuses."""

    def __init__(self, out: str) -> None:
        self.path = os.path.join(out, LOCK_FILE)
        self.file = open(self.path, "a+")  # created if need be; not inherited by child processes
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            self.file.close()
            raise ValueError(f"--out {out!r} is in use by another train.py run"
                             + (f" (process {holder})" if holder.isdigit() else "")
                             + "; wait for it to end, or choose another --out") from None
        except OSError as error:  # a file system without locks (some network mounts)
            self.file.close()
            raise ValueError(f"--out {out!r}: cannot lock {self.path} ({error.strerror or error}); choose an --out "
                             f"on a local disk") from None
        self.file.truncate(0)
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()

    def _holder(self) -> str:
        """The holder's process id as the file says it; a run that took the lock an instant ago may not
        have written it yet, so an empty file is read again for a little while."""
        for _ in range(40):
            self.file.seek(0)
            holder = self.file.read().strip()
            if holder:
                return holder
            time.sleep(0.025)
        return ""

    def release(self) -> None:
        if not self.file.closed:
            self.file.close()  # closing the last descriptor of the file releases the lock


def check_out(args: argparse.Namespace) -> tuple[OutLock, list[str]]:
    """Fail fast on --out: it must be a writable directory (created if need be), no other run may be
    using it (the returned lock keeps it so for this run), and it must not hold another run unless
    --overwrite says to replace it. Removes the temporaries an earlier kill left there. Returns the
    lock and the files of another run to delete when training starts (--overwrite)."""
    out = args.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out!r} is a file, not a directory")
    try:
        os.makedirs(out, exist_ok=True)
        lock = OutLock(out)  # first: a second run started together with this one stops here, having changed nothing
    except OSError as error:
        raise ValueError(f"--out {out!r} is not a writable directory ({error.strerror or error})") from None
    try:
        return lock, _check_out_contents(args)
    except BaseException:
        lock.release()
        raise


def _check_out_contents(args: argparse.Namespace) -> list[str]:
    out = args.out
    try:
        with tempfile.TemporaryFile(dir=out):  # anonymous: a kill leaves nothing behind
            pass
    except OSError as error:
        raise ValueError(f"--out {out!r} is not a writable directory ({error.strerror or error})") from None
    last = os.path.join(out, "last.npz")
    other = [] if _same_file(args.resume, last) else \
        [name for name in RUN_FILES if os.path.exists(os.path.join(out, name))
         and not _same_file(args.resume, os.path.join(out, name))]
    if other and not args.overwrite:
        if args.resume:
            raise ValueError(f"--out {out!r} holds a run ({', '.join(other)}) that resuming {args.resume!r} there "
                             f"would replace; choose another --out, or add --overwrite to replace it")
        hint = f"continue it with --resume {last}, " if os.path.exists(last) else ""
        raise ValueError(f"--out {out!r} already holds a run ({', '.join(other)}); {hint}start a new run with "
                         f"another --out, or add --overwrite to replace it")
    removed = remove_orphans(out, RUN_FILES)
    if removed:
        print(f"train.py: removed {len(removed)} temporary file(s) an interrupted save left: "
              f"{', '.join(os.path.basename(path) for path in removed)}")
    return [os.path.join(out, name) for name in other]


def check_settings(args: argparse.Namespace, checkpoint: Checkpoint | None) -> None:
    """The checks that involve more than one option (each option's own range is argparse's)."""
    if args.warmup >= args.epochs:
        raise ValueError(f"--warmup {args.warmup} must be less than --epochs {args.epochs}")
    if checkpoint is not None and args.max_steps is not None and args.max_steps <= checkpoint.step:
        raise ValueError(f"--max-steps {args.max_steps} is not beyond the checkpoint's step {checkpoint.step}")
    if args.data != "shapes10" and not os.path.isdir(args.data):
        raise FileNotFoundError(f"--data {args.data!r} is neither 'shapes10' nor an existing directory")


class Run:
    """A run's objects and its position: ``step`` (optimizer steps taken), ``history`` (one row per
    evaluated epoch), ``best`` (the best test accuracy so far, None before the first evaluation),
    ``meter`` (the current epoch's training sums) and ``saved_step`` (the step of --out/last.npz);
    ``lock`` holds --out for the run (None for --eval-only, which writes nothing), ``description``
    the extras that make its checkpoints self-describing (models.describe), ``stop`` the signal
    handling while :func:`train` runs. ``world``: the process's place in a data-parallel run, whose
    ``network`` (the DistributedDataParallel wrapper of ``model``) the training step calls; ``step``,
    ``history`` and ``meter`` are then the whole job's (global batches), the same on every rank."""

    def __init__(self, args: argparse.Namespace, device: str, model: Any, optimizer: Any, scheduler: Any,
                 train_loader: data.DataLoader, test_loader: data.DataLoader, replace: list[str],
                 lock: OutLock | None = None, description: dict[str, Any] | None = None, *,
                 world: World | None = None, network: Any = None) -> None:
        self.args, self.device, self.model, self.optimizer, self.scheduler = args, device, model, optimizer, scheduler
        self.world, self.network = world or World({}), model if network is None else network
        self.train_loader, self.test_loader, self.replace = train_loader, test_loader, replace
        self.lock, self.description = lock, description or {}
        self.stop: StopRequest | None = None
        self.step, self.history, self.best, self.meter = 0, [], None, Meter()
        self.saved_step: int | None = None
        self.watch = LossWatch()
        self.captured: Any = None  # the CUDA-graph step (--cuda-graph), made on the second step
        self.eager_steps = 0  # train_step's eager steps before the capture
        device_type = device.split(":")[0]
        # --amp's region for the forward pass and the loss, made once (it re-enters); none without --amp, where
        # even a disabled region would import ml_dtypes for its default type (a second's start-up on a small machine)
        self.amp_region: Any = contextlib.nullcontext()
        if args.amp != "off":
            half = minidnn.bfloat16 if args.amp == "bf16" else minidnn.float16
            self.amp_region = minidnn.autocast(device_type, dtype=half)
        # float16's narrow range needs the loss scaled (bfloat16 has float32's exponent range and does not)
        self.scaler = minidnn.amp.GradScaler(device_type) if args.amp == "fp16" else None
        self.solved = False  # whether this process has run its first step (where wd plans are made)

    def eager_step(self, images: minidnn.Tensor, labels: minidnn.Tensor) -> tuple[minidnn.Tensor, minidnn.Tensor]:
        """Forward, loss, backward and the optimizer's update; returns (logits, loss). With --amp fp16 the
        loss is scaled and a step whose gradients overflowed is skipped (GradScaler)."""
        with self.amp_region:
            logits = self.network(laid_out(images, self.args.channels_last))
            loss = F.cross_entropy(logits, labels, label_smoothing=self.args.label_smoothing)
        self.optimizer.zero_grad()
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return logits, loss

    def train_step(self, images: minidnn.Tensor, labels: minidnn.Tensor) -> tuple[minidnn.Tensor, minidnn.Tensor]:
        """One training step: eager, or (the GPU's default, --cuda-graph) a replay of the step captured after
        the second (which ran eagerly inside the capture's warm-up). The first runs eagerly on its own: it makes
        the optimizer's state, so that the capture's warm-up, whose allocations lay out the graph's memory
        (graphs.capture's memory plan), is a step like every later one. Every step trains on its own batch."""
        if not self.args.cuda_graph:
            return self.eager_step(images, labels)
        if self.captured is None:
            if self.eager_steps == 0:
                self.eager_steps += 1
                return self.eager_step(images, labels)
            self.captured = self.capture(images, labels)
            return self.captured.warmup_outputs
        return self.captured(images, labels)

    def capture(self, images: minidnn.Tensor, labels: minidnn.Tensor) -> Any:
        """Capture the step (its warm-up is this step, run eagerly); say once what came of it: the graph and
        the memory its pool holds, or why it runs eagerly instead (graphs.capture's fallback)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            captured = graphs.capture(self.eager_step, (images, labels), warmup=1)
        if isinstance(captured, graphs.EagerStep):
            _warn(f"the training step runs eagerly: it cannot be captured as a CUDA graph ({captured.reason})")
        else:
            for warning in caught:
                _warn(str(warning.message))
            print(f"train.py: the training step runs as one CUDA graph (--no-cuda-graph runs it eagerly); its "
                  f"memory pool holds {captured.memory_bytes / 2**20:.0f} MiB")
        return captured

    def first_step(self, images: minidnn.Tensor, labels: minidnn.Tensor) -> tuple[minidnn.Tensor, minidnn.Tensor]:
        """The run's first step; with --microbatch wd it also solves the whole network's plan (μ-cuDNN's
        WD needs every convolution of the step before it can share one budget among them)."""
        if self.args.microbatch != "wd":
            return self.train_step(images, labels)
        outputs: list = []
        budget = planner.solve_step(lambda: outputs.extend(self.eager_step(images, labels)),
                                    conv_settings.workspace_limit())
        print(f"train.py: --microbatch wd: one plan for the network's convolutions within {budget / 2**20:.0f} MiB")
        return outputs[0], outputs[1]

    def resume(self, checkpoint: Checkpoint) -> None:
        """Restore the model, optimizer, scheduler, RNG and position from ``checkpoint``."""
        saved_steps = checkpoint.extra.get("steps_per_epoch", len(self.train_loader))
        if saved_steps != len(self.train_loader):
            raise ValueError(f"the training data gives {len(self.train_loader)} batches per epoch, the checkpoint's "
                             f"run had {saved_steps}: its position means nothing here (is --data another data set?)")
        saved_images = checkpoint.extra.get("train_images", len(self.train_loader.dataset))
        if saved_images != len(self.train_loader.dataset):
            _warn(f"the training set has {len(self.train_loader.dataset)} images, the checkpoint's run had "
                  f"{saved_images}: the run goes on from step {checkpoint.step} in the new set's shuffled order, "
                  f"so it is not bit for bit the run that never stopped")
        extra = checkpoint.extra
        try:  # checked before anything is loaded: a damaged run state must not leave a half-restored run
            history, best = extra["history"], extra["best"]
            meter = Meter.from_state(extra["meter"], reduced=self.world.launched)
            if not isinstance(history, list) or not all(isinstance(row, dict) and "epoch" in row for row in history):
                raise ValueError("its history is not a list of epoch rows")
            if best is not None and not isinstance(best, (int, float)):
                raise ValueError(f"its best accuracy is {best!r}")
            if self.scaler is not None and "grad_scaler" in extra:  # a run resumed under --amp fp16 keeps its scale
                self.scaler.load_state_dict(extra["grad_scaler"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{checkpoint.path!r} is damaged: its run state does not parse ({error})") from None
        minidnn.load_checkpoint(checkpoint, self.model, self.optimizer, self.scheduler)
        self.step, self.history, self.best, self.meter = checkpoint.step, history, best, meter
        if _same_file(checkpoint.path, os.path.join(self.args.out, "last.npz")):
            self.saved_step = checkpoint.step

    def non_finite(self, what: str) -> TrainingError:
        last = os.path.join(self.args.out, "last.npz")
        kept = f"{last} (step {self.saved_step}) is the last good checkpoint" if self.saved_step is not None else \
            "no checkpoint was saved"
        return TrainingError(f"{what}; stopped without saving, {kept}; try a lower --lr")

    def check_losses(self) -> None:
        """A ``TrainingError`` naming the step if a training loss since the last check is not finite."""
        bad = self.watch.first_non_finite()
        if bad is not None:
            raise self.non_finite(f"the training loss is {bad[1]} at step {bad[0]}")

    def check_finite(self) -> None:
        """:meth:`check_losses`, and a ``TrainingError`` if a parameter or buffer is not finite (a step
        with a finite loss can still overflow the weights): the check before anything is saved. The values are
        checked on the host: a copy a tensor is what saving them costs anyway, where a device reduction a tensor
        would wait for the GPU as often, and compile a CuPy kernel for each new size class on a first run."""
        self.check_losses()
        for name, value in self.model.state_dict().items():
            array = value.numpy()
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise self.non_finite(f"the model's {name} is not finite after step {self.step}")

    def save(self, name: str) -> None:
        """Write --out/``name`` (a resumable checkpoint), never with non-finite weights. Data-parallel, rank 0
        writes (every rank holds the same weights) and the position is the job's: the step in global
        batches, the meter's every-rank sums (all-reduced at the step it is called on), the world size."""
        self.check_finite()
        settings = {key: value for key, value in vars(self.args).items() if key != "given"}
        extra = {"model": self.args.model, **self.description, "history": self.history, "best": self.best,
                 "meter": self.meter.state(), "args": settings, "steps_per_epoch": len(self.train_loader),
                 "train_images": len(self.train_loader.dataset), "world_size": self.world.size}
        if self.scaler is not None:
            extra["grad_scaler"] = self.scaler.state_dict()
        path = os.path.join(self.args.out, name)
        if self.world.main:
            with writing(path):  # a full disk, a folder removed under the run: the old file is intact
                minidnn.save_checkpoint(path, self.model, self.optimizer, self.scheduler, self.step, extra=extra)
        if name == "last.npz":
            self.saved_step = self.step

    def synchronise(self, signum: int | None) -> int | None:
        """Where the ranks meet (every rank calls it after the same steps): the meter's sums are all-reduced
        and so is the stop request, so that every rank stops after the same step, with the signal any rank
        received (SIGTERM first). One process: ``signum`` as it is, the meter untouched."""
        if not self.world.launched:
            return signum
        received = self.meter.all_reduce(self.device, [float(signum == s) for s in StopRequest.SIGNALS])
        return next((int(s) for s, count in sorted(zip(StopRequest.SIGNALS, received), reverse=True) if count), None)

    def end_epoch(self, epoch: int) -> None:
        """Evaluate the epoch just trained, record it, save best.npz (if better) and last.npz, write
        metrics.jsonl. best.npz goes first: a kill between the two leaves last.npz before this epoch,
        so the epoch is trained, evaluated and (if better) saved as best again on resume."""
        self.check_finite()
        if self.world.launched:  # every rank evaluates with rank 0's batch statistics, those it saves
            broadcast_coalesced(self.network.process_group, list(self.model.buffers()))
        train_loss, train_accuracy = self.meter.read()
        started = time.perf_counter()
        with self.amp_region:
            test_loss, test_accuracy = evaluate(self.model, self.test_loader, self.device, self.stop, self.world,
                                                self.args.channels_last)
        if not math.isfinite(test_loss):
            raise self.non_finite(f"the test loss is {test_loss} after epoch {epoch + 1}")
        self.history.append({
            "epoch": epoch + 1, "step": self.step, "train_loss": train_loss, "train_accuracy": train_accuracy,
            "test_loss": test_loss, "test_accuracy": test_accuracy, "lr": self.scheduler.get_last_lr()[0],
            "seconds": round(self.meter.seconds + time.perf_counter() - started, 2),
            "images_per_second": round(self.meter.count / max(self.meter.seconds, 1e-9), 1)})
        self.meter = Meter()
        print(f"epoch {epoch + 1}: train loss {train_loss:.4f} acc {100 * train_accuracy:.2f}% | "
              f"test loss {test_loss:.4f} acc {100 * test_accuracy:.2f}%")
        if self.best is None or test_accuracy > self.best:
            self.best = test_accuracy
            self.save("best.npz")
        self.save("last.npz")
        if self.world.main:
            write_metrics(self.args.out, self.history)

    def save_and_report_stop(self, signum: int | None) -> dict[str, Any]:
        """Save last.npz where the run stands and say how to continue (a signal's stop on stderr).
        Data-parallel, no rank goes on (and exits) before rank 0 has written it: the launcher stops the
        others as soon as one rank ends."""
        self.save("last.npz")
        if self.world.launched:
            dist.barrier()
        return self.report_stop(signum)

    def report_stop(self, signum: int | None) -> dict[str, Any]:
        """Say where the run stopped (last.npz is saved) and how to continue it."""
        if not self.world.main:
            return {"step": self.step, "stopped": True}
        path = os.path.join(self.args.out, "last.npz")
        how = f"stopped by {signal.Signals(signum).name}" if signum else f"stopped at --max-steps {self.args.max_steps}"
        print(f"train.py: {how} after step {self.step}; saved {path}; continue with: python train.py --resume {path}",
              file=sys.stderr if signum else sys.stdout)
        return {"step": self.step, "stopped": True}


def check_input_size(model: Any, args: argparse.Namespace, image_size: int) -> None:
    """A ``ValueError`` naming --model and --image-size unless a batch of one ``image_size`` image goes
    through ``model``: one forward on zeros in eval mode under no_grad, which changes no weight, batch
    statistic or random state. Without it, a model that shrinks the image to nothing (alexnet below
    63 pixels) or expects a fixed size (alexnet_caffe's fc6) fails inside the first step."""
    model.eval()
    try:
        with minidnn.no_grad():
            model(minidnn.zeros(1, 3, image_size, image_size))
    except Exception as error:  # noqa: BLE001 - whatever a layer raises, the run cannot start
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"--model {args.model} does not take --image-size {image_size} (it is designed for "
                         f"{models.input_size(args.model)}): {reason}") from None
    finally:
        model.train()


def init_from(model: Any, args: argparse.Namespace, weights: dict[str, Any]) -> None:
    """Load ``weights`` (from --init-from) into the new run's ``model``. The classifier (the model's
    ``ModelSpec.classifier``) keeps its fresh initialisation where its shape differs, which is the
    case when the data have another number of classes; every other tensor must fit, or it is a
    ``ValueError`` naming the file and the mismatches. Says once what was loaded."""
    own = model.state_dict()
    head = models.spec(args.model).classifier
    weight, bias = f"{head}.weight", f"{head}.bias"
    fresh = []
    if weight in own and weight in weights:  # a head of k classes over the same features: (k, features), (k,)
        saved = tuple(np.shape(weights[weight]))
        same_features = len(saved) == 2 and saved[1:] == own[weight].shape[1:]
        bias_fits = bias not in own or (bias in weights and tuple(np.shape(weights[bias])) == saved[:1])
        if saved != own[weight].shape and same_features and bias_fits:
            fresh = [weight] + ([bias] if bias in own else [])
    try:
        model.load_state_dict({**weights, **{key: own[key] for key in fresh}})
    except (ValueError, TypeError) as error:
        raise ValueError(f"cannot start from {args.init_from!r}: {error}") from None
    if fresh:
        print(f"train.py: --init-from {args.init_from}: loaded its weights except the classifier, re-initialised "
              f"({', '.join(fresh)}: {np.shape(weights[weight])[0]} classes there, {own[weight].shape[0]} here)")
    else:
        print(f"train.py: --init-from {args.init_from}: starting from its weights (epoch 0, a new optimizer and "
              f"schedule)")


def _one_line(error: BaseException) -> str:
    """An error's message on one line (a state dict's load lists its problems on lines of their own,
    after a line ending in a colon)."""
    text = ""
    for line in (line.strip() for line in str(error).splitlines()):
        if line:
            text += (" " if text.endswith(":") else "; " if text else "") + line
    return text


def _class_names(args: argparse.Namespace, train_set: Any, num_classes: int) -> tuple[str, ...]:
    names = tuple(getattr(train_set, "classes", ()) or (data.SHAPES_CLASSES if args.data == "shapes10" else ()))
    return names if len(names) == num_classes else tuple(str(index) for index in range(num_classes))


def prepare(args: argparse.Namespace, world: World | None = None) -> Run:
    """Everything a run needs, checked before the first step; a setting that makes no sense (or a
    checkpoint that does not fit it) is a ``SystemExit`` with a one-line message.

    Data-parallel (``world.launched``): joins the process group (NCCL for --device cuda, else the tcp
    backend), puts the model on GPU LOCAL_RANK, wraps it in DistributedDataParallel (SyncBatchNorm with
    --sync-batchnorm) and shards the data (:func:`build_loader`); only rank 0 takes --out's lock."""
    world = world or World({})
    lock = None
    try:
        checkpoint = weights = None
        if args.resume:
            checkpoint = minidnn.read_checkpoint(args.resume)
            resume_settings(args, checkpoint, world.size)
        if args.init_from:
            weights, described = load_weights(args.init_from)
            name = described.get("model", {}).get("name") if isinstance(described.get("model"), dict) else None
            if "model" not in args.given and name in models.MODELS and name != args.model:
                print(f"train.py: --init-from {args.init_from}: --model {name}, the checkpoint's")
                args.model = name
        if args.out is None:  # a resumed run goes on in its own folder
            args.out = (os.path.dirname(args.resume) or ".") if args.resume else os.path.join("runs", args.model)
        check_settings(args, checkpoint)
        device = world.device(args)
        if device.startswith("cuda") and not minidnn.cuda.is_available():
            raise RuntimeError("--device cuda: CUDA is not available on this machine (a GPU and a CUDA build of "
                               "CuPy are needed: pip install -e '.[cuda13]')")
        if world.launched:
            dist.init_process_group("nccl" if device.startswith("cuda") else "tcp")
        replace = []
        if not args.eval_only and world.main:  # before the data: loading it can take long
            lock, replace = check_out(args)
        minidnn.cuda.set_allow_tf32(args.tf32)
        minidnn.use_deterministic_algorithms(args.deterministic)
        if args.cuda_graph and not device.startswith("cuda"):
            raise ValueError("--cuda-graph needs --device cuda")
        if args.cuda_graph is None:  # the captured step is the GPU's default: the fastest path there is
            args.cuda_graph = device.startswith("cuda")
        image_size = args.image_size or models.input_size(args.model)
        with warnings.catch_warnings(record=True) as caught:  # as one-line messages, not file:line reports
            warnings.simplefilter("always")
            train_set, test_set, num_classes = build_datasets(args, image_size)
        for warning in caught:
            _warn(str(warning.message))
        for split, dataset in (("training", train_set), ("test", test_set)):
            if getattr(dataset, "skipped", None):
                _warn(f"--skip-corrupt: skipped {len(dataset.skipped)} unreadable image(s) of the {split} split")
        minidnn.manual_seed(args.seed)
        model = models.create(args.model, num_classes=num_classes)
        check_input_size(model, args, image_size)  # on the CPU, before any convolution setting applies
        if weights is not None:
            init_from(model, args, weights)
        model = model.to(device)
        if args.channels_last:  # before DDP's buckets, which are laid out from the parameters
            model = model.to(memory_format=minidnn.channels_last)
        network = model
        if world.launched:
            if args.sync_batchnorm:
                model = dist.convert_sync_batchnorm(model)
            network = dist.DistributedDataParallel(model)
        if args.workspace_limit is not None:
            conv_settings.set_workspace_limit(args.workspace_limit)
        conv_settings.set_microbatch(args.microbatch, args.batch_policy)
        try:
            description = models.describe(args.model, {"num_classes": num_classes},
                                          _class_names(args, train_set, num_classes),
                                          sample_pipeline(test_set), image_size, rgb_steps=(_GrayToRGB,))
        except ValueError as error:
            _warn(f"the checkpoints will not describe the model's input ({error}): models.load_pretrained and "
                  f"examples/predict.py cannot use them")
            description = {}
        train_loader = build_loader(args, train_set, device, train=True, world=world)
        if len(train_loader) == 0:
            each = f" x {world.size} processes" if world.size > 1 else ""
            raise ValueError(f"--batch-size {args.batch_size}{each} is larger than the training set "
                             f"({len(train_set)} images)")
        test_loader = build_loader(args, test_set, device, train=False, world=world)
        optimizer, scheduler = build_optimizer(args, model, len(train_loader))
        run = Run(args, device, model, optimizer, scheduler, train_loader, test_loader, replace, lock, description,
                  world=world, network=network)
        if checkpoint is not None:
            run.resume(checkpoint)
        return run
    except BaseException as error:
        if lock is not None:
            lock.release()
        if isinstance(error, (ValueError, OSError, RuntimeError)):
            raise SystemExit(f"train.py: error: {_one_line(error)}") from None
        raise


def train(args: argparse.Namespace, run: Run, own_process: bool = False) -> dict[str, Any]:
    """The training loop from ``run``'s position to the end (or a stop); see docs/training.md.
    ``own_process``: train.py runs as its own program, whose exit after a signal is bounded in time
    (:func:`exit_within`); called from Python (tests), a stop is only a ``SystemExit``."""
    for path in run.replace:  # --overwrite: the other run's files go only now that this one can start
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise TrainingError(f"--overwrite: cannot remove {path} ({error.strerror or error})") from None
    if run.replace:
        print(f"train.py: --overwrite: removed {', '.join(os.path.basename(p) for p in run.replace)}")
    if run.history and run.world.main:  # repairs metrics.jsonl after a kill between last.npz and it
        write_metrics(args.out, run.history)
    steps_per_epoch = len(run.train_loader)
    total = args.epochs * steps_per_epoch
    launched = run.world.launched
    stop = run.stop = StopRequest(run.save_and_report_stop, own_process, deferred=launched, quiet=not run.world.main)
    try:
        # An epoch is recorded when it is evaluated, so the first unrecorded one is where to go on.
        # A run stopped on an epoch's last step resumes with that epoch fully trained (first ==
        # steps_per_epoch): it is evaluated and recorded, once, before the next one starts.
        for epoch in range(len(run.history), args.epochs):
            first = run.step - epoch * steps_per_epoch
            if first < steps_per_epoch:
                run.train_loader.set_epoch(epoch)
                if run.train_loader.sampler is not None:  # data-parallel: PyTorch's loop tells the sampler too
                    run.train_loader.sampler.set_epoch(epoch)
                bar = tqdm(stop.batches(run.train_loader.iterate(first)), total=steps_per_epoch, initial=first,
                           unit="step", desc=f"epoch {epoch + 1}/{args.epochs}", dynamic_ncols=True, leave=True,
                           disable=not run.world.main)
                tick = time.perf_counter()
                for images, labels in bar:
                    images, labels = images.to(run.device), labels.to(run.device)
                    logits, loss = (run.train_step if run.solved else run.first_step)(images, labels)
                    run.solved = True
                    run.scheduler.step()
                    run.step += 1
                    reused = run.captured is not None  # a replay writes its outputs into the same arrays
                    run.meter.add(logits, labels, run.watch.add(run.step, loss, copy=reused), copy=reused)
                    now = time.perf_counter()
                    run.meter.seconds, tick = run.meter.seconds + now - tick, now
                    at_max_steps = args.max_steps is not None and args.max_steps <= run.step < total
                    signum = None if launched else stop.signum  # data-parallel: only where the ranks agree
                    if run.step % args.log_every == 0 or run.step % steps_per_epoch == 0 or at_max_steps:
                        run.check_losses()
                        signum = run.synchronise(stop.signum)
                        train_loss, train_accuracy = run.meter.read()
                        # The reads waited for the GPU: the time now counts every step so far as done, so
                        # img/s is the whole loop's (data, steps, waits), not the rate of queuing steps.
                        now = time.perf_counter()
                        run.meter.seconds, tick = run.meter.seconds + now - tick, now
                        bar.set_postfix(loss=f"{train_loss:.3f}", acc=f"{100 * train_accuracy:.1f}%",
                                        lr=f"{run.scheduler.get_last_lr()[0]:.3g}",
                                        img_s=f"{run.meter.count / max(run.meter.seconds, 1e-9):.0f}")
                    if signum:
                        bar.close()
                        stop.signum = signum  # the rank that received no signal stops with the others
                        stop.stop()
                    if at_max_steps:
                        bar.close()
                        return run.save_and_report_stop(None)
                bar.close()
            run.end_epoch(epoch)
            signum = run.synchronise(stop.signum)  # rank 0's saves are done when the ranks meet here
            if signum and epoch + 1 < args.epochs:  # came during the last evaluation batch or the saves
                run.report_stop(signum)  # last.npz is done
                stop.exit(128 + signum)
    except UnreadableImageError as error:
        last = os.path.join(args.out, "last.npz")
        if launched:  # the other ranks are past the last point where the ranks agreed: nothing new to save
            raise TrainingError(f"{error}; the job stops, {last} (step {run.saved_step}) is the last checkpoint: "
                                f"remove or replace the file and continue with --resume {last}, or with --resume "
                                f"{last} --skip-corrupt") from None
        run.save("last.npz")  # the steps before the bad batch are kept
        raise TrainingError(f"{error}; saved {last} at step {run.step}: remove or replace the file and continue "
                            f"with --resume {last}, or continue with --resume {last} --skip-corrupt") from None
    finally:
        stop.restore()
    best = "none" if run.best is None else f"{100 * run.best:.2f}%"
    print(f"best test accuracy {best}; metrics, curves and checkpoints in {args.out}")
    return {"step": run.step, "best_test_accuracy": run.best, "history": run.history}


def main(argv: Sequence[str] | None = None, own_process: bool = False) -> dict[str, Any]:
    """Run train.py with ``argv``; errors are ``SystemExit`` (a message, or 128 + a signal's number).
    ``own_process``: see :func:`train`. With --gpus N > 1 outside a launcher, the run is N processes
    started through the launcher (:func:`launch`); under one, this process is one rank."""
    args = parse_args(argv)
    world = World()
    if not world.launched and args.gpus > 1:
        return launch(args, argv)
    if world.launched and "gpus" in args.given and args.gpus != world.local_size:
        raise SystemExit(f"train.py: error: --gpus {args.gpus}, but the launcher started {world.local_size} "
                         f"process(es) on this machine; leave --gpus out under the launcher")
    global _quiet
    quiet, _quiet = _quiet, not world.main
    try:
        with contextlib.ExitStack() as quieted:
            if _quiet:
                quieted.enter_context(contextlib.redirect_stdout(quieted.enter_context(open(os.devnull, "w"))))
            return _main(args, world, own_process)
    except SystemExit as error:
        if not world.main and isinstance(error.code, str):  # say which rank: every rank may report its own
            raise SystemExit(error.code.replace("train.py:", f"train.py (rank {world.rank}):", 1)) from None
        raise
    finally:
        _quiet = quiet
        if dist.is_initialized():
            dist.destroy_process_group()


def _main(args: argparse.Namespace, world: World, own_process: bool) -> dict[str, Any]:
    run = prepare(args, world)
    try:
        if args.eval_only:
            loss, accuracy = evaluate(run.model, run.test_loader, run.device, world=world,
                                      channels_last=args.channels_last)
            print(f"test loss {loss:.4f}, test accuracy {100 * accuracy:.2f}% ({len(run.test_loader.dataset)} images)")
            return {"test_loss": loss, "test_accuracy": accuracy}
        return train(args, run, own_process)
    except TrainingError as error:
        raise SystemExit(f"train.py: error: {error}") from None
    finally:
        if run.lock is not None:
            run.lock.release()


if __name__ == "__main__":
    try:
        main(own_process=True)
    except KeyboardInterrupt:  # Ctrl-C while setting up, before there is anything to save
        print("\ntrain.py: interrupted", file=sys.stderr)
        exit_within(EXIT_GRACE_SECONDS, 130)
        sys.exit(130)
    except SystemExit as stop:  # a stuck data thread must not hold the exit (see exit_within)
        exit_within(EXIT_GRACE_SECONDS, stop.code)
        raise
