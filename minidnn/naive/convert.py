"""float32 <-> bfloat16 / float16 as plain array expressions (Caffe had no half types). The rounding is
:mod:`minidnn.primitives.convert`'s, as its twins state it, evaluated with whole-array operations on either
device (several CuPy kernels and temporaries on the GPU, where the primitives run one kernel), with the
primitives' argument checks. On the GPU float16 goes through CuPy's own conversion, which rounds to nearest
even as well; only the payload of a NaN may differ from the primitives' (CuPy writes the GPU's canonical NaN).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..primitives import convert


def float_to_half(x: Any, dtype: Any, out: Any = None) -> Any:
    name, xp, result = convert.checked_to_half(x, dtype, out)
    if name == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            result[...] = x
    else:
        result.view(np.uint16)[...] = convert.bfloat16_words(x)
    return result


def half_to_float(h: Any, dtype: Any, out: Any = None) -> Any:
    name, xp, result = convert.checked_to_float(h, dtype, out)
    result[...] = convert.float_from_bfloat16_words(xp.ascontiguousarray(h).view(np.uint16)) \
        if name == "bfloat16" else h
    return result
