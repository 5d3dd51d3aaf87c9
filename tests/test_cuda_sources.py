"""Every CUDA source of the package (the primitives' and the naive engine's) compiles with nvcc for sm_90, in float
and in double, without register spills (CPU test: no GPU needed)."""
import os
import shutil
import subprocess

import pytest

from minidnn.primitives import _cuda

NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("scalar", ["float", "double"])
@pytest.mark.parametrize("source", _cuda.cuda_sources())
def test_cuda_source_compiles(source, scalar, tmp_path):
    result = subprocess.run(
        [NVCC, "-cubin", "-arch=sm_90", "--std=c++17", f"-DSCALAR={scalar}", "-Xptxas", "-warn-spills",
         "-o", os.fspath(tmp_path / "out.cubin"), _cuda.source_path(source)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"nvcc failed on {source}:\n{result.stderr}"
    assert "spill" not in result.stderr, f"{source} spills registers:\n{result.stderr}"


def test_sources_are_found():
    # the primitives' kernels, and the naive engine's beside minidnn/naive's Python, compiled by function() too
    assert {"conv/im2col.cu", "../naive/caffe_layers.cu"} <= set(_cuda.cuda_sources())
    assert _cuda.package_source("naive/caffe_layers.cu") == "../naive/caffe_layers.cu"
