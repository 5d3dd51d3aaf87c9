#!/bin/bash
# 2026-12-06 session 14, call 3 (carry scratch/pylib, scratch/base, this script): issue 24's other two bf16 cells,
# base (HEAD 9a8d69d) against the backward-filter change (7fa9358), captured, PyTorch AMP beside (ab.py, one round):
# ResNet-50 b128 channels-last, CaffeNet b256 NCHW; then the per-layer probe on the change, written out.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
ab() { left=$(($3 - SECONDS)); echo "== ab $1 at $SECONDS s, budget $left s"; [ $left -lt 40 ] && return
  timeout $((left + 20)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base --tree new=. --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $1:$2:bf16 --budget-seconds $left --timeout 110 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 ${4:-}" \
    --out $R/ab-$1 > $R/ab-$1.log 2>&1
  echo "ab $1 rc=$? at $SECONDS s"; grep "^|" $R/ab-$1/ab.md 2>/dev/null | head -6; tail -1 $R/ab-$1.log
  rm -f $R/ab-$1/*/bench.png; save; }
ab resnet50 128 200 --channels-last
ab caffenet 256 300
timeout 60 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/backward_filter_kernels.py --out $R/probe \
  --label new > $R/probe-new.log 2>&1; echo "probe rc=$? at $SECONDS s"; save
echo done at $SECONDS
