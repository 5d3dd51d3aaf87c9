#!/bin/bash
# Session 24, call 2 (carry scratch/pylib, scratch/head = 74a163e, scratch/calls), tree a5582c8: gemm_1x1's strided
# 1x1 channels-last calls on gathered/scattered rows. GPU tests of the touched files, the strided 1x1 probe, and
# ResNet-50/18 b128 TF32 channels-last captured against 74a163e with PyTorch beside.
set -u
R=/tmp/s24c; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s24c.tgz -C /tmp s24c; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout 150 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_gemm_1x1.py \
  tests/test_conv_half.py tests/test_conv_strided_dgrad.py tests/test_primitives_conv.py tests/test_cuda_graphs.py \
  tests/test_conv_call_cache.py > $R/touched.log 2>&1
echo "touched rc=$? at $SECONDS s"; tail -2 $R/touched.log; grep -E "^(FAILED|ERROR)" $R/touched.log | head; save
timeout 120 env PYTHONPATH=.:$P python3 benchmarks/probes/strided_1x1_channels_last.py --out $R/strided \
  > $R/strided.log 2>&1
echo "probe rc=$? at $SECONDS s"; grep "^|" $R/strided/strided-1x1.md 2>/dev/null || tail -5 $R/strided.log; save
for cell in resnet50:128:tf32 resnet18:128:tf32; do
  name=${cell//:/-}; left=$((560 - SECONDS)); [ $left -lt 90 ] && break
  timeout $((left - 10)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
