#!/bin/bash
# 2026-12-06 session 4, call 1: tree 02b650c (batch norm's kept scratch, F.pad shortcut, conv ready launches) as new,
# f85b495 (main before them) as head in scratch/head.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_primitives_batchnorm.py tests/test_conv_call_cache.py \
  tests/test_functional.py tests/test_models.py tests/test_cuda_graphs.py tests/test_memory_plan.py tests/test_conv_implicit_gemm.py \
  > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log; tail -6 $R/tests.log; save
echo "== ab at $SECONDS s"
timeout 380 env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
  --cells resnet20:128:fp32,resnet20:128:tf32 --rounds 3 --torch --budget-seconds 330 --timeout 60 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; cat $R/ab/ab.md 2>/dev/null | head -40; tail -3 $R/ab.log; save
if [ $SECONDS -lt 520 ]; then
  timeout 60 env MINIDNN_CACHE_DIR=/tmp/cache-prof python3 benchmarks/probes/eager_step_profile.py --models resnet20:128 --modes fp32 \
    --engines minidnn --steps 10 --out $R/profile > $R/profile.log 2>&1; echo "profile rc=$?"; save
fi
echo done at $SECONDS
