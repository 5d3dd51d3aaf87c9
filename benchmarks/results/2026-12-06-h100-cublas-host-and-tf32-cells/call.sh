#!/bin/bash
# Next session, first device call (carry scratch/pylib and this script): cuBLAS's host time a call against PyTorch's
# (cublas_host_per_call.py), then issue 22's TF32 eager cells against PyTorch (ab.py, one round, CPUs 0-3).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 100 env PYTHONPATH=.:$P taskset -c 0-3 python3 benchmarks/probes/cublas_host_per_call.py --out $R/cublas-host \
  > $R/cublas-host.log 2>&1
echo "probe rc=$? at $SECONDS s"; grep "^|" $R/cublas-host/cublas-host.md 2>/dev/null; tail -3 $R/cublas-host.log; save
left=$((420 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 40)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree main=. --torch --rounds 1 --cpus 0-3 \
  --cells resnet20:128:tf32,resnet18:64:tf32,caffenet:128:tf32,resnet50:64:tf32 --budget-seconds $left --timeout 110 \
  --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -12; tail -2 $R/ab.log
rm -f $R/ab/*/bench.png; save
echo done at $SECONDS
