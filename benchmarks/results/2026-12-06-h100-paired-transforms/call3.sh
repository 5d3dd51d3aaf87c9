#!/bin/bash
# 2026-12-06 session 8, call 3: the whole GPU suite on the session's last code, then head (0212f79) against new
# (the same code, scratch/new) with PyTorch in TF32, one round, on CPUs 0-3, in the time left.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 340 env PYTHONPATH=.:$P python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/full.log 2>&1
echo "suite rc=$? at $SECONDS s"; grep -E "^FAILED|^ERROR| passed| failed" $R/full.log | tail -15; save
left=$((545 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if [ $left -gt 60 ]; then
  timeout $((left + 40)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=scratch/new \
    --cells resnet20:128:tf32,resnet18:64:tf32 --rounds 1 --torch --cpus 0-3 --budget-seconds $left --timeout 120 \
    --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -10; tail -2 $R/ab.log
  rm -f $R/ab/*/bench.png; save
fi
echo done at $SECONDS
