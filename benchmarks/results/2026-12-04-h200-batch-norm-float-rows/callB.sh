#!/bin/bash
# 2026-12-04 session 6 call B: batch norm's channels-last launch rule (128-byte block columns, 8 packs a thread in
# the element-wise row kernels): its GPU tests, the sweep of its constants, the per-layer probe, the step.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
git log -1 --format=%H >> $R/machine.txt 2>&1; git status --short >> $R/machine.txt 2>&1
export PYTHONPATH=.:scratch/pylib:benchmarks/probes
echo "== tests"; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_primitives_batchnorm.py tests/test_memory_format.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log; save
echo "== sweep"; timeout 150 python3 benchmarks/probes/batch_norm_rows_sweep.py --out $R/sweep > $R/sweep.log 2>&1; echo rc=$? >> $R/sweep.log; save
echo "== probe cl"; timeout 60 python3 benchmarks/probes/batch_norm_kernels.py --out $R/probe-cl --channels-last --dtypes bfloat16 > $R/probe-cl.log 2>&1; echo rc=$? >> $R/probe-cl.log; save
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
echo "== captured cl"; timeout 100 python3 benchmarks/bench.py $B --engines minidnn-graph --channels-last --out $R/captured-cl > $R/bench-captured-cl.log 2>&1; echo rc=$? >> $R/bench-captured-cl.log; save
echo done
