#!/bin/bash
# Session 31, call 3 (the final GPU run). Tree = 0806d09 + batch norm's ReLU mask from x (the sums split as the y
# path's; products, differences and dx rounded as written) + LRN's channels-last kernels. prev = 0806d09.
# Carry scratch/pylib, scratch/calls, scratch/prev. 1. the whole GPU suite; 2. captured channels-last ResNet-18 b128
# TF32 and bf16 (this tree, prev, PyTorch); 3. CaffeNet b256 bf16 layer table (cuDNN's gradients as autograd asks);
# 4. CaffeNet b256 TF32 captured, where time is left.
set -u
END=${END:-300}
R=/tmp/s31c3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s31c3.tgz -C /tmp s31c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 150 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -1 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head -20; save
ab() {  # cell
  local cell=$1 name=${1//:/-} left=$((END - SECONDS)); [ $left -lt 60 ] && return
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree prev=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
}
ab resnet18:128:tf32
ab resnet18:128:bf16
left=$((END - SECONDS))
if [ $left -gt 50 ]; then
  timeout $((left - 5)) env PYTHONPATH=.:$P python3 benchmarks/bench.py --models caffenet --batch 256 \
    --precision bf16 --engines minidnn,torch --layers-only --channels-last --torch-channels-last --layer-repeats 5 \
    --out $R/layers-bf16-caffenet-256 > $R/layers-bf16-caffenet.log 2>&1
  echo "layers rc=$? at $SECONDS s"; grep "^| bf16" $R/layers-bf16-caffenet-256/bench.md 2>/dev/null | cut -c1-200; save
fi
ab caffenet:256:tf32
