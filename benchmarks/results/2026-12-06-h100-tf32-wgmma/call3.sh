#!/bin/bash
# 2026-12-06 session 18, call 3 (carry scratch/pylib), on call 1's machine: ResNet-50 b128 TF32 captured in NCHW, the
# TF32 build's tree alone, PyTorch TF32 channels_last beside (ab.py, one round; no base: too little device time).
P=$PWD/scratch/pylib; R=/tmp/r4; mkdir -p $R
timeout 185 env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --torch --engine minidnn-graph --rounds 1 \
  --cpus 0-3 --cells resnet50:128:tf32 --budget-seconds 170 --timeout 85 \
  --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --torch-channels-last" \
  --out $R/ab-r50 > $R/ab-r50.log 2>&1
echo rc=$?; grep "^|" $R/ab-r50/ab.md; tail -3 $R/ab-r50.log; rm -f $R/ab-r50/*/bench.png; tar czf $OUT/r4.tgz -C /tmp r4
