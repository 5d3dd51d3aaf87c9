#!/bin/bash
# 2026-12-06 session 10, call 3: after the meter's lighter step and the augmentation's ready call: (1) their GPU tests
# and a removal check of the bias gradient's counter reset; (2) train.py against the step alone again (ResNet-20 b128,
# shapes10 and CIFAR, eager and captured, train_throughput.py); (3) the eager loop part by part (train_loop_host.py).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 120 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_primitives_augment.py \
  tests/test_train.py tests/test_data_loader.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -2 $R/tests.log
# Removal: the last block's counter reset taken out; the one-launch bias test must go red.
rm -rf /tmp/rm && mkdir -p /tmp/rm && cp -r minidnn tests pyproject.toml /tmp/rm/ 2>/dev/null
sed -i 's/            \*counter = 0;     \/\/ every block/            \/\/ removed: *counter = 0;/' /tmp/rm/minidnn/primitives/channels.cuh
grep -c "removed: \*counter" /tmp/rm/minidnn/primitives/channels.cuh > $R/removal.txt
(cd /tmp/rm && CUPY_CACHE_DIR=/tmp/rm-cache timeout 100 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_primitives_linear.py -k "one_launch" > $R/removal-bias-counter-reset.log 2>&1; echo "removal rc=$?" >> $R/removal.txt)
cat $R/removal.txt; save
timeout 240 env PYTHONPATH=$P:. python3 benchmarks/probes/train_throughput.py --models resnet20 \
  --batch 128 --data shapes10,cifar --modes eager,captured --epochs 3 --timeout 100 --out $R/train-throughput \
  > $R/train-throughput.log 2>&1
echo "throughput rc=$? at $SECONDS s"; cat $R/train-throughput/train-throughput.md 2>/dev/null | grep "^|"; save
left=$((500 - SECONDS))
timeout $left env PYTHONPATH=.:$P python3 benchmarks/probes/train_loop_host.py --data shapes10,cifar \
  --out $R/train-loop-host > $R/train-loop-host.log 2>&1
echo "loop rc=$? at $SECONDS s"; grep "^|" $R/train-loop-host/train-loop-host.md 2>/dev/null
save
echo done at $SECONDS
