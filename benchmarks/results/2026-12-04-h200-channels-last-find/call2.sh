#!/bin/bash
# 2026-12-04 session 5 call 2 (tree ebb0bbf): batch norm's channels-last element-wise kernels on two packs a thread,
# the narrow transposes (the stem's 3 channels), the filter copy reading channels-last weights. The step (captured
# and eager channels-last), then the whole GPU suite, then the eager profile if time is left. Two earlier tries of
# this call got no machine, or lost it: the device time left allows one call, so the order puts the suite before
# the profile.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
export PYTHONPATH=.:scratch/pylib
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
echo "== captured cl"; timeout 45 python3 benchmarks/bench.py $B --engines minidnn-graph --channels-last --out $R/captured-cl > $R/bench-captured-cl.log 2>&1; echo rc=$? >> $R/bench-captured-cl.log; save
echo "== eager cl"; timeout 40 python3 benchmarks/bench.py $B --engines minidnn --channels-last --out $R/eager-cl > $R/bench-eager-cl.log 2>&1; echo rc=$? >> $R/bench-eager-cl.log; save
echo "== suite"; timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 tests > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log; save
echo "== profile"; timeout 60 python3 benchmarks/probes/eager_step_profile.py --out $R/profile --models resnet18:128 --modes bf16+channels_last --steps 6 > $R/profile.log 2>&1; echo rc=$? >> $R/profile.log; save
