#!/bin/bash
# 2026-12-06 session 14, call 2 (carry scratch/pylib, scratch/base, this script): the backward-filter kernels' pixel
# walk and (K, R, S, C) sums (7fa9358). The GPU tests of the files the change reaches; ResNet-18 b128 bf16
# channels-last captured, base (HEAD 9a8d69d) against the change, PyTorch AMP beside (ab.py, one round); the
# per-layer probe on the change and on base, as time allows.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 150 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_half.py \
  tests/test_conv_nhwc.py tests/test_conv_wgmma.py tests/test_autocast.py tests/test_memory_format.py \
  tests/test_deterministic.py tests/test_train.py > $R/gpu-tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -2 $R/gpu-tests.log; grep -E "^(FAILED|ERROR)" $R/gpu-tests.log | head; save
left=$((320 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 20)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base --tree new=. --torch \
  --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:bf16 --budget-seconds $left --timeout 100 \
  --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last" \
  --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -8; tail -1 $R/ab.log
rm -f $R/ab/*/bench.png; save
for T in new base; do
  [ $SECONDS -gt 400 ] && { echo "skipped probe $T: time"; continue; }
  D=.; [ $T = base ] && D=scratch/base
  timeout $((480 - SECONDS)) env PYTHONPATH=$D:benchmarks/probes:$P python3 \
    benchmarks/probes/backward_filter_kernels.py --out $R/probe --label $T > $R/probe-$T.log 2>&1
  echo "probe $T rc=$? at $SECONDS s"; save
done
cat $R/probe/backward-filter-*.md 2>/dev/null | grep "^|" | cut -c1-200
echo done at $SECONDS
