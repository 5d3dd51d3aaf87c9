#!/bin/bash
# Session 22, one call for everything (carry scratch/pylib, scratch/base, scratch/head, scratch/calls):
# 1. the whole GPU suite on this tree (aacabfe + implicit_gemm_wgmma.cu's K-major pipeline as one helper);
# 2. ResNet-18 b128 TF32 channels-last captured: this tree ("new"), aacabfe ("head", scratch/head: the 256-wide
#    TF32 backward-filter) and 678642e ("base", scratch/base: before it), PyTorch TF32 channels_last beside, each in
#    its own process; bench.json keeps the kernels by name;
# 3. the eager bf16 profile, each (engine, model, mode) in its own process (eager_step_profile.py);
# 4. with the time left, the bf16 wgmma kernel at 128 and 256 wide (wgmma_tile_width.py --bf16).
set -u
R=/tmp/r3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r3.tgz -C /tmp r3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git diff --stat HEAD > $R/tree.txt 2>&1
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; B=$PWD/scratch/base; H=$PWD/scratch/head
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; save
timeout 190 env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=$H --tree new=. --tree base=$B --torch \
  --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:tf32 --budget-seconds 170 --timeout 100 \
  --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
  --torch-channels-last" --out $R/ab-cl > $R/ab-cl.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab-cl/ab.md 2>/dev/null | head -7; rm -f $R/ab-cl/*/bench.png; save
timeout 150 env PYTHONPATH=.:$P python3 benchmarks/probes/eager_step_profile.py --out $R/profile \
  --models caffenet:256,resnet18:128 --engines minidnn --modes bf16+channels_last,bf16 --steps 6 > $R/profile.log 2>&1
echo "profile rc=$? at $SECONDS s"; grep "^|" $R/profile/profile.md 2>/dev/null | head -8; save
left=$((585 - SECONDS))
if [ $left -gt 60 ]; then
  timeout $left env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/wgmma_tile_width.py --out $R/width-bf16 \
    --bf16 > $R/width-bf16.log 2>&1
  echo "width bf16 rc=$? at $SECONDS s"; save
fi
