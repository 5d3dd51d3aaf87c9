#!/bin/bash
# 2026-12-06 session 9, call 4: CaffeNet b128 fp32's eager step profiled (kernels by name, top functions), minidnn
# (with its whole-step choice settled) and PyTorch: where its 1.23x kernels and 1.22x host time go.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
(cd scratch/new && timeout 200 env PYTHONPATH=.:$P taskset -c 0-3 python3 benchmarks/probes/eager_step_profile.py \
  --out $R/profile --models caffenet:128 --engines minidnn,torch --modes fp32 --steps 10 \
  > $R/profile.log 2>&1; echo "profile rc=$? at $SECONDS s")
tail -3 $R/profile.log; save
echo done at $SECONDS
