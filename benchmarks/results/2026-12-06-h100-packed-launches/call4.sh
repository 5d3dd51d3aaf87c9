#!/bin/bash
# 2026-12-06 session 5, call 4: the same trees as call 3 (new 4e540c4, head 8b2ae5a in scratch/head): ResNet-18 b64
# TF32 alone, three rounds, head/new alternating with PyTorch, on CPUs 0-3 (call 3 had one round, new slower).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONUNBUFFERED=1
timeout 450 env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
  --cells resnet18:64:tf32 --rounds 3 --torch --cpus 0-3 --budget-seconds 380 --timeout 80 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -8; tail -2 $R/ab.log; save
echo done at $SECONDS
