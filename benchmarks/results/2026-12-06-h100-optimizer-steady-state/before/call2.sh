#!/bin/bash
# session 6 call 2: tree 2d188c0 + scratch probe_calls.py (host µs of one-call layers, BN kept, optimizer; by function).
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONPATH=.:scratch/pylib PYTHONUNBUFFERED=1
timeout 200 env MINIDNN_CACHE_DIR=/tmp/cache-p taskset -c 0-3 python3 scratch/probe_calls.py > $R/calls.log 2>&1
echo "probe rc=$? at $SECONDS"; tail -5 $R/calls.log; save
echo done at $SECONDS
