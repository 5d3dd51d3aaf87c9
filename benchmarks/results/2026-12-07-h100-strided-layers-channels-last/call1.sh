#!/bin/bash
# Session 24, call 1 (carry scratch/pylib, scratch/head = git archive of 74a163e, scratch/calls), tree 71cc2e2:
# 1. the whole GPU suite (first GPU run of 4f0f103, 4957733, 5e3c634/1dddf8a, 111b7f9 and 71cc2e2's strided gemm_1x1);
# 2. the strided 1x1 channels-last layers, every algorithm against cuDNN (probe);
# 3. ResNet-50 and ResNet-18 b128 TF32 channels-last captured, this tree against 74a163e, PyTorch beside.
set -u
R=/tmp/s24c; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s24c.tgz -C /tmp s24c; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
timeout 150 env PYTHONPATH=.:$P python3 benchmarks/probes/strided_1x1_channels_last.py --out $R/strided \
  > $R/strided.log 2>&1
echo "probe rc=$? at $SECONDS s"; grep "^|" $R/strided/strided-1x1.md 2>/dev/null || tail -5 $R/strided.log; save
for cell in resnet50:128:tf32 resnet18:128:tf32; do
  name=${cell//:/-}; left=$((585 - SECONDS)); [ $left -lt 90 ] && break
  timeout $((left - 10)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
