#!/bin/bash
# 2026-12-06 session 6, call 6: tree 7bee1a7 as new, 2d188c0 in scratch/head: ResNet-20 b128 fp32 only, head/new
# alternating with PyTorch beside them on CPUs 0-3, two rounds, on a fresh machine (calls 4-5's machine was noisy).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1
timeout 150 env PYTHONPATH=scratch/pylib python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
  --cells resnet20:128:fp32 --rounds 2 --torch --cpus 0-3 --budget-seconds 130 --timeout 60 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -6; tail -2 $R/ab.log; save
