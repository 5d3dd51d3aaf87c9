#!/bin/bash
# 2026-12-06 session 5, call 3: tree 4e540c4 (packed launches, leaner conv and batch-norm nodes) as new, 8b2ae5a
# (library of 9ee0667) in scratch/head: the whole GPU suite, then head/new alternating with PyTorch, on CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 280 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log
grep -E "^FAILED|^ERROR|passed|failed" $R/suite.log | tail -12; save
left=$((520 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if [ $left -gt 60 ]; then
  timeout $((left + 50)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
    --cells resnet20:128:fp32,resnet20:128:tf32,resnet18:64:tf32 --rounds 2 --torch --cpus 0-3 --budget-seconds $left \
    --timeout 80 --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log; save
fi
echo done at $SECONDS
