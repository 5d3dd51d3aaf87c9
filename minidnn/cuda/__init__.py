"""``minidnn.cuda``: the GPU questions PyTorch users ask of ``torch.cuda`` (devices from :mod:`minidnn.backend`,
memory statistics and the TF32 switch from the CUDA runtime :mod:`minidnn.primitives._cuda`), and
:mod:`minidnn.cuda.graphs`, a whole training step captured and replayed as one CUDA graph."""
from ..backend import cuda_device_count as device_count, cuda_is_available as is_available, synchronize
from ..primitives._cuda import (allow_tf32, max_memory_allocated, memory_allocated, memory_stats,
                                reset_peak_memory_stats, set_allow_tf32, tf32)
from . import graphs

__all__ = ["is_available", "device_count", "synchronize", "memory_allocated", "max_memory_allocated",
           "reset_peak_memory_stats", "memory_stats", "allow_tf32", "set_allow_tf32", "tf32", "graphs"]
