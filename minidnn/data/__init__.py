"""Data: datasets (built-in shapes10, CIFAR, MNIST, image folders), transforms, and a DataLoader that
reshuffles every epoch, fetches in the background (worker processes for files) and can feed a GPU."""
from . import transforms
from .batch import default_collate
from .cifar import CIFAR10, CIFAR100
from .dataset import ArrayDataset, Dataset, Subset, TensorDataset, TransformedDataset
from .folder import ImageFolder
from .loader import DataLoader
from .mnist import MNIST, FashionMNIST, read_idx
from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import load_shapes, render_shapes
from .workers import WorkerError

__all__ = ["transforms", "Dataset", "TransformedDataset", "ArrayDataset", "Subset", "TensorDataset", "DataLoader",
           "default_collate", "WorkerError", "SHAPES_CLASSES", "load_shapes", "render_shapes", "ImageFolder", "CIFAR10",
           "CIFAR100", "MNIST", "FashionMNIST", "read_idx"]
