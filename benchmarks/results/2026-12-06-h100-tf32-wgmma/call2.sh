#!/bin/bash
# 2026-12-06 session 18, call 2 (carry scratch/pylib, scratch/base), on call 1's machine: ResNet-18 b128 TF32
# captured in NCHW, base (main b1197e5) against the TF32 build, PyTorch TF32 channels_last beside (ab.py, one round).
P=$PWD/scratch/pylib; R=/tmp/r3; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base --tree new=. --torch \
  --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:tf32 --budget-seconds 200 --timeout 120 \
  --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --torch-channels-last" \
  --out $R/ab-nchw > $R/ab-nchw.log 2>&1
echo rc=$?; grep "^|" $R/ab-nchw/ab.md; rm -f $R/ab-nchw/*/bench.png; tar czf $OUT/r3.tgz -C /tmp r3
