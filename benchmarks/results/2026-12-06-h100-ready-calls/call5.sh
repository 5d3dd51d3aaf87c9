#!/bin/bash
# 2026-12-06 session 6, call 5: tree 7bee1a7 as new, 2d188c0 in scratch/head: ResNet-20 b128 fp32 and TF32, head/new
# alternating with PyTorch beside them on CPUs 0-3, three rounds (call 4's machine swung PyTorch's step 6.3-9.1 ms).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONUNBUFFERED=1
left=$((330 - SECONDS))
timeout $((left + 30)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
  --cells resnet20:128:fp32,resnet20:128:tf32 --rounds 3 --torch --cpus 0-3 --budget-seconds $left --timeout 90 \
  --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -12; tail -2 $R/ab.log; save
echo done at $SECONDS
