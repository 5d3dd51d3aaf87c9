#!/bin/bash
# 2026-12-06 session 5, call 2: tree 6fea73c (packed launches) as new, 8b2ae5a (library of 9ee0667) in scratch/head:
# the GPU tests of the touched files, then head/new alternating with PyTorch beside them, on CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 170 env MINIDNN_CACHE_DIR=/tmp/cache-t python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_packed_launch.py \
  tests/test_primitives_batchnorm.py tests/test_primitives_activation.py tests/test_conv_call_cache.py tests/test_conv_implicit_gemm.py \
  tests/test_cuda_graphs.py tests/test_gpu_training.py tests/test_memory_plan.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log
grep -E "^FAILED|^ERROR|passed|failed" $R/tests.log | tail -12; save
left=$((470 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if [ $left -gt 60 ]; then
  timeout $((left + 60)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
    --cells resnet20:128:fp32,resnet20:128:tf32,resnet18:64:fp32 --rounds 2 --torch --cpus 0-3 --budget-seconds $left --timeout 90 \
    --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log; save
fi
echo done at $SECONDS
