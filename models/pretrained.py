"""Self-describing checkpoints: a trained model used again in one call.

A checkpoint's extras can carry what using the model needs besides its weights: the architecture and
its constructor arguments, the evaluation preprocessing (input size, the resize and crop, the
normalisation's mean and std) and the class names. :func:`describe` makes those extras (train.py
stores them in every checkpoint); :func:`load_pretrained` rebuilds the model from them, in eval mode
with the weights loaded, together with the preprocessing as a callable.

The name is torchvision's and timm's word for a model whose trained weights come with it
(``pretrained=True``), here from a checkpoint file rather than a download.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

import minidnn
from minidnn.checkpoint import load_checkpoint, read_checkpoint
from minidnn.data import transforms as T
from minidnn.data.folder import to_rgb

from . import spec

# The deterministic transforms an evaluation pipeline may hold, by the name the description uses.
_SPATIAL = ("Resize", "CenterCrop")


def describe(name: str, arguments: dict[str, Any], classes: Sequence[str], transform: Any, input_size: int,
             rgb_steps: tuple[type, ...] = ()) -> dict[str, Any]:
    """The extras that make a checkpoint of the model ``name`` self-describing (JSON-able):
    ``{"model": {"name", "arguments"}, "input": {"size", "mean", "std", "transform"}, "classes"}``.

    ``arguments`` are the constructor's (``{"num_classes": 10}``); ``transform`` is the evaluation
    pipeline the test split went through (a :class:`~minidnn.data.transforms.Compose`, nested or
    not, of ``Resize``, ``CenterCrop``, ``ToTensor`` and ``Normalize``); steps of a type in
    ``rgb_steps`` turn the dataset's own images into RGB and are left out, since the prediction's
    :func:`~minidnn.data.folder.to_rgb` does that for any image. A pipeline without a resize or crop
    worked on images of the model's ``input_size`` as stored: the description then starts with
    ``Resize((input_size, input_size))``, a no-op on such images that brings an image of another
    size to that side, as train.py does for data of another side. A random or unknown step is a
    ``ValueError``: prediction must be deterministic.
    """
    spec(name)  # an unknown name: spec's ValueError
    steps: list[list[Any]] = []
    mean = std = None
    for step in _flatten(transform):
        if isinstance(step, rgb_steps):
            continue
        if isinstance(step, T.Resize):
            steps.append(["Resize", step.size if isinstance(step.size, int) else list(step.size)])
        elif isinstance(step, T.CenterCrop):
            steps.append(["CenterCrop", list(step.size)])
        elif isinstance(step, T.ToTensor):
            steps.append(["ToTensor"])
        elif isinstance(step, T.Normalize):
            mean, std = step.mean.ravel().tolist(), step.std.ravel().tolist()
            steps.append(["Normalize"])
        else:
            raise ValueError(f"the evaluation transform holds {step!r}, which a description cannot hold (it takes "
                             f"Resize, CenterCrop, ToTensor and Normalize)")
    if ["ToTensor"] not in steps:
        raise ValueError(f"the evaluation transform {transform!r} holds no ToTensor: the model takes CHW floats")
    if not any(kind in _SPATIAL for kind, *_ in steps):
        steps.insert(0, ["Resize", [input_size, input_size]])
    return {"model": {"name": name, "arguments": dict(arguments)},
            "input": {"size": int(input_size), "mean": mean, "std": std, "transform": steps},
            "classes": [str(c) for c in classes]}


def _flatten(transform: Any) -> list[Any]:
    if transform is None:
        return []
    if isinstance(transform, T.Compose):
        return [step for inner in transform.transforms for step in _flatten(inner)]
    return [transform]


class Preprocess:
    """The evaluation preprocessing of a self-describing checkpoint, as one callable:
    ``preprocess(image)`` takes a Pillow image (any mode, see :func:`~minidnn.data.folder.to_rgb`)
    or an HWC (or HW grey) uint8 array and returns the model's input for it, CHW float32."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps

    def __call__(self, image: Any) -> np.ndarray:
        if isinstance(image, Image.Image):
            array = to_rgb(image)
        else:
            array = np.asarray(image)
            if array.dtype != np.uint8 or array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (1, 3)):
                raise ValueError(f"image must be a Pillow image or an HWC uint8 array with 1 or 3 channels (or HW "
                                 f"grey), got {array.dtype} of shape {array.shape}")
            if array.ndim == 2 or array.shape[2] == 1:
                array = np.repeat(array.reshape(array.shape[0], array.shape[1], 1), 3, axis=2)
        for step in self.steps:
            array = step(array, None)
        return array

    def __repr__(self) -> str:
        return "Preprocess(" + ", ".join(repr(step) for step in self.steps) + ")"


