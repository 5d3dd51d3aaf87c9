#!/bin/bash
# Session 25, call 1 (carry scratch/pylib, scratch/calls), tree af43428:
# 1. the whole GPU suite (first GPU run of 71729ce, strided_dgrad's review refactor);
# 2. batch norm's channels-last float32 kernels against cuDNN's, per layer (probe);
# 3. ResNet-18's TF32 convolutions per layer-direction against cuDNN (probe).
set -u
R=/tmp/s25c1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s25c1.tgz -C /tmp s25c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 220 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
timeout 120 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/batch_norm_kernels.py --channels-last \
  --dtypes float32 --out $R/bn > $R/bn.log 2>&1
echo "bn rc=$? at $SECONDS s"; grep "^|" $R/bn/batch-norm.md 2>/dev/null || tail -5 $R/bn.log; save
left=$((585 - SECONDS)); [ $left -gt 60 ] && timeout $((left - 15)) env PYTHONPATH=.:$P:benchmarks/probes python3 \
  benchmarks/probes/tf32_channels_last_convolution.py --layers resnet18 --out $R/conv > $R/conv.log 2>&1
echo "conv rc=$? at $SECONDS s"; grep "^|" $R/conv/tf32-conv.md 2>/dev/null | cut -d'|' -f2-4,7-10 || tail -5 $R/conv.log
save
