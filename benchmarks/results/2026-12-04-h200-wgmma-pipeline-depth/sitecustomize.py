# Scratch only (git-ignored): SCRATCH_WGMMA_PIPELINE="128=4,1;64=3,0" sets implicit_gemm_wgmma.PIPELINES in every
# process that starts with this folder on PYTHONPATH (the bench's workers inherit it).
import os
import sys

_value = os.environ.get("SCRATCH_WGMMA_PIPELINE")
if _value:
    from minidnn.primitives.conv import implicit_gemm_wgmma as _wgmma
    for _item in _value.split(";"):
        _width, _build = _item.split("=")
        _wgmma.PIPELINES[int(_width)] = tuple(int(v) for v in _build.split(","))
    print(f"[scratch] implicit_gemm_wgmma.PIPELINES = {_wgmma.PIPELINES}", file=sys.stderr)