@dataclass
class Pretrained:
    """What :func:`load_pretrained` returns: ``model`` (eval mode, weights loaded), ``transform`` (a
    :class:`Preprocess`: image -> CHW float32 input), ``classes`` (names, by output index),
    ``input_size`` (pixels), ``mean`` and ``std`` (the normalisation, per channel, or None), ``name``
    (the architecture in ``models.MODELS``)."""

    model: Any
    transform: Preprocess
    classes: tuple[str, ...]
    input_size: int
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    name: str


def load_pretrained(path: str | os.PathLike, device: Any = "cpu") -> Pretrained:
    """Rebuild the model a self-describing checkpoint (one of train.py's) holds, in one call::

        pretrained = models.load_pretrained("runs/shapes_cnn/best.npz")
        batch = minidnn.tensor(np.stack([pretrained.transform(Image.open(f)) for f in files]))
        with minidnn.no_grad():
            probabilities = F.softmax(pretrained.model(batch), dim=1)

    The model is on ``device``, in eval mode; the global random state is left as it was (building
    the model draws its initial weights from it). A missing file is a ``FileNotFoundError``; a
    damaged one, or one without a description (another program's, or an older train.py's), a
    ``ValueError`` naming it.
    """
    checkpoint = read_checkpoint(path)
    label = repr(checkpoint.path)
    try:
        name, arguments, steps, input_size, mean, std, classes = _parse(checkpoint.extra)
        model_spec = spec(name)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{label} does not describe its model and input (not a checkpoint of this train.py, or "
                         f"damaged): {error}") from None
    state = minidnn.get_rng_state()
    try:
        model = model_spec.constructor(**arguments)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{label} describes a {name} that cannot be built with {arguments}: {error}") from None
    finally:
        minidnn.set_rng_state(state)
    load_checkpoint(checkpoint, model, restore_rng=False)
    model.eval()
    return Pretrained(model.to(device), Preprocess(steps), classes, input_size, mean, std, name)


def _parse(extra: dict[str, Any]) -> tuple[str, dict[str, Any], list[Any], int, Any, Any, tuple[str, ...]]:
    """The parts of a description, checked (a ``KeyError``, ``TypeError`` or ``ValueError`` says what is wrong)."""
    model, given = extra["model"], extra["input"]
    if not isinstance(model, dict) or not isinstance(model.get("name"), str) or \
            not isinstance(model.get("arguments"), dict):
        raise ValueError(f"its model entry {str(model)[:60]!r} is not {{'name': ..., 'arguments': {{...}}}}")
    size = given["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"its input size {size!r} is not a positive int")
    mean, std = given["mean"], given["std"]
    normalise = None
    if mean is not None or std is not None:
        normalise = T.Normalize(mean, std)  # checks one std > 0 per mean
        mean, std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    steps: list[Callable] = []
    for step in given["transform"]:
        kind, *parameters = step
        if kind == "Resize" and len(parameters) == 1:
            size_of_step = parameters[0]
            steps.append(T.Resize(size_of_step if isinstance(size_of_step, int) else tuple(size_of_step)))
        elif kind == "CenterCrop" and len(parameters) == 1:
            steps.append(T.CenterCrop(tuple(parameters[0])))
        elif kind == "ToTensor" and not parameters:
            steps.append(T.ToTensor())
        elif kind == "Normalize" and not parameters and normalise is not None:
            steps.append(normalise)
        else:
            raise ValueError(f"its transform step {step!r} is none of Resize, CenterCrop, ToTensor, Normalize")
    classes = extra["classes"]
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise ValueError("its classes are not a list of names")
    outputs = model["arguments"].get("num_classes", len(classes))
    if len(classes) != outputs:
        raise ValueError(f"it names {len(classes)} classes for a model with {outputs} outputs")
    return model["name"], model["arguments"], steps, size, mean, std, tuple(classes)
