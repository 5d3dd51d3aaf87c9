#!/bin/bash
# Session 24, call 4 (carry scratch/pylib), tree 53d9b63: the GPU tests of gemm_1x1 (the chunk from the handed
# workspace, the fixed chunk test), strided_dgrad and the shared convolution cases. What ran is this one command
# line, given to the device tool inline (a first try named scratch/calls/s24c4.sh, which was not carried, and
# ended at once, rc 127, after the machine had started).
timeout 140 env PYTHONPATH=.:$PWD/scratch/pylib python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_gemm_1x1.py tests/test_conv_strided_dgrad.py tests/test_primitives_conv.py > $OUT/touched.log 2>&1; echo "rc=$? $SECONDS s"; tail -2 $OUT/touched.log; grep -E "^(FAILED|ERROR)" $OUT/touched.log | head; nvidia-smi --query-gpu=name --format=csv,noheader
