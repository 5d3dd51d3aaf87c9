#!/bin/bash
# 2026-12-06 session 12, call 1, the session's last tree: the whole GPU suite; the augmentation's ready-call test with
# its lookup taken out (a removal check); train.py against the step alone (train_throughput.py).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 290 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/gpu-suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/gpu-suite.log; grep -E "^(FAILED|ERROR)" $R/gpu-suite.log | head; save
cp minidnn/primitives/augment.py /tmp/augment.py
sed -i 's/    ready = _ready.get(key)/    ready = None/' minidnn/primitives/augment.py
timeout 60 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_primitives_augment.py \
  -k test_gpu_repeats_go_through_the_ready_call_with_the_twins_bits > $R/removal.log 2>&1
echo "removal (expect failed) rc=$? at $SECONDS s"; tail -1 $R/removal.log
cp /tmp/augment.py minidnn/primitives/augment.py; save
left=$((470 - SECONDS))
timeout $left env PYTHONPATH=$P:. python3 benchmarks/probes/train_throughput.py --models resnet20 \
  --batch 128 --data shapes10,cifar --modes eager,captured --epochs 3 --timeout 100 --out $R/train-throughput \
  > $R/train-throughput.log 2>&1
echo "throughput rc=$? at $SECONDS s"; grep "^|" $R/train-throughput/train-throughput.md 2>/dev/null; save
echo done at $SECONDS
