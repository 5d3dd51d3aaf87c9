"""A first read: train a small CNN on the built-in shapes10 data, in the shape of PyTorch's examples.

Data, model, training loop, evaluation: nothing else. train.py is the full application (checkpoints,
resume, metrics, every model and data format); this file is what it does at heart.

    python examples/train_minimal.py                  # a minute or two on two CPU cores
    python examples/train_minimal.py --device cuda    # on a GPU, with CuPy installed
"""
import argparse

import numpy as np

import minidnn
import minidnn.functional as F
import minidnn.nn as nn
from minidnn import data
from minidnn.data import transforms as T


class Net(nn.Module):
    """Two conv-batchnorm-ReLU-pool blocks, then a linear classifier: (N, 3, 32, 32) -> (N, 10)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x: minidnn.Tensor) -> minidnn.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # (N, 16, 16, 16)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # (N, 32, 8, 8)
        return self.fc(x.flatten(1))


def train(model: nn.Module, loader: data.DataLoader, optimizer: minidnn.optim.Optimizer, device: str) -> float:
    """One epoch; returns the mean training loss."""
    model.train()
    total, batches = 0.0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total, batches = total + loss.item(), batches + 1
    return total / batches


def test(model: nn.Module, loader: data.DataLoader, device: str) -> float:
    """Accuracy on the test set."""
    model.eval()
    correct = 0
    with minidnn.no_grad():
        for images, labels in loader:
            predicted = model(images.to(device)).argmax(dim=1)
            correct += int((predicted.numpy() == labels.numpy()).sum())
    return correct / len(loader.dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training set (default: 3)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per step (default: 64)")
    parser.add_argument("--lr", type=float, default=0.02, help="SGD learning rate (default: 0.02)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    args = parser.parse_args()
    minidnn.manual_seed(0)

    # Data: shapes10 is rendered from a seed on first use and cached; images are uint8 (N, 32, 32, 3).
    train_images, train_labels = data.load_shapes("train", train_size=20000, test_size=4000)
    test_images, test_labels = data.load_shapes("test", train_size=20000, test_size=4000)
    mean = train_images.reshape(-1, 3).mean(axis=0) / 255
    std = train_images.reshape(-1, 3).std(axis=0) / 255
    pipeline = T.Compose([T.ToTensor(), T.Normalize(mean, std)])  # (3, 32, 32) float32, normalised
    train_loader = data.DataLoader(data.ArrayDataset(train_images, train_labels, pipeline),
                                   batch_size=args.batch_size, shuffle=True)
    test_loader = data.DataLoader(data.ArrayDataset(test_images, test_labels, pipeline), batch_size=256)

    # Model and optimiser.
    model = Net().to(args.device)
    optimizer = minidnn.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    # The loop. Each pass over train_loader is a new epoch, in a new shuffled order drawn from the seed.
    for epoch in range(1, args.epochs + 1):
        loss = train(model, train_loader, optimizer, args.device)
        accuracy = test(model, test_loader, args.device)
        print(f"epoch {epoch}: train loss {loss:.3f}, test accuracy {accuracy:.1%}")
    print(f"chance is {1 / len(np.unique(test_labels)):.0%}")


if __name__ == "__main__":
    main()
