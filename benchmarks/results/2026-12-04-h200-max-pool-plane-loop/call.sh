#!/bin/bash
# 2026-12-04 call 3: max pooling's plane-loop kernels. Working tree = 03febed (+ nothing); scratch/head = 76c2db0
# (the pooling kernels before).
set -u
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P
echo "== pooling tests"; timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_primitives_pooling.py tests/test_autocast.py -k "pool" > $R/tests-pooling.log 2>&1; echo rc=$? >> $R/tests-pooling.log
echo "== removal: the plane loop's stride doubled (every other plane left unwritten)"
cp minidnn/primitives/pooling.cu /tmp/pooling.cu.saved
sed -i 's/plane += gridDim.y/plane += 2 * gridDim.y/' minidnn/primitives/pooling.cu
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_primitives_pooling.py -k "planes" > $R/tests-removal.log 2>&1; echo rc=$? >> $R/tests-removal.log
cp /tmp/pooling.cu.saved minidnn/primitives/pooling.cu
echo "== probe before"; timeout 100 env PYTHONPATH=scratch/head:$P:benchmarks/probes python3 benchmarks/probes/max_pool_kernels.py --out $R/before > $R/probe-before.log 2>&1; echo rc=$? >> $R/probe-before.log
echo "== probe after"; timeout 100 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/max_pool_kernels.py --out $R/after > $R/probe-after.log 2>&1; echo rc=$? >> $R/probe-after.log
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16"
for M in "resnet18 128" "caffenet 256"; do set -- $M
  echo "== bench $1 before"; timeout 90 env PYTHONPATH=$P python3 scratch/head/benchmarks/bench.py $B --models $1 --batch $2 --engines minidnn-graph --out $R/$1-before > $R/bench-$1-before.log 2>&1; echo rc=$? >> $R/bench-$1-before.log
  echo "== bench $1 after"; timeout 90 python3 benchmarks/bench.py $B --models $1 --batch $2 --engines minidnn-graph --out $R/$1-after > $R/bench-$1-after.log 2>&1; echo rc=$? >> $R/bench-$1-after.log
  echo "== bench $1 torch"; timeout 80 python3 benchmarks/bench.py $B --models $1 --batch $2 --engines torch --out $R/$1-torch > $R/bench-$1-torch.log 2>&1; echo rc=$? >> $R/bench-$1-torch.log
done
cd $OUT && tar czf r.tgz r && rm -rf r
