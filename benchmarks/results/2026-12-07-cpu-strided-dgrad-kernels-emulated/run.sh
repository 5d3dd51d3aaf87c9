#!/bin/bash
# From the repository's root: builds harness.cpp against the tree's kernels and runs drive.py (g++ 12, C++20).
set -eu
HERE=benchmarks/results/2026-12-07-cpu-strided-dgrad-kernels-emulated
BUILD=$(mktemp -d)
CONV=minidnn/primitives/conv
sed -n '/^struct NhwcShape {/,/^};/p' $CONV/channels_last.cuh > $BUILD/nhwc.h
# The phase kernel and its struct, MAX_PHASES renamed apart from strided_dgrad.cu's (two files on the GPU, one here).
sed -n '/^constexpr int MAX_PHASES = 4;/,/^#endif/p' $CONV/implicit_gemm_wgmma.cu | sed '$d' |
  sed 's/MAX_PHASES/WGMMA_MAX_PHASES/g' > $BUILD/phases_kernel.h
cp $CONV/strided_dgrad.cu $BUILD/
g++ -std=c++20 -O1 -pthread -I$HERE -I$BUILD -x c++ $HERE/harness.cpp -o $BUILD/harness
python3 $HERE/drive.py $BUILD
