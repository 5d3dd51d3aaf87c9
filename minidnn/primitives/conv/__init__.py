"""Convolution primitives: three directions, an algorithm registry, a workspace limit, get and find.

Algorithms register on import, one file each (docs/convolution.md describes them). ``algo="auto"``
asks :mod:`.selection` for the best one under the workspace limit: measured (``find``) on the GPU,
guessed by shape (``get``) on the CPU, unless :func:`set_benchmark` says otherwise.
"""
from . import (fft, gemm, gemm_1x1, implicit_gemm, implicit_gemm_nhwc, implicit_gemm_wgmma, reference,  # noqa: F401
               strided_dgrad, winograd)  # importing registers the algorithms
from .api import conv2d_backward_data, conv2d_backward_filter, conv2d_forward, plans_in_use
from .plans import Plan
from .problem import ConvProblem
from .registry import (ConvAlgorithm, algorithms, are_deterministic_algorithms_enabled, default_algorithm, parse_size,
                       register, set_benchmark, set_microbatch, set_workspace_limit, settings,
                       use_deterministic_algorithms, workspace_limit)
from .selection import AlgoPerf, find, get

__all__ = [
    "conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "ConvProblem", "ConvAlgorithm", "Plan",
    "AlgoPerf", "algorithms", "register", "settings", "set_workspace_limit", "workspace_limit", "default_algorithm",
    "set_benchmark", "set_microbatch", "parse_size", "find", "get", "use_deterministic_algorithms",
    "are_deterministic_algorithms_enabled", "plans_in_use",
]
