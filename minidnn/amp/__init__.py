"""``minidnn.amp``: mixed-precision training helpers, with PyTorch's names (``torch.amp``). So far the
dynamic loss scaler, :class:`GradScaler`; the half-precision storage it serves is in
:mod:`minidnn.primitives.convert`."""
from .grad_scaler import GradScaler

__all__ = ["GradScaler"]
