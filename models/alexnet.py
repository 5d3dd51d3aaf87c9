"""AlexNet in two layouts: torchvision's and Caffe's (CaffeNet, the BVLC reference model).

``alexnet`` (224x224 input) is torchvision's "one weird trick" variant (Krizhevsky 2014): a
single tower with 64, 192, 384, 256 and 256 filters, no LRN, an adaptive average pool to 6x6 (so
smaller inputs, from 63x63 up, also work) and its module names, so a torchvision state dict loads
with ``strict=True``::

    features.0  Conv2d(3, 64, 11, stride 4, padding 2)     features.1  ReLU   features.2  MaxPool2d(3, 2)
    features.3  Conv2d(64, 192, 5, padding 2)              features.4  ReLU   features.5  MaxPool2d(3, 2)
    features.6  Conv2d(192, 384, 3, padding 1)             features.7  ReLU
    features.8  Conv2d(384, 256, 3, padding 1)             features.9  ReLU
    features.10 Conv2d(256, 256, 3, padding 1)             features.11 ReLU   features.12 MaxPool2d(3, 2)
    avgpool     AdaptiveAvgPool2d((6, 6))
    classifier  .0 Dropout, .1 Linear(9216, 4096), .2 ReLU, .3 Dropout, .4 Linear(4096, 4096), .5 ReLU,
                .6 Linear(4096, num_classes)

61,100,840 parameters with 1000 classes.

``alexnet_caffe`` (227x227 input) is CaffeNet, ``models/bvlc_reference_caffenet`` of BVLC Caffe,
the network the cuDNN paper (Chetlur et al. 2014) benchmarked: the two-tower original of
Krizhevsky et al. (2012) folded into one tower with grouped convolutions (conv2, conv4 and conv5
have groups=2), LRN after the first two stages and no adaptive pooling: fc6 needs a 6x6 pool5,
which inputs of 199x199 to 230x230 give (227 is Caffe's crop; 224 works too). 60,965,224
parameters with 1000 classes.

Layer order. CaffeNet pools *before* it normalises (conv-relu-pool-LRN); Caffe's
``bvlc_alexnet`` and the paper normalise first (conv-relu-LRN-pool). BVLC's CaffeNet readme: "the
order of pooling and normalization layers is switched (in CaffeNet, pooling is done before
normalization)"; its train_val.prototxt has pool1 -> norm1 and pool2 -> norm2. Neither LRN nor
pooling has parameters, so both orders have the same 60,965,224 parameters and the count cannot
tell them apart; we follow CaffeNet (LRN on the pooled 27x27 and 13x13 maps, about 4x cheaper)
and offer the other order with ``lrn_before_pool=True``.

Module names are Caffe's layer names, so a converted ``.caffemodel`` (blobs[0] -> ``weight``,
blobs[1] -> ``bias``; Caffe's grouped weight (K, C/groups, R, S) and fc weight (out, in) already
have PyTorch's layout) loads key for key: the model is a Sequential of ``conv1, relu1, pool1,
norm1, conv2, relu2, pool2, norm2, conv3, relu3, conv4, relu4, conv5, relu5, pool5, flatten, fc6,
relu6, drop6, fc7, relu7, drop7, fc8`` (``flatten`` is implicit in Caffe's InnerProduct), and its
state dict has ``conv1.weight``, ``conv1.bias``, ... ``fc8.bias``. (Caffe's weights expect its
input convention: BGR, 0-255, mean-subtracted.) ``caffenet_features`` builds the convolutional part
(conv1 ... pool5) alone.

Caffe's pooling rounds the output size up; ``ceil_mode=True`` reproduces it (for 227x227 the
maps are 55 -> 27 -> 13 -> 6 either way, but other sizes differ). Caffe's LRN with local_size 5,
alpha 1e-4, beta 0.75 and k = 1 divides alpha by the window size exactly as PyTorch's
``LocalResponseNorm(5, 1e-4, 0.75, 1.0)``. The weights start with PyTorch's default
initialisation (as torchvision's AlexNet), not Caffe's Gaussian fillers.
"""
from __future__ import annotations

