#!/bin/bash
# 2026-12-07 session 19, call 2 (carry scratch/pylib, scratch/base, scratch/calls), on call 1's machine: the TF32
# build's pipelines (wgmma_pipeline_depth.py --tf32); ResNet-50 b128 bf16 captured, channels-last, base 59fb863
# against this tree, PyTorch AMP beside (ab.py, one round).
set -u
R=/tmp/r2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r2.tgz -C /tmp r2; }
nvidia-smi --query-gpu=name --format=csv,noheader > $R/machine.txt 2>&1
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 120 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/wgmma_pipeline_depth.py --tf32 \
  --out $R/pipeline --label tf32 --builds current 4,0 4,1 5,1 6,2 > $R/pipeline.log 2>&1
echo "pipeline rc=$? at $SECONDS s"; tail -30 $R/pipeline.log; save
left=$(($1 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
[ $left -gt 100 ] && timeout $((left + 20)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base \
  --tree new=. --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet50:128:bf16 \
  --budget-seconds $left --timeout 150 \
  --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last" \
  --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -8; tail -1 $R/ab.log
rm -f $R/ab/*/bench.png; save; echo done at $SECONDS
