#!/bin/bash
# session 6 call 1: tree 2d188c0 + scratch probe: BN/packed tests (110036a untested on GPU), host pieces probe.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONPATH=.:scratch/pylib PYTHONUNBUFFERED=1
timeout 200 env MINIDNN_CACHE_DIR=/tmp/cache-t python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_primitives_batchnorm.py tests/test_packed_launch.py tests/test_gpu_training.py tests/test_cuda_graphs.py > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS"; tail -3 $R/tests.log; save
timeout 200 env MINIDNN_CACHE_DIR=/tmp/cache-p taskset -c 0-3 python3 scratch/probe_opt.py > $R/probe.log 2>&1
echo "probe rc=$? at $SECONDS"; save
echo done at $SECONDS
