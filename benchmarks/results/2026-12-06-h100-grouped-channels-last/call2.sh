#!/bin/bash
# 2026-12-06 session 17, call 2 (carry scratch/pylib, scratch/base, this script), a second machine: CaffeNet b256
# bf16, base (07c54cd) against main 82e4c7b (grouped layers on the channels-last kernels), PyTorch AMP beside, one
# round each: captured NCHW, captured channels-last, eager NCHW.
set -u
R=/tmp/r2; rm -rf $R; mkdir -p $R
save() { rm -f $R/*/*/bench.png; tar czf $OUT/r2.tgz -C /tmp r2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
for run in graph-nchw graph-channels-last eager-nchw; do
  extra=""; engine=minidnn-graph
  [ $run = graph-channels-last ] && extra=" --channels-last"
  [ $run = eager-nchw ] && engine=minidnn
  left=$((330 - SECONDS)); echo "== ab $run at $SECONDS s, budget $left s"
  [ $left -gt 50 ] && timeout $((left + 30)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base \
    --tree new=. --torch --engine $engine --rounds 1 --cpus 0-3 --cells caffenet:256:bf16 \
    --budget-seconds $left --timeout 90 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1$extra" \
    --out $R/ab-$run > $R/ab-$run.log 2>&1
  echo "ab $run rc=$? at $SECONDS s"; grep "^| caffenet" $R/ab-$run/ab.md 2>/dev/null | head -3; tail -1 $R/ab-$run.log
  save
done
echo done at $SECONDS
