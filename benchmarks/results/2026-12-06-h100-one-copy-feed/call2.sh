#!/bin/bash
# 2026-12-06 session 11, call 2: the one-copy slots and the gather into them: GPU tests of the loader, train.py and the
# augmentation, then the eager loop part by part (train_loop_host.py --next-parts) on 2f8e35e's tree (scratch/base) and
# on the new one, alternating, in one machine.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 120 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_data_loader.py \
  tests/test_train.py tests/test_primitives_augment.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -2 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head; save
for round in 1 2; do
  for tree in base new; do
    left=$((400 - SECONDS)); [ $left -lt 40 ] && break
    if [ $tree = base ]; then root=scratch/base; else root=.; fi
    timeout $left env PYTHONPATH=$root:$P python3 $root/benchmarks/probes/train_loop_host.py --data shapes10,cifar \
      --epochs 3 --next-parts --out $R/loop-$tree-$round > $R/loop-$tree-$round.log 2>&1
    echo "loop $tree $round rc=$? at $SECONDS s"; grep "^|" $R/loop-$tree-$round/train-loop-host.md 2>/dev/null | grep -v "epoch 1"
    save
  done
done
echo done at $SECONDS
