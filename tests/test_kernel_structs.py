"""The shape structs the kernels take by value: each NumPy record dtype (the bytes a launch passes) against the C
struct its kernel declares, field by field and in order. A field added, dropped or moved on one side only would
have a kernel read its sizes at the wrong offsets, which no CPU run would notice; this test does, without a GPU."""
import os
import re

import numpy as np
import pytest

from minidnn.primitives import augment, blas, pooling
from minidnn.primitives.conv import im2col, implicit_gemm, implicit_gemm_nhwc, winograd

PRIMITIVES = os.path.dirname(pooling.__file__)
# (the record dtype, the source that declares the struct, the struct's name)
STRUCTS = [
    (augment._AUGMENT_SHAPE, "augment.cu", "AugmentShape"),
    (blas._SPLIT_K_SHAPE, "split_k_gemm.cu", "SplitKShape"),
    (pooling._POOL_SHAPE, "pooling.cu", "PoolShape"),
    (im2col._CONV_SHAPE, "conv/im2col.cu", "ConvShape"),
    (implicit_gemm._IMPLICIT_GEMM_SHAPE, "conv/implicit_gemm.cu", "ImplicitGemmShape"),
    (implicit_gemm_nhwc._NHWC_SHAPE, "conv/channels_last.cuh", "NhwcShape"),
    (winograd._TILE_SHAPE, "conv/winograd.cu", "TileShape"),
]


def struct_fields(source: str, name: str) -> list[str]:
    """The int fields of ``struct name { ... };`` in ``source``, in order (comments and member functions skipped)."""
    body = re.search(r"struct\s+" + name + r"\s*\{(.*?)\n\};", source, re.S)
    assert body is not None, f"struct {name} not found"
    fields = []
    for line in body.group(1).splitlines():
        line = line.split("//")[0].strip()
        if "(" in line or not line:  # a member function, or nothing
            continue
        declaration = re.fullmatch(r"int\s+([\w\s,]+);", line)
        assert declaration is not None, f"struct {name}: a field that is not int: {line!r}"
        fields += [field.strip() for field in declaration.group(1).split(",")]
    return fields


@pytest.mark.parametrize("dtype, path, name", STRUCTS, ids=[name for _, _, name in STRUCTS])
def test_each_record_dtype_is_its_kernels_struct(dtype, path, name):
    with open(os.path.join(PRIMITIVES, path), encoding="utf-8") as f:
        fields = struct_fields(f.read(), name)
    assert list(dtype.names) == fields
    assert all(dtype[field] == np.int32 for field in fields)
    assert dtype.itemsize == 4 * len(fields)  # packed as the C struct of ints is


def test_the_parser_sees_fields_and_skips_functions():
    source = """struct Example {
    int a, b;   // two
    int c;
    __device__ int total() const { return a + b; }
};"""
    assert struct_fields(source, "Example") == ["a", "b", "c"]
