#!/bin/bash
# 2026-12-04 (session 2) call 4: the whole GPU suite on the final tree, then ResNet-18 b128 bf16 steps:
# eager on scratch/head (9791c47, the session's start), scratch/prev (98c5d54: batch norm, imports) and the
# working tree (+ the float32 weight gradient), captured on prev and the working tree, PyTorch AMP.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P
echo "== suite"; timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log; save
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
for T in head prev; do
  echo "== eager $T"; timeout 60 env PYTHONPATH=$P python3 scratch/$T/benchmarks/bench.py $B --engines minidnn --out $R/eager-$T > $R/bench-eager-$T.log 2>&1; echo rc=$? >> $R/bench-eager-$T.log; save
done
echo "== eager new"; timeout 60 python3 benchmarks/bench.py $B --engines minidnn --out $R/eager-new > $R/bench-eager-new.log 2>&1; echo rc=$? >> $R/bench-eager-new.log; save
echo "== captured new"; timeout 60 python3 benchmarks/bench.py $B --engines minidnn-graph --out $R/captured-new > $R/bench-captured-new.log 2>&1; echo rc=$? >> $R/bench-captured-new.log; save
echo "== captured prev"; timeout 60 env PYTHONPATH=$P python3 scratch/prev/benchmarks/bench.py $B --engines minidnn-graph --out $R/captured-prev > $R/bench-captured-prev.log 2>&1; echo rc=$? >> $R/bench-captured-prev.log; save
echo "== torch"; timeout 60 python3 benchmarks/bench.py $B --engines torch --out $R/torch > $R/bench-torch.log 2>&1; echo rc=$? >> $R/bench-torch.log; save
