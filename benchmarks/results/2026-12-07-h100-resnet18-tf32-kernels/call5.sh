#!/bin/bash
# Session 25, call 5 (carry scratch/pylib, scratch/calls, scratch/head = 1823688, scratch/base = af43428), tree =
# 1823688 + the TF32 backward-filter on 16-byte copies turned in shared memory (uncommitted):
# 1. the GPU tests of implicit_gemm_wgmma, the shared convolution cases and strided_dgrad;
# 2. the backward-filter kernel alone, TF32 and bf16, this tree against head's, cuDNN beside;
# 3. ResNet-18 b128 TF32 channels-last captured: this tree, head (the forward's three CTAs), base (af43428), PyTorch.
set -u
R=/tmp/s25c5; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s25c5.tgz -C /tmp s25c5; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head; B=$PWD/scratch/base
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_wgmma.py \
  tests/test_primitives_conv.py tests/test_conv_strided_dgrad.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -2 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head; save
for tree in new head; do
  root=.; [ $tree = head ] && root=$H
  (cd $root && timeout 120 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/wgmma_forward_builds.py \
    --out $R/filter-$tree --variants base --dtypes float32,bfloat16 --directions backward_filter > $R/filter-$tree.log 2>&1)
  echo "filter $tree rc=$? at $SECONDS s"; grep "^|" $R/filter-$tree/wgmma-forward-builds.md 2>/dev/null | cut -d'|' -f2-7 || tail -5 $R/filter-$tree.log
  save
done
left=$((585 - SECONDS))
[ $left -gt 100 ] && timeout $((left - 10)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H \
  --tree base=$B --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:tf32 --budget-seconds 200 \
  --timeout 120 --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
  --torch-channels-last" --out $R/ab-r18 > $R/ab-r18.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab-r18/ab.md 2>/dev/null | cut -d'|' -f2-7
rm -f $R/ab-r18/*/bench.png; save
