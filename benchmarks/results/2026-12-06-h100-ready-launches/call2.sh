#!/bin/bash
# 2026-12-06 session 4, call 2: tree after 02b650c (the call-cache test mended, the probe's CUDA API table): the
# ready-launch GPU test, then the R20 b128 eager profile in fp32 and TF32 with the CUDA runtime/driver calls per step.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv_call_cache.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log; tail -3 $R/tests.log; save
timeout 200 env MINIDNN_CACHE_DIR=/tmp/cache-prof python3 benchmarks/probes/eager_step_profile.py --models resnet20:128 --modes fp32,tf32 \
    --engines minidnn,torch --steps 10 --out $R/profile > $R/profile.log 2>&1; echo "profile rc=$?"; save
grep -A 17 "driver calls" $R/profile/profile.md | head -80
echo done at $SECONDS
