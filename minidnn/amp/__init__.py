"""``minidnn.amp``: mixed-precision training helpers, with PyTorch's names (``torch.amp``). The autocast
region (:mod:`minidnn.autocast_mode`, whose class is also ``minidnn.autocast``) and the dynamic loss scaler, :class:`GradScaler`;
the half-precision storage they serve is in :mod:`minidnn.primitives.convert`."""
from ..autocast_mode import autocast
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast"]
