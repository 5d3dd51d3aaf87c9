#!/bin/bash
# Session 23, call 3 (carry scratch/pylib, scratch/head = a325d0f's archive, scratch/calls):
# 1. the whole GPU suite on this tree (call 2 failed float16: a cast, not a bit copy, into the workspace; now forward and backward-filter of one group's C padded to the vector:
#    padded_problem, layout.to_channels_last_padded; the first layer's 3 colour channels on implicit_gemm_wgmma);
# 2. ResNet-18 and ResNet-50 b128 TF32 channels-last captured, this tree against a325d0f, PyTorch beside;
# 2b. the first layer's TF32 calls alone (tf32_channels_last_convolution.py --layers conv1_7x7);
# 3. ResNet-18 b128 bf16 channels-last captured, the same trees (the half first layer padded to 8).
set -u
R=/tmp/s23c; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s23c.tgz -C /tmp s23c; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
timeout 120 env PYTHONPATH=.:$P python3 benchmarks/probes/tf32_channels_last_convolution.py --out $R/stem \
  --layers conv1_7x7 > $R/stem.log 2>&1
echo "stem rc=$? at $SECONDS s"; grep "^|" $R/stem/tf32-conv.md 2>/dev/null; save
for cell in resnet18:128:tf32 resnet18:128:bf16 resnet50:128:tf32; do
  name=${cell//:/-}; left=$((585 - SECONDS)); [ $left -lt 100 ] && break
  timeout $((left - 10)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
