#!/bin/bash
# 2026-12-06 session 14, call 1 (carry scratch/pylib and this script): issue 24's bf16 cells on the current tree
# (9a8d69d), where the GPU time goes against PyTorch AMP: profiled eager steps of ResNet-18 and ResNet-50 b128
# bf16 channels-last, minidnn and PyTorch, each in its own process; then the captured cells against PyTorch AMP.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%h > $R/tree.txt 2>/dev/null; git status --short | head -5 >> $R/tree.txt
export PYTHONPATH=.:$PWD/scratch/pylib PYTHONUNBUFFERED=1
prof() { timeout $3 python3 benchmarks/probes/eager_step_profile.py --out $R/profile-$1-$2 --models $2:128 \
  --modes bf16+channels_last --engines $1 --steps 5 > $R/profile-$1-$2.log 2>&1
  echo "profile $1 $2 rc=$? at $SECONDS s"; grep -A3 "^| engine" $R/profile-$1-$2/profile.md | head -4; save; }
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16"
bench() { if [ $SECONDS -gt $4 ]; then echo "skipped $1 $2 $3: time"; return; fi
  timeout 110 python3 benchmarks/bench.py $B --models $1 --batch $2 --engines $3 ${5:-} --out $R/$1-$3 \
    > $R/bench-$1-$3.log 2>&1; echo "bench $1 $3 rc=$? at $SECONDS s"; grep "^|" $R/$1-$3/bench.md | head -4; save; }
prof torch resnet18 100
prof torch resnet50 100
prof minidnn resnet18 150
bench resnet18 128 minidnn-graph 400 --channels-last
bench resnet18 128 torch 420
[ $SECONDS -lt 330 ] && prof minidnn resnet50 $((540 - SECONDS - 60))
bench resnet50 128 minidnn-graph 450 --channels-last
bench resnet50 128 torch 480
bench caffenet 256 minidnn-graph 500
bench caffenet 256 torch 530
rm -f $R/*/bench.png; save
echo done at $SECONDS
