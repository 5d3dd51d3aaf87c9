#!/bin/bash
# Session 27, call 4 (call 3 had no machine) (carry scratch/pylib, scratch/calls, scratch/prev = c3a0875, the tree before the padded copy's
# kernel). Tree = HEAD: the fused ReLU backward of two parts, the TF32 backward-filter on 128-wide tiles, and
# layout.cu's pad_channels_last. 1. the whole GPU suite; 2. ResNet-18 b128 TF32, captured, this tree against
# prev, PyTorch beside.
set -u
END=${END:-570}
R=/tmp/s27c4; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s27c4.tgz -C /tmp s27c4; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 170 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
for cell in resnet18:128:tf32; do
  if [ $cell = copies ]; then
    left=$((END - SECONDS)); [ $left -gt 30 ] && timeout $((left < 65 ? left - 5 : 60)) env PYTHONPATH=.:$P \
      python3 scratch/calls/copy_sites.py $R/copy-sites.txt > $R/copy-sites.log 2>&1
    echo "copy sites rc=$? at $SECONDS s"; head -25 $R/copy-sites.txt 2>/dev/null | cut -c1-160; save
    continue
  fi
  if [ $cell = bn ]; then
    left=$((END - SECONDS)); [ $left -gt 40 ] && timeout $((left < 75 ? left - 5 : 70)) env PYTHONPATH=.:$P:benchmarks/probes \
      python3 benchmarks/probes/batch_norm_rows_sweep.py --out $R/bn-sweep --dtype float32 > $R/bn-sweep.log 2>&1
    echo "bn sweep rc=$? at $SECONDS s"; grep "^|" $R/bn-sweep/batch-norm-rows.md 2>/dev/null | cut -c1-250; save
    continue
  fi
  name=${cell//:/-}; left=$((END - SECONDS)); [ $left -lt 100 ] && break
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree prev=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
