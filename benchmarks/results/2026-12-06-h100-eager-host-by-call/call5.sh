#!/bin/bash
# 2026-12-06 session 5, call 5: tree c865c00+ (the library of 4e540c4): where an eager step's host time goes by
# primitive, timed before any CUPTI session, ResNet-18 b64 and ResNet-20 b128, fp32 and TF32 (the next session's map).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONPATH=.:scratch/pylib PYTHONUNBUFFERED=1
timeout 230 env MINIDNN_CACHE_DIR=/tmp/cache-prof taskset -c 0-3 python3 benchmarks/probes/eager_step_profile.py \
  --models resnet18:64,resnet20:128 --modes fp32,tf32 --engines minidnn --steps 10 --out $R/profile > $R/profile.log 2>&1
echo "profile rc=$? at $SECONDS"; head -8 $R/profile/profile.md; save
echo done at $SECONDS
