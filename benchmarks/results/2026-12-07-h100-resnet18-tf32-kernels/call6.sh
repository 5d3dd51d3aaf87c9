#!/bin/bash
# Session 25, call 6 (carry scratch/pylib, scratch/calls, scratch/head = 1823688), tree = 1823688 + the TF32
# backward-filter on 16-byte copies turned in shared memory, one stage of tiles at 128 wide (uncommitted):
# 1. the whole GPU suite;
# 2. the backward-filter kernel alone, TF32 and bf16, this tree against head's, cuDNN beside;
# 3. ResNet-18 and ResNet-50 b128 TF32 channels-last captured: this tree, head, PyTorch.
set -u
R=/tmp/s25c6; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s25c6.tgz -C /tmp s25c6; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout 220 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
for tree in new head; do
  root=.; [ $tree = head ] && root=$H
  (cd $root && timeout 100 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/wgmma_forward_builds.py \
    --out $R/filter-$tree --variants base --dtypes float32 --directions backward_filter > $R/filter-$tree.log 2>&1)
  echo "filter $tree rc=$? at $SECONDS s"; grep "^|" $R/filter-$tree/wgmma-forward-builds.md 2>/dev/null | cut -d'|' -f2,5-7 || tail -5 $R/filter-$tree.log
  save
done
for cell in resnet18:128:tf32 resnet50:128:tf32; do
  name=${cell//:/-}; left=$((590 - SECONDS)); [ $left -lt 90 ] && break
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
