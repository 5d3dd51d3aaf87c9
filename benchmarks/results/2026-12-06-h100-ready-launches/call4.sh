#!/bin/bash
# 2026-12-06 session 4, call 4: tree of the probe's commit: which launches of an eager ResNet-20 b128 step wait, fp32 and TF32.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONPATH=.:scratch/pylib PYTHONUNBUFFERED=1
timeout 130 env MINIDNN_CACHE_DIR=/tmp/cache-prof python3 benchmarks/probes/eager_step_profile.py --models resnet20:128 --modes fp32,tf32 \
    --engines minidnn --steps 10 --out $R/profile > $R/profile.log 2>&1; echo "profile rc=$?"; save
head -4 $R/profile/profile.md; grep -A 14 "longest calls" $R/profile/profile.md
echo done at $SECONDS
