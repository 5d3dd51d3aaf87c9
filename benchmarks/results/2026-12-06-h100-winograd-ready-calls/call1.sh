#!/bin/bash
# 2026-12-06 session 7, call 1: tree = Winograd's recorded ready calls (new) against 0212f79 in scratch/head:
# the GPU tests of the touched files, two removal checks, then head/new alternating with PyTorch on CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 160 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_conv_call_cache.py tests/test_packed_launch.py \
  tests/test_conv_winograd.py tests/test_primitives_linear.py tests/test_primitives_blas.py tests/test_cuda_graphs.py \
  tests/test_memory_plan.py tests/test_gpu_training.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log
grep -E "^FAILED|^ERROR|passed|failed" $R/tests.log | tail -12; echo "tests done at $SECONDS s"; save
# Removal checks: each test must go red with its guarded line removed.
cp minidnn/primitives/_cuda.py /tmp/_cuda.bak
sed -i 's/step(\*\[addresses\[index\] + offset for index, offset in places\])/step(*[addresses[index] for index, offset in places])/' minidnn/primitives/_cuda.py
grep -c "addresses\[index\] for index" minidnn/primitives/_cuda.py > $R/removal.log
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -x "tests/test_conv_call_cache.py::test_gpu_a_repeated_winograd_call_replays_its_recording" >> $R/removal.log 2>&1; echo "offsets removed rc=$?" >> $R/removal.log
cp /tmp/_cuda.bak minidnn/primitives/_cuda.py
sed -i 's/        return None if key is None else self.calls.get(key)/        return None/' minidnn/primitives/_cuda.py
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -x "tests/test_packed_launch.py::test_gpu_the_one_call_layers_repeat_through_ready_calls_with_the_numpy_twins_results" >> $R/removal.log 2>&1; echo "ReadyCalls.get removed rc=$?" >> $R/removal.log
cp /tmp/_cuda.bak minidnn/primitives/_cuda.py
grep -E "rc=|passed|failed" $R/removal.log; echo "removal done at $SECONDS s"; save
left=$((540 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if [ $left -gt 60 ]; then
  timeout $((left + 50)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
    --cells resnet18:64:fp32,resnet20:128:fp32 --rounds 2 --torch --cpus 0-3 --budget-seconds $left --timeout 120 \
    --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log; save
fi
echo done at $SECONDS
