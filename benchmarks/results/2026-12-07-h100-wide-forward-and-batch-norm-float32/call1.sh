#!/bin/bash
# Session 26, call 1 (carry scratch/pylib, scratch/calls, scratch/head = 2fa13f9): tree = 2fa13f9 +
# scratch/wgmma-wide-forward.patch (forward's 256-row CTAs where they fill two waves) + batchnorm.cu's experiment
# macros FLOAT_SUMS and FLOAT_MATH (undefined: the same code) + batch_norm_rows_sweep.py's --dtype.
# END (seconds): the steps that would not finish by then are skipped.
# 1. the whole GPU suite (covers 01fcf50's review and the wide build's tests);
# 2. the forward kernel alone at 128 and 256 rows a CTA, TF32 and bf16, forward and backward-data;
# 3. batch norm's float32 channels-last kernels with float sums and float math (scratch/calls/bn_variants.py);
# 4. batch norm's channels-last launch constants in float32 (batch_norm_rows_sweep.py --dtype float32);
# 5. the TF32 backward-filter at 128 and 256 wide on the 256- and 512-filter layers;
# 6. ResNet-18 b128 TF32 captured channels-last, this tree against head, PyTorch beside, if time is left.
set -u
END=${END:-590}
R=/tmp/s26c1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s26c1.tgz -C /tmp s26c1; }
fits() { [ $((SECONDS + $1)) -le $END ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout $((END - 10)) env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
fits 100 && timeout $((END - SECONDS < 170 ? END - SECONDS : 170)) env PYTHONPATH=.:$P:benchmarks/probes \
  python3 benchmarks/probes/wgmma_forward_builds.py --out $R/rows \
  --variants rows128=TILE_ROWS:128 rows256=TILE_ROWS:256 > $R/rows.log 2>&1
echo "rows rc=$? at $SECONDS s"; grep "^|" $R/rows/wgmma-forward-builds.md 2>/dev/null | cut -d'|' -f2-8 || tail -5 $R/rows.log
save
fits 60 && timeout 80 env PYTHONPATH=.:$P python3 scratch/calls/bn_variants.py $R/bn.json > $R/bn.log 2>&1
echo "bn rc=$? at $SECONDS s"; cut -c1-400 $R/bn.log | tail -12; save
fits 60 && timeout 80 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/batch_norm_rows_sweep.py \
  --out $R/bn-sweep --dtype float32 > $R/bn-sweep.log 2>&1
echo "bn sweep rc=$? at $SECONDS s"; grep "^|" $R/bn-sweep/batch-norm-rows.md 2>/dev/null | tail -3 || tail -3 $R/bn-sweep.log
save
fits 70 && timeout 90 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/wgmma_forward_builds.py \
  --out $R/filter --directions backward_filter --dtypes float32 --layers layer3,layer4 \
  --variants w128=FILTER_WIDTH:128 w256=FILTER_WIDTH:256 > $R/filter.log 2>&1
echo "filter rc=$? at $SECONDS s"; grep "^|" $R/filter/wgmma-forward-builds.md 2>/dev/null | cut -d'|' -f2-8 || tail -5 $R/filter.log
save
for cell in resnet18:128:tf32; do
  name=${cell//:/-}; left=$((END - SECONDS)); [ $left -lt 110 ] && break
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
