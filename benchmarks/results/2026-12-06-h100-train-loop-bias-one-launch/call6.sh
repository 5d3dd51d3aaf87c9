#!/bin/bash
# 2026-12-06 session 10, call 6, the session's last tree: the GPU tests of the files changed since call 4 (loader, train,
# augment), then train.py against the step alone (train_throughput.py) and the eager loop part by part.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 130 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_data_loader.py \
  tests/test_train.py tests/test_train_faults.py tests/test_primitives_augment.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -2 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head; save
timeout 200 env PYTHONPATH=$P:. python3 benchmarks/probes/train_throughput.py --models resnet20 \
  --batch 128 --data shapes10,cifar --modes eager,captured --epochs 3 --timeout 100 --out $R/train-throughput \
  > $R/train-throughput.log 2>&1
echo "throughput rc=$? at $SECONDS s"; grep "^|" $R/train-throughput/train-throughput.md 2>/dev/null; save
left=$((440 - SECONDS))
if [ $left -gt 60 ]; then
timeout $left env PYTHONPATH=.:$P python3 benchmarks/probes/train_loop_host.py --data shapes10,cifar \
  --out $R/train-loop-host > $R/train-loop-host.log 2>&1
echo "loop rc=$? at $SECONDS s"; grep "^|" $R/train-loop-host/train-loop-host.md 2>/dev/null
fi
save
echo done at $SECONDS
