#!/bin/bash
# 2026-12-06 session 10, call 2: (1) the GPU tests of the one-launch bias gradient and the shared block counters;
# (2) benchmarks/probes/train_loop_host.py: an eager train.py step part by part (ResNet-20 b128, shapes10 and CIFAR);
# (3) CaffeNet b128 and b256 fp32 eager steps profiled (kernels by name), minidnn only.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
lscpu | grep -i "model name" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_primitives_linear.py \
  tests/test_primitives_batchnorm.py tests/test_packed_launch.py tests/test_cuda_sources.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -3 $R/tests.log; save
timeout 240 env PYTHONPATH=.:$P python3 benchmarks/probes/train_loop_host.py --data shapes10,cifar \
  --out $R/train-loop-host > $R/train-loop-host.log 2>&1
echo "loop rc=$? at $SECONDS s"; cat $R/train-loop-host/train-loop-host.md 2>/dev/null; tail -3 $R/train-loop-host.log; save
left=$((480 - SECONDS))
timeout $left env PYTHONPATH=.:$P taskset -c 0-3 python3 benchmarks/probes/eager_step_profile.py \
  --out $R/profile --models caffenet:128,caffenet:256 --engines minidnn --modes fp32 --steps 10 \
  > $R/profile.log 2>&1; echo "profile rc=$? at $SECONDS s"; tail -3 $R/profile.log
save
echo done at $SECONDS
