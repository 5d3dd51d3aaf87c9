#!/bin/bash
# Session 31, call 1. Tree = 2693dca + scratch/bn-relu-mask-from-x.patch (was 4639a28: batch norm's ReLU mask
# recomputed from x) + scratch/lrn-channels-last.patch (LRN's kernels on channels-last operands; CaffeNet has no
# batch norm, ResNet no LRN, so each model's step isolates one patch). 1e6ec1e, 44cdedc, 5a34779: never GPU-run. prev = 2693dca (main, tests included). Carry scratch/pylib, scratch/calls,
# scratch/s30, scratch/prev. 1. the whole GPU suite; 2. batch norm's channels-last backward per layer: plain, with
# relu_output, with the mask from x (scratch/s30/bn_relu_reads.py, now benchmarks/probes/batch_norm_relu_mask.py); 3. captured channels-last ResNet-18 b128 steps,
# TF32 and bf16, CaffeNet b256 bf16 (this tree, prev, PyTorch); 4. the bf16 per-layer tables (ResNet-50 b128, CaffeNet b256) where time
# is left.
set -u
END=${END:-560}
R=/tmp/s31c1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s31c1.tgz -C /tmp s31c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%H > $R/commit.txt 2>/dev/null; git status --short > $R/status.txt 2>/dev/null
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 230 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head -20; save
failed=$(grep -E "^(FAILED|ERROR) " $R/suite.log | awk '{print $2}' | head -40)
if [ -n "$failed" ]; then  # the same tests on main: did the patch break them?
  (cd $H && timeout 90 env PYTHONPATH=.:$P python3 -m pytest -q -p no:cacheprovider -n 8 $failed > $R/suite-prev.log 2>&1)
  echo "prev rc=$? at $SECONDS s"; tail -2 $R/suite-prev.log; save
fi
timeout 80 env PYTHONPATH=.:$P python3 scratch/s30/bn_relu_reads.py $R/bn-relu-reads.json > $R/bn-relu-reads.log 2>&1
echo "bn rc=$? at $SECONDS s"; tail -20 $R/bn-relu-reads.log; save
for cell in resnet18:128:tf32 resnet18:128:bf16 caffenet:256:bf16; do
  name=${cell//:/-}; left=$((END - SECONDS)); [ $left -lt 100 ] && break
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree prev=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
for cell in resnet50:128 caffenet:256; do
  model=${cell%:*}; batch=${cell#*:}; left=$((END - SECONDS)); [ $left -lt 70 ] && break
  timeout $((left - 5)) env PYTHONPATH=.:$P python3 benchmarks/bench.py --models $model --batch $batch \
    --precision bf16 --engines minidnn,torch --layers-only --channels-last --torch-channels-last --layer-repeats 5 \
    --out $R/layers-bf16-$model-$batch > $R/layers-bf16-$model.log 2>&1
  echo "layers $model rc=$? at $SECONDS s"; tail -2 $R/layers-bf16-$model.log
  grep "^| bf16" $R/layers-bf16-$model-$batch/bench.md 2>/dev/null | cut -c1-220; save
done
