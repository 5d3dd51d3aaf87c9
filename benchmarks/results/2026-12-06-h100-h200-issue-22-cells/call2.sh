#!/bin/bash
# 2026-12-06 session 12, call 2, on call 1's warm machine: train_throughput.py again (another pair of processes), then
# the loop in one process with the loader's next part by part (train_loop_host.py --next-parts).
set -u; R=/tmp/r2; rm -rf $R; mkdir -p $R; P=$PWD/scratch/pylib; export PYTHONUNBUFFERED=1
timeout 80 env PYTHONPATH=$P:. python3 benchmarks/probes/train_throughput.py --models resnet20 --batch 128 --data shapes10,cifar --modes eager,captured --epochs 3 --timeout 60 --out $R/train-throughput > $R/train-throughput.log 2>&1; echo "throughput rc=$? at $SECONDS"; grep "^|" $R/train-throughput/train-throughput.md
timeout 100 env PYTHONPATH=$P:. python3 benchmarks/probes/train_loop_host.py --data shapes10,cifar --next-parts --out $R/train-loop-host > $R/train-loop-host.log 2>&1; echo "loop-host rc=$? at $SECONDS"; grep "^|" $R/train-loop-host/train-loop-host.md | head -40
tar czf $OUT/r2.tgz -C /tmp r2
