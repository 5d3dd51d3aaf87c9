#!/bin/bash
# 2026-12-07 session 20, call A, short (carry scratch/pylib, scratch/base, scratch/calls): the TF32 backward-filter on 4-byte
# cp.async copies. The GPU tests of winograd, wgmma and nhwc (winograd.cu's constant tables and implicit_gemm_wgmma changed); the wgmma
# kernels alone per layer, base's (56e96ff: the register round trip) and this tree's at four pipelines
# (wgmma_pipeline_depth.py --tf32); ResNet-18 b128 TF32 channels-last captured, base and this tree, PyTorch TF32
# channels_last beside (ab.py, one round).
set -u
R=/tmp/r4; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r4.tgz -C /tmp r4; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%h > $R/tree.txt 2>/dev/null; git status --short | grep -v "^??" | head -12 >> $R/tree.txt
P=$PWD/scratch/pylib; B=$PWD/scratch/base
export PYTHONUNBUFFERED=1
timeout 150 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_winograd.py tests/test_conv_wgmma.py tests/test_conv_nhwc.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -3 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -20; save
timeout 70 env PYTHONPATH=$B:$P python3 $B/benchmarks/probes/wgmma_pipeline_depth.py --tf32 \
  --out $R/pipeline --builds current --label base > $R/pipeline-base.log 2>&1
echo "pipeline base rc=$? at $SECONDS s"; tail -2 $R/pipeline-base.log; save
timeout 90 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/wgmma_pipeline_depth.py --tf32 \
  --out $R/pipeline --builds 3,0 --label new > $R/pipeline-new.log 2>&1
echo "pipeline new rc=$? at $SECONDS s"; tail -2 $R/pipeline-new.log; save
left=$((340 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
[ $left -gt 60 ] && timeout $((left + 15)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=$B --tree new=. \
  --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:tf32 --budget-seconds $left \
  --timeout 100 --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
  --torch-channels-last" --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -6; tail -1 $R/ab.log
rm -f $R/ab/*/bench.png; save; echo done at $SECONDS
