#!/bin/bash
# 2026-12-06 session 11, call 1: where the loader's next goes, part by part (train_loop_host.py --next-parts), on 2f8e35e's library.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 200 env PYTHONPATH=.:$P python3 benchmarks/probes/train_loop_host.py --data shapes10,cifar --epochs 3 \
  --next-parts --out $R/train-loop-host > $R/train-loop-host.log 2>&1
echo "loop rc=$? at $SECONDS s"; grep "^|" $R/train-loop-host/train-loop-host.md 2>/dev/null
save
echo done at $SECONDS
