#!/bin/bash
# Session 34, call 2. Tree = main with FORWARD_TMA on at 64 and 128 (the tree call 1's suite ran as /tmp/on) and the
# probe's PIPELINE settings. 1. wgmma_forward_builds.py, bf16 then TF32: base (TMA), base again, the gathers, TMA
# pipelines (4 stages with 1 in flight; 4 stages; 2 stages with 4 CTAs an SM at 64 wide); 2. ab.py one tree against
# PyTorch: ResNet-18 b128 TF32 channels-last captured, as time allows. Run first: the TMA tests (tma_fits reordered).
set -u
R=/tmp/s34c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s34c2.tgz -C /tmp s34c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 60 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_wgmma.py \
  -k "tma" > $R/tma-tests.log 2>&1; echo "tma tests rc=$? at $SECONDS s"; tail -1 $R/tma-tests.log; save
for d in bfloat16 float32; do
  timeout 90 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/wgmma_forward_builds.py \
    --out $R/builds-$d --dtypes $d --variants base again=TMA:1 gather=TMA:0 \
    s4f1=PIPELINE_STAGES:4,PIPELINE_IN_FLIGHT:1 s4=PIPELINE_STAGES:4 s2c4=PIPELINE_STAGES:2,FORWARD_CTAS_PER_SM:4 \
    > $R/builds-$d.log 2>&1
  echo "probe $d rc=$? at $SECONDS s"; grep "^|" $R/builds-$d/wgmma-forward-builds.md | cut -d'|' -f2-11
  save
done
left=$((230 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if [ $left -gt 60 ]; then
  timeout $((left + 15)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree tma=. --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:tf32 --budget-seconds $left \
    --timeout 100 --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last" \
    --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -12; tail -1 $R/ab.log
  rm -f $R/ab/*/bench.png
fi
save; echo done at $SECONDS
