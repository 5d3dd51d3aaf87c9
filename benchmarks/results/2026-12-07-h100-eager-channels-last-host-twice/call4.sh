#!/bin/bash
# Session 23, call 4 (carry scratch/pylib, scratch/calls): the eager bf16 step's host time in both layouts, timed
# twice in processes of their own (eager_step_profile.py runs each mode in its own process): is call 1's
# channels-last host figure (15.28 ms against NCHW's 10.47) a cost or a wait? ResNet-18 b128 twice, CaffeNet b256 once.
set -u
R=/tmp/s23d; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s23d.tgz -C /tmp s23d; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
for run in resnet18:128:a resnet18:128:b caffenet:256:a; do
  model=${run%:*}; label=${run//:/-}; left=$((280 - SECONDS)); [ $left -lt 45 ] && break
  timeout $left env PYTHONPATH=.:$P python3 benchmarks/probes/eager_step_profile.py --out $R/profile-$label \
    --models $model --engines minidnn --modes bf16+channels_last,bf16 --steps 6 > $R/profile-$label.log 2>&1
  echo "profile $run rc=$? at $SECONDS s"; grep "^| minidnn" $R/profile-$label/profile.md 2>/dev/null; save
done
