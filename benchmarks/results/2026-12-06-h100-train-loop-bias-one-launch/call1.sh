#!/bin/bash
# 2026-12-06 session 10, call 1: issue 22's train.py-against-step-alone cells again (ResNet-20 b128, shapes10 and
# CIFAR-format data, eager and captured), on main 34c13c0: the eager step is 2-5x faster than when they were measured.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
git log -1 --format=%H > $R/tree.txt 2>/dev/null
timeout 420 env PYTHONPATH=$P:. python3 benchmarks/probes/train_throughput.py --models resnet20 \
  --batch 128 --data shapes10,cifar --modes eager,captured --epochs 3 --timeout 120 --out $R/train-throughput \
  > $R/train-throughput.log 2>&1
echo "train rc=$? at $SECONDS s"; cat $R/train-throughput/train-throughput.md 2>/dev/null | head -30; tail -5 $R/train-throughput.log
save
echo done at $SECONDS
