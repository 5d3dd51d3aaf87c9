"""Data: datasets (built-in shapes10, CIFAR, MNIST, image folders), transforms, and a prefetching DataLoader."""
from . import transforms
from .cifar import CIFAR10, CIFAR100
from .dataset import ArrayDataset, Dataset, Subset, TensorDataset, TransformedDataset
from .folder import ImageFolder
from .loader import DataLoader, default_collate
from .mnist import MNIST, FashionMNIST, read_idx
from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import load_shapes, render_shapes

__all__ = ["transforms", "Dataset", "TransformedDataset", "ArrayDataset", "Subset", "TensorDataset", "DataLoader", "default_collate",
           "SHAPES_CLASSES", "load_shapes", "render_shapes", "ImageFolder", "CIFAR10", "CIFAR100", "MNIST",
           "FashionMNIST", "read_idx"]
