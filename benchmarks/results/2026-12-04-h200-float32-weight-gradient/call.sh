#!/bin/bash
# 2026-12-04 (session 2) call 5 (call 4 was cut: machine taken back, nothing returned): the GPU tests of what
# changed since call 2 (the float32 weight gradient, the imports), then ResNet-18 b128 bf16 eager on
# scratch/head (9791c47) and the working tree, captured on the working tree.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P
echo "== tests"; timeout 175 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv_half.py tests/test_autocast.py tests/test_conv_wgmma.py tests/test_cuda_graphs.py tests/test_conv_nhwc.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log; save
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
echo "== eager head"; timeout 45 env PYTHONPATH=$P python3 scratch/head/benchmarks/bench.py $B --engines minidnn --out $R/eager-head > $R/bench-eager-head.log 2>&1; echo rc=$? >> $R/bench-eager-head.log; save
echo "== eager new"; timeout 45 python3 benchmarks/bench.py $B --engines minidnn --out $R/eager-new > $R/bench-eager-new.log 2>&1; echo rc=$? >> $R/bench-eager-new.log; save
echo "== captured new"; timeout 40 python3 benchmarks/bench.py $B --engines minidnn-graph --out $R/captured-new > $R/bench-captured-new.log 2>&1; echo rc=$? >> $R/bench-captured-new.log; save
