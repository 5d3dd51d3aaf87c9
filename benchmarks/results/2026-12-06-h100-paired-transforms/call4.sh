#!/bin/bash
# 2026-12-06 session 8, call 4: the ends a whole-step choice would pick between. new (eb3ed9d: eager calls by
# max(GPU, host)) against lean (eb3ed9d with eager calls by the least host time, scratch/lean) with PyTorch, on CPUs
# 0-3: ResNet-20 b128 fp32 (host-bound) two rounds, ResNet-18 b64 fp32 (GPU-bound) one round.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 140 env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=scratch/new --tree lean=scratch/lean \
  --cells resnet20:128:fp32 --rounds 2 --torch --cpus 0-3 --budget-seconds 95 --timeout 80 \
  --out $R/ab-resnet20 > $R/ab-resnet20.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab-resnet20/ab.md 2>/dev/null | head -6; rm -f $R/ab-*/*/bench.png; save
left=$((180 - SECONDS)); echo "== ResNet-18 at $SECONDS s, budget $left s"
if [ $left -gt 50 ]; then
  timeout $((left + 30)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=scratch/new --tree lean=scratch/lean \
    --cells resnet18:64:fp32 --rounds 1 --torch --cpus 0-3 --budget-seconds $left --timeout 100 \
    --out $R/ab-resnet18 > $R/ab-resnet18.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab-resnet18/ab.md 2>/dev/null | head -6; rm -f $R/ab-*/*/bench.png; save
fi
echo done at $SECONDS
