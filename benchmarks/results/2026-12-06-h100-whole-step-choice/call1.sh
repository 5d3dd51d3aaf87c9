#!/bin/bash
# 2026-12-06 session 9, call 1: the whole-step choice's GPU tests; then head (19a94fd: per-call max(GPU, host) rule)
# against new (0c2eab1: whole-step choice) with PyTorch, ResNet-20 b128 fp32/tf32 and ResNet-18 b64 fp32, CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
(cd scratch/new && timeout 120 env PYTHONPATH=.:$P python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 \
  tests/test_conv_step_choice.py tests/test_conv_call_cache.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log)
grep -E "^FAILED|^ERROR|passed|failed" $R/tests.log | tail -12; echo "tests done at $SECONDS s"; save
left=$((500 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 60)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=scratch/new \
  --cells resnet20:128:fp32,resnet20:128:tf32,resnet18:64:fp32 --rounds 1 --torch --cpus 0-3 \
  --budget-seconds $left --timeout 150 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log
rm -f $R/ab/*/bench.png; save
grep -rho '"step_choice": {[^}]*}' $R/ab | head; grep -rho '"settling_steps": [0-9]*' $R/ab | head
echo done at $SECONDS
