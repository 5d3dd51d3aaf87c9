#!/bin/bash
# Session 32, call 2. Tree = c20502c (b2f1638: strided_dgrad's phases in one wgmma launch, sub-filters in one pass);
# prev = c36e309. 1. the whole GPU suite; 2. the strided-dgrad probe in both trees; 3. ResNet-50 b128 bf16 captured
# step, both trees and PyTorch; 4. LRN's channels-last GPU test against two mutants (must go red); 5. CaffeNet b256
# TF32 captured vs PyTorch; 6. CaffeNet b256 bf16 layer table; 7. ResNet-50 b128 bf16 layer table, time left.
set -u
END=${END:-540}
R=/tmp/s32c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s32c2.tgz -C /tmp s32c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 220 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -1 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head -20; save
for t in new prev; do
  tree=$PWD; [ $t = prev ] && tree=$H
  timeout 100 env PYTHONPATH=$tree:$PWD/benchmarks/probes:$P python3 \
    benchmarks/probes/strided_dgrad_phases_one_launch.py --out $R/probe-$t > $R/probe-$t.log 2>&1
  echo "probe $t rc=$? at $SECONDS s"; grep -E "^(bf16|tf32)|Error" $R/probe-$t.log | cut -c1-150; save
done
ab() {  # cell, trees...
  local cell=$1 name=${1//:/-} left=$((END - SECONDS)); shift; [ $left -lt 60 ] && return
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py "$@" --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-8 | tail -4
  rm -f $R/ab-$name/*/bench.png; save
}
ab resnet50:128:bf16 --tree new=. --tree prev=$H
for m in forward backward; do
  rm -rf /tmp/mut; mkdir /tmp/mut; cp -r minidnn tests pyproject.toml /tmp/mut/
  sed -i "s/\"lrn_${m}_last\"/\"lrn_${m}\"/" /tmp/mut/minidnn/primitives/lrn.py
  (cd /tmp/mut && timeout 60 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider \
     tests/test_primitives_lrn.py -k channels_last > $R/mutant-$m.log 2>&1; echo "mutant $m rc=$? (want 1)")
  tail -1 $R/mutant-$m.log
done
save
ab caffenet:256:tf32 --tree new=.
layers() {  # model batch
  local left=$((END - SECONDS)); [ $left -lt 40 ] && return
  timeout $((left - 5)) env PYTHONPATH=.:$P python3 benchmarks/bench.py --models $1 --batch $2 \
    --precision bf16 --engines minidnn,torch --layers-only --channels-last --torch-channels-last --layer-repeats 5 \
    --out $R/layers-bf16-$1-$2 > $R/layers-bf16-$1.log 2>&1
  echo "layers $1 rc=$? at $SECONDS s"; save
}
layers caffenet 256
layers resnet50 128
save
