#!/bin/bash
# 2026-12-04 (session 2) call 1: the committed tree 9791c47: pooling GPU tests, eager profile, steps.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P
echo "== pooling tests"; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_primitives_pooling.py tests/test_autocast.py -k "pool" > $R/tests-pooling.log 2>&1; echo rc=$? >> $R/tests-pooling.log; save
echo "== profile"; timeout 150 python3 benchmarks/probes/eager_step_profile.py --out $R/profile --models resnet18:128 --modes bf16 --steps 10 > $R/profile.log 2>&1; echo rc=$? >> $R/profile.log; save
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16"
for M in "resnet18 128" "caffenet 256"; do set -- $M
  for E in minidnn-graph minidnn torch; do
    echo "== bench $1 $E"; timeout 90 python3 benchmarks/bench.py $B --models $1 --batch $2 --engines $E --out $R/$1-$E > $R/bench-$1-$E.log 2>&1; echo rc=$? >> $R/bench-$1-$E.log; save
  done
done
