#!/bin/bash
# Session 24, call 3 (carry scratch/pylib, scratch/head = git archive of a5582c8, scratch/calls), tree 3dc27f1 + b4fa9e5's compile test:
# strided_dgrad's channels-last phases on implicit_gemm_wgmma, written in place. The whole GPU suite; the strided
# 3x3 layers' backward-data probe; ResNet-50 and ResNet-18 b128 TF32 and ResNet-50 bf16 channels-last captured,
# this tree against a5582c8 (the tree before the phases), PyTorch beside.
set -u
R=/tmp/s24c; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s24c.tgz -C /tmp s24c; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head -20; save
timeout 120 env PYTHONPATH=.:$P python3 benchmarks/probes/strided_1x1_channels_last.py --layers 3x3 \
  --out $R/strided-3x3 > $R/strided-3x3.log 2>&1
echo "probe rc=$? at $SECONDS s"; grep "^|" $R/strided-3x3/strided-3x3.md 2>/dev/null || tail -5 $R/strided-3x3.log; save
for cell in resnet50:128:tf32 resnet18:128:tf32 resnet50:128:bf16; do
  name=${cell//:/-}; left=$((560 - SECONDS)); [ $left -lt 100 ] && break
  timeout $((left - 10)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
