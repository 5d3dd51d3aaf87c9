#!/bin/bash
# Session 33, call 2. Tree = main 425f249 (PRODUCER_WARPGROUPS; the PRODUCER build off by default).
# 1. the PRODUCER tests (now with two producer warpgroups); 2. wgmma_forward_builds.py, bf16 and TF32: base,
# one producer warpgroup (4 stages, 1 in flight), two; 3. the same on a diagnostic copy whose forward kernels copy
# nothing (scratch/calls/nocopies.py): each pipeline's own time; 4. CaffeNet b256 TF32 captured vs PyTorch;
# 5. CaffeNet b256 bf16 layer table.
set -u
END=${END:-400}
R=/tmp/s33c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s33c2.tgz -C /tmp s33c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 100 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_wgmma.py \
  -k producer > $R/producer-tests.log 2>&1
echo "producer tests rc=$? at $SECONDS s"; tail -1 $R/producer-tests.log
grep -E "^(FAILED|ERROR)" $R/producer-tests.log | head -10; save
rm -rf /tmp/diag; mkdir /tmp/diag; cp -r minidnn benchmarks /tmp/diag/
python3 scratch/calls/nocopies.py /tmp/diag/minidnn/primitives/conv/implicit_gemm_wgmma.cu
diff minidnn/primitives/conv/implicit_gemm_wgmma.cu /tmp/diag/minidnn/primitives/conv/implicit_gemm_wgmma.cu > $R/nocopies.diff
for tree in . /tmp/diag; do
  name=builds; [ $tree = /tmp/diag ] && name=nocopies
  for d in bfloat16 float32; do
    timeout 100 env PYTHONPATH=$tree:$tree/benchmarks/probes:$P python3 $tree/benchmarks/probes/wgmma_forward_builds.py \
      --out $R/$name-$d --dtypes $d --variants base p4f1=PRODUCER_STAGES:4,PRODUCER_IN_FLIGHT:1 \
      w2=PRODUCER_STAGES:4,PRODUCER_IN_FLIGHT:1,PRODUCER_WARPGROUPS:2 > $R/$name-$d.log 2>&1
    echo "$name $d rc=$? at $SECONDS s"; grep "^|" $R/$name-$d/wgmma-forward-builds.md | cut -d'|' -f2-4,5-11
    save
  done
done
left=$((END - SECONDS))
if [ $left -gt 60 ]; then
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells caffenet:256:tf32 --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-caffenet-256-tf32 > $R/ab-caffenet.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab-caffenet-256-tf32/ab.md 2>/dev/null | cut -d'|' -f2-8 | tail -4
  rm -f $R/ab-*/*/bench.png; save
fi
left=$((END - SECONDS))
if [ $left -gt 40 ]; then
  timeout $((left - 5)) env PYTHONPATH=.:$P python3 benchmarks/bench.py --models caffenet --batch 256 \
    --precision bf16 --engines minidnn,torch --layers-only --channels-last --torch-channels-last --layer-repeats 5 \
    --out $R/layers-bf16-caffenet-256 > $R/layers-bf16-caffenet.log 2>&1
  echo "layers caffenet rc=$? at $SECONDS s"; save
fi
save
