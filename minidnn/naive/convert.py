"""float32 <-> bfloat16 / float16 as plain array expressions (Caffe had no half types). The rounding is
:mod:`minidnn.primitives.convert`'s, as its twins state it, evaluated with whole-array operations on either
device (several CuPy kernels and temporaries on the GPU, where the primitives run one kernel), with the
primitives' argument checks. On the GPU float16 goes through CuPy's own conversion, which rounds to nearest
even as well; only the payload of a NaN may differ from the primitives' (CuPy writes the GPU's canonical NaN).
"""
from __future__ import annotations

from typing import Any

from ..primitives import convert


def float_to_half(x: Any, dtype: Any, out: Any = None) -> Any:
    name, _, result = convert.checked_to_half(x, dtype, out)
    return convert.to_half_by_expressions(name, x, result)


def half_to_float(h: Any, dtype: Any, out: Any = None) -> Any:
    name, _, result = convert.checked_to_float(h, dtype, out)
    return convert.to_float_by_expressions(name, h, result)
