#!/bin/bash
# 2026-12-04 session 5 call 1 (tree 3f57ba6): the two GPU failures of the last full run with their tracebacks, then
# ResNet-18 b128 bf16 with find in the call's layout, channels-last max pooling and the batch-norm merge batches.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
export PYTHONPATH=.:scratch/pylib
echo "== failures"; timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=long -k "cupy-2x5x12x12-float32 or calls_layout" tests/test_memory_format.py > $R/failures.log 2>&1; echo rc=$? >> $R/failures.log; save
echo "== profile"; timeout 120 python3 benchmarks/probes/eager_step_profile.py --out $R/profile --models resnet18:128 --modes bf16,bf16+channels_last --steps 6 > $R/profile.log 2>&1; echo rc=$? >> $R/profile.log; save
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
echo "== captured"; timeout 45 python3 benchmarks/bench.py $B --engines minidnn-graph --out $R/captured > $R/bench-captured.log 2>&1; echo rc=$? >> $R/bench-captured.log; save
echo "== captured cl"; timeout 45 python3 benchmarks/bench.py $B --engines minidnn-graph --channels-last --out $R/captured-cl > $R/bench-captured-cl.log 2>&1; echo rc=$? >> $R/bench-captured-cl.log; save
echo "== eager cl"; timeout 45 python3 benchmarks/bench.py $B --engines minidnn --channels-last --out $R/eager-cl > $R/bench-eager-cl.log 2>&1; echo rc=$? >> $R/bench-eager-cl.log; save
echo "== torch"; timeout 45 python3 benchmarks/bench.py $B --engines torch --out $R/torch > $R/bench-torch.log 2>&1; echo rc=$? >> $R/bench-torch.log; save
