#!/bin/bash
# 2026-12-06 session 15, call 1 (carry scratch/pylib, scratch/base, this script): the whole GPU suite on the tree with
# wgmma's backward-filter split at 4 CTAs per SM; two GPU removal checks of the pixel walk (column carry) and of the
# finish's (K, R, S, C) read; ResNet-18 b128 bf16 captured channels-last, base (6e05c55, split 8) against the change,
# PyTorch AMP beside (ab.py, one round); our NCHW bf16 cell beside, for --amp bf16's default layout.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%h > $R/tree.txt 2>/dev/null; git status --short | grep -v "^??" | head -5 >> $R/tree.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 300 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/gpu-suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/gpu-suite.log; grep -E "^(FAILED|ERROR)" $R/gpu-suite.log | head; save
broken() { # $1 name, $2 file, $3 sed expression: the backward-filter GPU tests with one line broken, then restored
  cp $2 /tmp/orig; sed -i "$3" $2; cmp -s $2 /tmp/orig && { echo "removal $1: sed changed nothing"; return; }
  timeout 90 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "backward_filter" \
    tests/test_conv_wgmma.py tests/test_conv_nhwc.py > $R/removal-$1.log 2>&1
  echo "removal $1 rc=$? at $SECONDS s (expected 1)"; tail -1 $R/removal-$1.log; cp /tmp/orig $2; save; }
broken column-carry minidnn/primitives/conv/channels_last.cuh 's/q\[i\] -= column_carry ? s.Q : 0;/q[i] -= 0;/'
broken finish-layout minidnn/primitives/conv/implicit_gemm_nhwc.cu 's/sums\[(k \* RS + rs) \* C + c\]/sums[(k * C + c) * RS + rs]/'
git diff --stat | tail -1 > $R/restored.txt
left=$((390 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
[ $left -gt 60 ] && timeout $((left + 20)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base \
  --tree new=. --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:bf16 --budget-seconds $left \
  --timeout 100 --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last" \
  --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -8; tail -1 $R/ab.log
rm -f $R/ab/*/bench.png; save
if [ $SECONDS -lt 400 ]; then
  timeout 50 env PYTHONPATH=.:$P taskset -c 0-3 python3 benchmarks/bench.py --no-layers --no-agreement --warmup 2 \
    --steps 10 --profile-steps 1 --precision bf16 --models resnet18 --batch 128 --engines minidnn-graph \
    --out $R/r18-bf16-nchw > $R/r18-bf16-nchw.log 2>&1
  echo "nchw rc=$? at $SECONDS s"; grep -h "^| minidnn" $R/r18-bf16-nchw/bench.md | cut -c1-160
fi
rm -f $R/*/bench.png; save
echo done at $SECONDS
