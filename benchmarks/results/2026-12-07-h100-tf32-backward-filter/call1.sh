#!/bin/bash
# 2026-12-07 session 19, call 1 (carry scratch/pylib, scratch/base, scratch/calls): the whole GPU suite (first GPU
# run of gemm_1x1's channels-last GEMMs, d7bd020, and of the TF32 backward-filter); the TF32 layers
# (tf32_channels_last_convolution.py, backward-filter now in); ResNet-18 b128 TF32 captured, channels-last, base
# 59fb863 against this tree, PyTorch TF32 channels_last beside (ab.py, one round).
set -u
R=/tmp/r1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r1.tgz -C /tmp r1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%h > $R/tree.txt 2>/dev/null; git status --short | grep -v "^??" | head -12 >> $R/tree.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 290 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/gpu-suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/gpu-suite.log; grep -E "^(FAILED|ERROR)" $R/gpu-suite.log | head -20; save
timeout 130 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/tf32_channels_last_convolution.py \
  --out $R/tf32 > $R/tf32.log 2>&1
echo "tf32 layers rc=$? at $SECONDS s"; tail -30 $R/tf32.log | cut -c1-250; save
left=$((560 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
[ $left -gt 80 ] && timeout $((left + 20)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base \
  --tree new=. --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:tf32 \
  --budget-seconds $left --timeout 120 \
  --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last --torch-channels-last" \
  --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -8; tail -1 $R/ab.log
rm -f $R/ab/*/bench.png; save; echo done at $SECONDS
