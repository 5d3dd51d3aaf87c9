#!/bin/bash
# Session 29, call 2. Tree = 0cfa12a: batch norm's channels-last reductions in one wave of the blocks the GPU holds at
# once, at least 8 passes a split (not yet run on a GPU). prev = 1626d99 (git archive of minidnn models train.py
# benchmarks). Carry scratch/pylib, scratch/calls, scratch/prev, scratch/s29. 1. the whole GPU suite; 2. the
# reductions per kernel under the old rule and the new one (scratch/s29/bn_rule.py); 3. captured channels-last steps:
# ResNet-18 b128 bf16 and TF32 (this tree, prev, PyTorch), where time is left.
set -u
END=${END:-560}
R=/tmp/s29c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s29c2.tgz -C /tmp s29c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 220 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
timeout 150 env PYTHONPATH=.:$P python3 scratch/s29/bn_rule.py $R/bn-rule.json > $R/bn-rule.log 2>&1
echo "bn-rule rc=$? at $SECONDS s"; tail -2 $R/bn-rule.log | cut -c1-400; save
for cell in resnet18:128:bf16 resnet18:128:tf32; do
  name=${cell//:/-}; left=$((END - SECONDS)); [ $left -lt 105 ] && break
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree prev=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
