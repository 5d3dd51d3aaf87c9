#!/bin/bash
# Session 31, call 2. Tree = 0806d09 (bench: PyTorch's layer gradients as autograd runs them) + the batch norm patch
# (ReLU mask from x; the sums now split as the y path's) + LRN's channels-last kernels (one thread an element, its
# window summed directly). prev = 0806d09. Carry scratch/pylib, scratch/calls, scratch/prev.
# 1. the GPU tests of batch norm, LRN and the bench; 2. captured channels-last CaffeNet b256 bf16 (LRN);
# 3. the bf16 per-layer tables of ResNet-50 b128 (cuDNN's gradients as autograd asks); 4. ResNet-18 b128 TF32 and
# CaffeNet b256 TF32 captured steps; 5. CaffeNet's bf16 layer table, where time is left.
set -u
END=${END:-390}
R=/tmp/s31c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s31c2.tgz -C /tmp s31c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 120 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_primitives_batchnorm.py \
  tests/test_primitives_lrn.py tests/test_bench.py tests/test_functional.py tests/test_nn.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -20; save
ab() {  # cell
  local cell=$1 name=${1//:/-} left=$((END - SECONDS)); [ $left -lt 70 ] && return
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree prev=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
}
layers() {  # model batch
  local left=$((END - SECONDS)); [ $left -lt 60 ] && return
  timeout $((left - 5)) env PYTHONPATH=.:$P python3 benchmarks/bench.py --models $1 --batch $2 \
    --precision bf16 --engines minidnn,torch --layers-only --channels-last --torch-channels-last --layer-repeats 5 \
    --out $R/layers-bf16-$1-$2 > $R/layers-bf16-$1.log 2>&1
  echo "layers $1 rc=$? at $SECONDS s"; tail -1 $R/layers-bf16-$1.log
  grep "^| bf16" $R/layers-bf16-$1-$2/bench.md 2>/dev/null | cut -c1-220; save
}
ab caffenet:256:bf16
layers resnet50 128
ab resnet18:128:tf32
ab caffenet:256:tf32
layers caffenet 256
