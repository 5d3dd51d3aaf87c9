"""The structs the kernels take by value: each NumPy record dtype (the bytes a launch passes) against the C struct
its kernel declares, field by field and in order, and the optimizers' tensor table with its array sizes. A field
added, dropped or moved on one side only would have a kernel read its arguments at the wrong offsets, which no CPU
run would notice; this test does, without a GPU."""
import os
import re

import numpy as np
import pytest

from minidnn.primitives import augment, blas, optimizer, pooling
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


# optimizer.cu's field types, as the record dtype stores them: a device pointer is its 64-bit address
C_TYPES = {"scalar_t*": np.uint64, "int": np.int32, "unsigned char": np.uint8}


def test_the_optimizers_tensor_table_is_its_kernels_struct():
    """TensorTable: the sizes optimizer.py and optimizer.cu define alike, then each field's name, type and array
    shape in order; NumPy's aligned layout is C's, so the offsets follow."""
    with open(os.path.join(PRIMITIVES, "optimizer.cu"), encoding="utf-8") as f:
        source = f.read()
    defines = {name: int(value) for name, value in re.findall(r"#define (\w+) (\d+)", source)}
    assert [defines[n] for n in ("LISTS", "MAX_TENSORS", "MAX_BLOCKS", "THREADS")] == [
        optimizer.LISTS, optimizer.MAX_TENSORS, optimizer.MAX_BLOCKS, optimizer.THREADS]
    assert optimizer.BLOCK_GRANULE == defines["THREADS"] * defines["UNROLL"]
    body = re.search(r"struct TensorTable \{(.*?)\n\};", source, re.S).group(1)
    fields = []
    for line in filter(None, (line.split("//")[0].strip() for line in body.splitlines())):
        declaration = re.fullmatch(r"(scalar_t\*|int|unsigned char) (\w+)((?:\[\w+\])*);", line)
        assert declaration is not None, line
        c_type, name, dimensions = declaration.groups()
        fields.append((name, C_TYPES[c_type], tuple(defines[d] for d in re.findall(r"\[(\w+)\]", dimensions))))
    table = optimizer._TABLE
    assert list(table.names) == [name for name, _, _ in fields]
    for name, element, shape in fields:
        field = table[name]
        assert (field.base if field.subdtype else field) == element, name
        assert field.shape == shape, name
    assert table.isalignedstruct
