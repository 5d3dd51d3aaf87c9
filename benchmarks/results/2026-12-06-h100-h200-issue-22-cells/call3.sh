#!/bin/bash
# 2026-12-06 session 12, call 3: issue 22's eager cells on the session's tree (e7dfe01) against PyTorch, one round,
# fp32: wall, host, kernels, GPU-busy, each engine in its own process, CPUs 0-3.
set -u
R=/tmp/r3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r3.tgz -C /tmp r3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
left=$((400 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 40)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree main=. \
  --cells caffenet:256:fp32,resnet18:64:fp32,resnet50:64:fp32,caffenet:128:fp32,resnet20:128:fp32 --rounds 1 --torch \
  --cpus 0-3 --budget-seconds $left --timeout 110 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -20; tail -2 $R/ab.log
rm -f $R/ab/*/bench.png; save
echo done at $SECONDS
