#!/bin/bash
# 2026-12-06 session 8, call 1: head (0212f79, scratch/head) against new (a339b68, scratch/new) with PyTorch on CPUs
# 0-3: ResNet-20's fp32/TF32 and ResNet-18's fp32 eager steps; then new's kernels by name (ResNet-18 b64, ResNet-20
# b128, fp32) and PyTorch's, for the kernels-a-step bar.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 400 env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=scratch/new \
  --cells resnet20:128:fp32,resnet18:64:fp32,resnet20:128:tf32 --rounds 2 --torch --cpus 0-3 --budget-seconds 330 \
  --timeout 120 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log; save
left=$((560 - SECONDS)); echo "== profile at $SECONDS s, $left s left"
(cd scratch/new && timeout $left env PYTHONPATH=.:$P taskset -c 0-3 python3 benchmarks/probes/eager_step_profile.py \
  --out $R/profile --models resnet18:64,resnet20:128 --engines minidnn,torch --modes fp32 --steps 10 \
  > $R/profile.log 2>&1; echo "profile rc=$? at $SECONDS s")
tail -3 $R/profile.log; save
echo done at $SECONDS
