#!/bin/bash
# 2026-12-06 session 9, call 5: issue 22's TF32 cells not measured since 2026-12-02 (CaffeNet b128, ResNet-50 b64,
# ResNet-18 b64) and CaffeNet b256 fp32, new (70b4ff1) against PyTorch, one round, CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
left=$((380 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 60)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=scratch/new \
  --cells caffenet:128:tf32,resnet50:64:tf32,resnet18:64:tf32,caffenet:256:fp32 --rounds 1 --torch --cpus 0-3 \
  --budget-seconds $left --timeout 110 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log
rm -f $R/ab/*/bench.png; save
echo done at $SECONDS
