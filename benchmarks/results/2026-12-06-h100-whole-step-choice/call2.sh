#!/bin/bash
# 2026-12-06 session 9, call 2: the whole GPU suite on new (the whole-step choice); then head (19a94fd) against new
# with PyTorch, ResNet-20 b128 tf32 and fp32, two rounds, CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
(cd scratch/new && timeout 300 env PYTHONPATH=.:$P python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
  > $R/full.log 2>&1; echo rc=$? >> $R/full.log)
grep -E "^FAILED|^ERROR|passed|failed|rc=" $R/full.log | tail -12; echo "suite done at $SECONDS s"; save
left=$((540 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 50)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=scratch/new \
  --cells resnet20:128:tf32,resnet20:128:fp32 --rounds 2 --torch --cpus 0-3 \
  --budget-seconds $left --timeout 100 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log
rm -f $R/ab/*/bench.png; save
echo done at $SECONDS
