#!/bin/bash
# 2026-12-04 call 4 (final): the whole GPU suite on the final GPU code, three removal checks of the pooling
# kernels, the max-pool probe before (scratch/head = 76c2db0) and after, the bf16 (and fp16) steps.
set -u
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P
echo "== suite"; timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=30 > $R/suite-full.log 2>&1; echo rc=$? >> $R/suite-full.log
tail -n 80 $R/suite-full.log > $R/suite.log; rm $R/suite-full.log; pack
cp minidnn/primitives/pooling.cu /tmp/pooling.cu.saved
removal() {  # $1 label, $2 sed expression, $3 pytest -k
  sed -i "$2" minidnn/primitives/pooling.cu
  echo "== removal $1: $(diff /tmp/pooling.cu.saved minidnn/primitives/pooling.cu | grep -c '^>') line(s) changed" >> $R/removals.log
  timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_primitives_pooling.py -k "$3" 2>&1 | tail -n 3 >> $R/removals.log
  cp /tmp/pooling.cu.saved minidnn/primitives/pooling.cu
}
removal "plane loop stride doubled" 's/plane += gridDim.y/plane += 2 * gridDim.y/' "planes"
removal "fixed window: ties replace" 's/(!found || v\[r\]\[c\] > best || isnan/(!found || v[r][c] >= best || isnan/' "ties"
removal "fixed candidates: tap code by kernel_h" 's/(h - (p \* s.stride_h - s.pad_h)) \* s.kernel_w/(h - (p * s.stride_h - s.pad_h)) * s.kernel_h/' "matches_reference"
echo "== pooling tests after restore" >> $R/removals.log
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_primitives_pooling.py 2>&1 | tail -n 2 >> $R/removals.log; pack
timeout 60 env PYTHONPATH=scratch/head:$P:benchmarks/probes python3 benchmarks/probes/max_pool_kernels.py --out $R/pool-before > $R/probe-before.log 2>&1
timeout 60 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/max_pool_kernels.py --out $R/pool-after > $R/probe-after.log 2>&1; pack
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1"
for M in "resnet18 128 bf16" "caffenet 256 bf16" "resnet18 128 fp16"; do set -- $M
  for E in minidnn-graph torch; do
    timeout 60 python3 benchmarks/bench.py $B --precision $3 --models $1 --batch $2 --engines $E --out $R/$1-$3-$E > $R/bench-$1-$3-$E.log 2>&1; echo rc=$? >> $R/bench-$1-$3-$E.log
  done; pack
done
