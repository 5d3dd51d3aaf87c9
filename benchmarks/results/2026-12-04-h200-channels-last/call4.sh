#!/bin/bash
# 2026-12-04 session 3 call 4: the whole GPU suite on the committed tree, then the channels-last step after the
# batch-norm kernels' coefficient hoisting and split sizing.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
git log --oneline -1 > $R/tree.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P
echo "== suite"; timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log; save
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
echo "== captured cl"; timeout 40 python3 benchmarks/bench.py $B --engines minidnn-graph --channels-last --out $R/captured-cl > $R/bench-captured-cl.log 2>&1; echo rc=$? >> $R/bench-captured-cl.log; save
echo "== profile"; timeout 60 python3 benchmarks/probes/eager_step_profile.py --out $R/profile --models resnet18:128 --modes bf16+channels_last --steps 6 > $R/profile.log 2>&1; echo rc=$? >> $R/profile.log; save
