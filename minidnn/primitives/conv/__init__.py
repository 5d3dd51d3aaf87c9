"""Convolution primitives: three directions, an algorithm registry, a workspace limit.

Algorithms register on import; ``algo="auto"`` tries them by their ``priority`` (fastest first,
the zero-workspace ``reference`` last, as cuDNN falls back to its zero-workspace implicit GEMM).
"""
from . import gemm, reference  # noqa: F401 - importing registers the algorithms
from .api import conv2d_backward_data, conv2d_backward_filter, conv2d_forward
from .problem import ConvProblem
from .registry import (ConvAlgorithm, algorithms, default_algorithm, register, set_workspace_limit, settings,
                       workspace_limit)

__all__ = [
    "conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "ConvProblem", "ConvAlgorithm",
    "algorithms", "register", "settings", "set_workspace_limit", "workspace_limit", "default_algorithm",
]
