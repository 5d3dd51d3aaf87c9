#!/bin/bash
# 2026-12-07 session 20, call 2 (carry scratch/pylib), on the machine call 1 left warm: where the eager bf16 step's
# host and GPU time go, NCHW against channels-last, CaffeNet b256 and ResNet-18 b128, minidnn and PyTorch (issue 24
# items 3 and 4).
mkdir -p /tmp/r5 && nvidia-smi --query-gpu=name --format=csv,noheader > /tmp/r5/machine.txt
timeout 190 env PYTHONUNBUFFERED=1 PYTHONPATH=.:scratch/pylib python3 benchmarks/probes/eager_step_profile.py \
  --out /tmp/r5/profile --models caffenet:256,resnet18:128 --engines minidnn,torch --modes bf16,bf16+channels_last \
  --steps 6 > /tmp/r5/profile.log 2>&1
echo rc=$?; grep "^|" /tmp/r5/profile/profile.md | head -14; tar czf $OUT/r5.tgz -C /tmp r5
