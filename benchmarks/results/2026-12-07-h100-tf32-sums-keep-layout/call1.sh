#!/bin/bash
# Prepared in session 22 for the next GPU call (carry scratch/pylib, scratch/head, scratch/calls; scratch/head must
# hold aacabfe's archive: CuPy's C-contiguous gradient sums, ReLU's channels-last calls not kept):
# 1. the whole GPU suite on this tree (f158c9b's layout.add and 240756e's kept channels-last ReLU calls have not run
#    on a GPU);
# 2. ResNet-18 and ResNet-50 b128 TF32 channels-last captured, this tree against aacabfe, PyTorch beside, each in its
#    own process (bench.md sums the kernels by kind for "new"; bench.json's conv_plans names each call's plan);
# 3. the eager bf16 ResNet-18 profile, each mode in its own process (the ReLU calls' host time).
set -u
R=/tmp/s23; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s23.tgz -C /tmp s23; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
for model in resnet18 resnet50; do
  timeout 220 env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $model:128:tf32 --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$model > $R/ab-$model.log 2>&1
  echo "ab $model rc=$? at $SECONDS s"; grep "^|" $R/ab-$model/ab.md 2>/dev/null | tail -3
  rm -f $R/ab-$model/*/bench.png; save
done
left=$((585 - SECONDS))
[ $left -gt 60 ] && timeout $left env PYTHONPATH=.:$P python3 benchmarks/probes/eager_step_profile.py --out $R/profile \
  --models resnet18:128 --engines minidnn,torch --modes bf16+channels_last,bf16 --steps 6 > $R/profile.log 2>&1
echo "profile rc=$? at $SECONDS s"; grep "^|" $R/profile/profile.md 2>/dev/null | head -6; save
