#!/bin/bash
# Session 28, call 2. Tree = 4a9a53f: max pooling's backward of two gradient parts (pooling.cu's *_sum kernels) and
# strided_dgrad's turned sub-filters read from w's strided slices (layout.cu's filter_to_channels_last at strides),
# neither yet run on a GPU. prev = 0ec2047 (call 1's tree; git archive of minidnn models train.py benchmarks).
# Carry scratch/pylib, scratch/calls, scratch/prev. 1. the whole GPU suite; 2. captured channels-last steps:
# ResNet-18 b128 TF32 (this tree, prev, PyTorch), ResNet-50 b128 bf16 (this tree, PyTorch: call 1's PyTorch run
# ran out of time), ResNet-18 b128 bf16 (this tree, prev, PyTorch).
set -u
END=${END:-585}
R=/tmp/s28c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s28c2.tgz -C /tmp s28c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
for cell in resnet18:128:tf32 resnet50:128:bf16 resnet18:128:bf16; do
  name=${cell//:/-}; left=$((END - SECONDS)); [ $left -lt 105 ] && break
  trees="--tree new=. --tree prev=$H"; [ $cell = resnet50:128:bf16 ] && trees="--tree new=."
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py $trees --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
