#!/bin/bash
# 2026-12-06 session 18, call 1 (carry scratch/pylib, scratch/base, this script): the whole GPU suite on the TF32
# build's tree; one GPU removal check (half of each stage's wgmma products dropped); ResNet-18 b128 TF32 captured,
# channels-last, base (main b1197e5) against the TF32 build, PyTorch TF32 channels_last beside (ab.py, one round);
# then the probe of ResNet's TF32 layers (the TF32 build against implicit_gemm, find's choice before and now,
# cuDNN) in the time left.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%h > $R/tree.txt 2>/dev/null; git status --short | grep -v "^??" | head -5 >> $R/tree.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 300 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/gpu-suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/gpu-suite.log; grep -E "^(FAILED|ERROR)" $R/gpu-suite.log | head -20; save
broken() { # $1 name, $2 file, $3 sed expression: the TF32 GPU tests with one line broken, then restored
  cp $2 /tmp/orig; sed -i "$3" $2; cmp -s $2 /tmp/orig && { echo "removal $1: sed changed nothing"; return; }
  timeout 80 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "tf32" \
    tests/test_conv_wgmma.py > $R/removal-$1.log 2>&1
  echo "removal $1 rc=$? at $SECONDS s (expected 1)"; tail -1 $R/removal-$1.log; cp /tmp/orig $2; save; }
broken half-the-products minidnn/primitives/conv/implicit_gemm_wgmma.cu 's/PRODUCTS = ROW_BYTES \/ 32;/PRODUCTS = ROW_BYTES \/ 64;/'
git diff --stat | tail -1 > $R/restored.txt
left=$((470 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
[ $left -gt 60 ] && timeout $((left + 30)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base \
  --tree new=. --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:tf32 \
  --budget-seconds $left --timeout 120 \
  --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last --torch-channels-last" \
  --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -8; tail -1 $R/ab.log
rm -f $R/ab/*/bench.png; save
[ $SECONDS -lt 480 ] && timeout $((585 - SECONDS)) env PYTHONPATH=.:$P python3 benchmarks/probes/tf32_channels_last_convolution.py --out $R/probe \
  > $R/probe.log 2>&1
echo "probe rc=$? at $SECONDS s"; tail -16 $R/probe.log; save
echo done at $SECONDS
