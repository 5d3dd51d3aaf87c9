#!/bin/bash
# 2026-12-06 session 12, call 4: where ResNet-50 b64's and ResNet-18 b64's eager host time goes on the session's tree
# (e7dfe01), fp32, minidnn only, CPUs 0-3: host ms by call, kernels by name, Python calls, cProfile.
set -u
R=/tmp/r4; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r4.tgz -C /tmp r4; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 200 env PYTHONPATH=.:$P taskset -c 0-3 python3 benchmarks/probes/eager_step_profile.py \
  --out $R/profile --models resnet50:64,resnet18:64 --engines minidnn --modes fp32 --steps 10 > $R/profile.log 2>&1
echo "profile rc=$? at $SECONDS s"; tail -3 $R/profile.log; head -4 $R/profile/profile.md; save
echo done at $SECONDS
