#!/bin/bash
# 2026-12-04 (session 2) call 2: batch norm's chained sums (842e1c0) and 8-byte packs (working tree);
# scratch/head = 9791c47 (before both), scratch/chains = 842e1c0 (the chains alone).
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P
echo "== tests"; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_primitives_batchnorm.py tests/test_autocast.py tests/test_primitives_convert.py > $R/tests-batchnorm.log 2>&1; echo rc=$? >> $R/tests-batchnorm.log; save
for T in head chains new; do
  if [ $T = new ]; then ROOT=.; else ROOT=scratch/$T; fi
  echo "== probe $T"; timeout 120 env PYTHONPATH=$ROOT:$P:benchmarks/probes python3 benchmarks/probes/batch_norm_kernels.py --out $R/probe-$T > $R/probe-$T.log 2>&1; echo rc=$? >> $R/probe-$T.log; save
done
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16"
echo "== bench r18 head"; timeout 90 env PYTHONPATH=$P python3 scratch/head/benchmarks/bench.py $B --models resnet18 --batch 128 --engines minidnn-graph --out $R/resnet18-head > $R/bench-resnet18-head.log 2>&1; echo rc=$? >> $R/bench-resnet18-head.log; save
for E in minidnn-graph minidnn torch; do
  echo "== bench r18 $E"; timeout 90 python3 benchmarks/bench.py $B --models resnet18 --batch 128 --engines $E --out $R/resnet18-$E > $R/bench-resnet18-$E.log 2>&1; echo rc=$? >> $R/bench-resnet18-$E.log; save
done
for E in minidnn-graph torch; do
  echo "== bench r50 $E"; timeout 150 python3 benchmarks/bench.py $B --models resnet50 --batch 128 --engines $E --out $R/resnet50-$E > $R/bench-resnet50-$E.log 2>&1; echo rc=$? >> $R/bench-resnet50-$E.log; save
done
