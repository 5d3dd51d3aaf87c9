#!/bin/bash
# Session 28, call 3. Tree = this session's working tree after 4a9a53f: pooling.cu's max-pool backward takes
# MAX_POOL_PLANES planes a turn of its loop (default 1), and benchmarks/probes/max_pool_backward_planes.py times the
# builds 1, 2 and 4, one gradient and two parts (gathered, or summed first). Carry scratch/pylib.
set -u
R=/tmp/s28c3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s28c3.tgz -C /tmp s28c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 240 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/max_pool_backward_planes.py \
  --out $R/planes > $R/planes.log 2>&1
echo "probe rc=$? at $SECONDS s"; cat $R/planes/max-pool-backward-planes.md 2>/dev/null || tail -20 $R/planes.log; save
timeout 120 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_primitives_pooling.py \
  tests/test_memory_format.py tests/test_autograd.py > $R/pooling-tests.log 2>&1
echo "pooling tests rc=$? at $SECONDS s"; tail -1 $R/pooling-tests.log; save
