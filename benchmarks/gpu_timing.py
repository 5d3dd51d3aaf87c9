"""GPU time of one call, for the benchmark's micro-probes (GPU only; imports CuPy when called)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np


def gpu_ms(call: Callable[[], Any], repeats: int = 7, hold: float = 5) -> float:
    """Median GPU milliseconds of ``call()`` over ``repeats`` samples after two warm-ups, each sample queued behind
    a kernel that holds the stream for ``hold`` ms (minidnn/primitives/hold.cu), so that the gaps in which the GPU
    waits for Python to launch the next kernel do not count; ``hold`` must outlast the host's queuing of the call."""
    from minidnn.primitives import _cuda  # noqa: PLC0415 - GPU only

    # One sample each, behind the fixed hold (a hold that ended early is not retried: max = hold).
    times = [_cuda.queued_milliseconds(call, hold, hold) for _ in range(repeats + 2)]
    return float(np.median(times[2:]))
