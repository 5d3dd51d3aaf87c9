"""``minidnn.cuda``: the GPU questions PyTorch users ask of ``torch.cuda``, answered by :mod:`minidnn.backend`,
and :mod:`minidnn.cuda.graphs`, a whole training step captured and replayed as one CUDA graph."""
from ..backend import (cuda_device_count as device_count, cuda_is_available as is_available, max_memory_allocated,
                       memory_allocated, memory_stats, reset_peak_memory_stats, synchronize)
from . import graphs

__all__ = ["is_available", "device_count", "synchronize", "memory_allocated", "max_memory_allocated",
           "reset_peak_memory_stats", "memory_stats", "graphs"]
