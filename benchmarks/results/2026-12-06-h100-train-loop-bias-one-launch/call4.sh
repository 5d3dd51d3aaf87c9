#!/bin/bash
# 2026-12-06 session 10, call 4, the session's last tree: (1) the whole GPU suite; (2) a removal check of the GPU feed's
# fetching in the iterating thread; (3) train.py against the step alone (ResNet-20 b128, shapes10 and CIFAR, eager and
# captured, train_throughput.py); (4) the eager loop part by part (train_loop_host.py), as time allows.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 300 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/gpu-suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/gpu-suite.log; grep -E "^(FAILED|ERROR)" $R/gpu-suite.log | head; save
# Removal: the GPU feed's fetching in the iterating thread taken out (the background thread again); the test must fail.
rm -rf /tmp/rm && mkdir -p /tmp/rm && cp -r minidnn tests pyproject.toml /tmp/rm/
sed -i 's/        if pool is None and feeder is not None:/        if False:  # removed/' /tmp/rm/minidnn/data/loader.py
grep -c "if False:  # removed" /tmp/rm/minidnn/data/loader.py > $R/removal.txt
(cd /tmp/rm && timeout 60 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_data_loader.py \
  -k "iterating_thread" > $R/removal-fetch-here.log 2>&1; echo "removal rc=$?" >> $R/removal.txt)
cat $R/removal.txt; save
left=$((570 - SECONDS - 5))
timeout $left env PYTHONPATH=$P:. python3 benchmarks/probes/train_throughput.py --models resnet20 \
  --batch 128 --data shapes10,cifar --modes eager,captured --epochs 3 --timeout 100 --out $R/train-throughput \
  > $R/train-throughput.log 2>&1
echo "throughput rc=$? at $SECONDS s"; grep "^|" $R/train-throughput/train-throughput.md 2>/dev/null; save
left=$((570 - SECONDS - 5))
if [ $left -gt 60 ]; then
timeout $left env PYTHONPATH=.:$P python3 benchmarks/probes/train_loop_host.py --data shapes10,cifar \
  --out $R/train-loop-host > $R/train-loop-host.log 2>&1
echo "loop rc=$? at $SECONDS s"; grep "^|" $R/train-loop-host/train-loop-host.md 2>/dev/null
fi
save
echo done at $SECONDS
