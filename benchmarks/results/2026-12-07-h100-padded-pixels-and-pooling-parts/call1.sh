#!/bin/bash
# Session 28, call 1 (prepared in session 27). Tree = 0ec2047: layout.cu's pad_pixels (a first layer's padded pixel
# one 16-byte vector) and session 27's review commit 632e279, neither yet run on a GPU. prev = 4923b6c (git archive
# of minidnn models train.py benchmarks). Carry scratch/pylib, scratch/calls, scratch/prev.
# 1. the whole GPU suite; 2. ResNet-18 b128 TF32 and bf16 and ResNet-50 b128 bf16, captured channels-last, this tree
# against prev, PyTorch beside (the profile's pad_pixels_* against pad_channels_last_* kernels; the bf16 steps with
# session 27's fused ReLU sum, not timed then).
set -u
END=${END:-570}
R=/tmp/s28c1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s28c1.tgz -C /tmp s28c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
for cell in resnet18:128:tf32 resnet18:128:bf16 resnet50:128:bf16; do
  name=${cell//:/-}; left=$((END - SECONDS)); [ $left -lt 110 ] && break
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree prev=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