from collections import OrderedDict

import minidnn.nn as nn
from minidnn.tensor import Tensor


class AlexNet(nn.Module):
    """torchvision's AlexNet: ``features``, ``avgpool``, ``classifier`` (see the module docstring)."""

    input_size = 224

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def caffenet_features(lrn_before_pool: bool = False) -> nn.Sequential:
    """CaffeNet's convolutional part, ``conv1`` ... ``pool5``: (N, 3, 227, 227) -> (N, 256, 6, 6).

    The first 15 children of :class:`AlexNetCaffe`, with the same names and layers; on its own it
    serves feature extraction and benchmarking the convolutions (the layers the cuDNN paper timed)
    without building the 58.6 M parameters of fc6 ... fc8.
    """
    def stage(index: int, conv: nn.Conv2d) -> list[tuple[str, nn.Module]]:
        """conv-relu, then pool and LRN in the chosen order."""
        pool = (f"pool{index}", nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True))
        norm = (f"norm{index}", nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0))
        return [(f"conv{index}", conv), (f"relu{index}", nn.ReLU(inplace=True))] + \
               ([norm, pool] if lrn_before_pool else [pool, norm])

    layers = stage(1, nn.Conv2d(3, 96, kernel_size=11, stride=4))                     # 227 -> 55 -> 27
    layers += stage(2, nn.Conv2d(96, 256, kernel_size=5, padding=2, groups=2))         # 27 -> 13
    layers += [
        ("conv3", nn.Conv2d(256, 384, kernel_size=3, padding=1)),
        ("relu3", nn.ReLU(inplace=True)),
        ("conv4", nn.Conv2d(384, 384, kernel_size=3, padding=1, groups=2)),
        ("relu4", nn.ReLU(inplace=True)),
        ("conv5", nn.Conv2d(384, 256, kernel_size=3, padding=1, groups=2)),
        ("relu5", nn.ReLU(inplace=True)),
        ("pool5", nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True)),              # 13 -> 6
    ]
    return nn.Sequential(OrderedDict(layers))


class AlexNetCaffe(nn.Sequential):
    """CaffeNet as one flat Sequential named by Caffe's layers (see the module docstring).

    ``lrn_before_pool=False`` is CaffeNet's order (pool, then LRN); ``True`` is bvlc_alexnet's and
    the paper's (LRN, then pool). The module names are the same either way; only the order of the
    children differs. Flat rather than torchvision's ``features``/``classifier`` split so that the
    state-dict keys are Caffe's blob names (``conv1.weight``, not ``features.0.weight``).
    """

    input_size = 227

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5, lrn_before_pool: bool = False) -> None:
        layers = list(caffenet_features(lrn_before_pool).named_children())
        layers += [
            ("flatten", nn.Flatten(1)),
            ("fc6", nn.Linear(256 * 6 * 6, 4096)),
            ("relu6", nn.ReLU(inplace=True)),
            ("drop6", nn.Dropout(p=dropout)),
            ("fc7", nn.Linear(4096, 4096)),
            ("relu7", nn.ReLU(inplace=True)),
            ("drop7", nn.Dropout(p=dropout)),
            ("fc8", nn.Linear(4096, num_classes)),
        ]
        super().__init__(OrderedDict(layers))
        self.lrn_before_pool = lrn_before_pool

    def extra_repr(self) -> str:
        return f"lrn_before_pool={self.lrn_before_pool}"


def alexnet(num_classes: int = 1000, dropout: float = 0.5) -> AlexNet:
    """torchvision's AlexNet: 61,100,840 parameters with 1000 classes; 224x224 input."""
    return AlexNet(num_classes, dropout)


def alexnet_caffe(num_classes: int = 1000, dropout: float = 0.5, lrn_before_pool: bool = False) -> AlexNetCaffe:
    """CaffeNet (BVLC reference, pool before LRN): 60,965,224 parameters with 1000 classes; 227x227 input."""
    return AlexNetCaffe(num_classes, dropout, lrn_before_pool)


__all__ = ["AlexNet", "AlexNetCaffe", "alexnet", "alexnet_caffe", "caffenet_features"]
