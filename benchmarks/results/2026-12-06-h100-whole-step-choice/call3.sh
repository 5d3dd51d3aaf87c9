#!/bin/bash
# 2026-12-06 session 9, call 3: does the whole-step choice cost the GPU-bound models anything? head (19a94fd) against
# new (b76be76) with PyTorch, ResNet-18 b64, ResNet-50 b64 and CaffeNet b128 in fp32, one round, CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
left=$((420 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 60)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=scratch/new \
  --cells resnet18:64:fp32,caffenet:128:fp32,resnet50:64:fp32 --rounds 1 --torch --cpus 0-3 \
  --budget-seconds $left --timeout 110 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log
rm -f $R/ab/*/bench.png; save
echo done at $SECONDS
