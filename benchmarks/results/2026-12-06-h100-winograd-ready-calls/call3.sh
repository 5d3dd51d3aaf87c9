#!/bin/bash
# 2026-12-06 session 7, call 3: tree 2266a61 (new): the whole GPU suite, then ResNet-20 b128 fp32 with trees A
# (52b6505, scratch/treeA: Winograd's replayed calls, find as before) and new (find timing the ready forms)
# alternating with PyTorch on CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 320 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/full.log 2>&1; echo rc=$? >> $R/full.log
grep -E "^FAILED|^ERROR|passed|failed|rc=" $R/full.log | tail -12; echo "suite done at $SECONDS s"; save
left=$((500 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if [ $left -gt 60 ]; then
  timeout $((left + 40)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree A=scratch/treeA --tree new=. \
    --cells resnet20:128:fp32 --rounds 3 --torch --cpus 0-3 --budget-seconds $left --timeout 100 \
    --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -8; tail -2 $R/ab.log; save
fi
echo done at $SECONDS
