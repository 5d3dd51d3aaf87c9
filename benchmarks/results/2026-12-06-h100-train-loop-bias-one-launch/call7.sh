#!/bin/bash
# 2026-12-06 session 10, call 7, the session's last tree (45481d7): the whole GPU suite, then train.py against the step
# alone once more on another fresh machine (train_throughput.py), to try call 6's figures again.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 270 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/gpu-suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/gpu-suite.log; grep -E "^(FAILED|ERROR)" $R/gpu-suite.log | head; save
left=$((370 - SECONDS))
timeout $left env PYTHONPATH=$P:. python3 benchmarks/probes/train_throughput.py --models resnet20 \
  --batch 128 --data shapes10,cifar --modes eager,captured --epochs 3 --timeout 100 --out $R/train-throughput \
  > $R/train-throughput.log 2>&1
echo "throughput rc=$? at $SECONDS s"; grep "^|" $R/train-throughput/train-throughput.md 2>/dev/null
save
echo done at $SECONDS
