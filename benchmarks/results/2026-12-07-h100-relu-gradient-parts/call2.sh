#!/bin/bash
# Session 27, call 2 (carry scratch/pylib, scratch/calls, scratch/head = 31bd865). Tree = 36cf7fa's fused ReLU
# backward of two gradient parts + the TF32 backward-filter on 128-wide tiles.
# 1. the whole GPU suite; 2. ResNet-18 b128 TF32 captured, this tree against head, PyTorch beside; 3. batch norm's
# float32 launch-constant sweep (mended); 4. ResNet-50 b128 TF32 and ResNet-18 b128 bf16 as 2, while time is left;
# (between 3 and 4) the lines of minidnn that copy or fill arrays in an eager ResNet-18 TF32 step (copy_sites.py).
set -u
END=${END:-570}
R=/tmp/s27c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s27c2.tgz -C /tmp s27c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/head
timeout 230 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
for cell in resnet18:128:tf32 bn copies resnet50:128:tf32 resnet18:128:bf16; do
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
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree head=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
