#!/bin/bash
# 2026-12-06 call 2: the lean launch with _cuda.function's Functions (the tree of this call) against main before
# it (1e1c699, scratch/head): the whole GPU suite in 8 pytest-xdist workers, the memory-plan tests alone (one
# failed under xdist in call 1), the host-cost probe, then eager steps alternating head/new, each engine in its
# own process, PyTorch beside.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
echo "== suite"; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log; tail -4 $R/suite.log; save
echo "== memory plan alone"; timeout 40 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_memory_plan.py tests/test_cuda_launch.py > $R/memory-plan.log 2>&1; echo rc=$? >> $R/memory-plan.log; tail -2 $R/memory-plan.log; save
echo "== host costs"; timeout 45 python3 benchmarks/probes/host_costs.py --out $R/host-costs > $R/host-costs.log 2>&1; echo rc=$? >> $R/host-costs.log; save
run() {  # tree, model, batch, precision, engine, round
  local tree=$1 model=$2 batch=$3 prec=$4 engine=$5 round=$6
  local B="--no-layers --no-agreement --warmup 3 --steps 8 --profile-steps 1 --precision $prec --models $model --batch $batch --engines $engine"
  local name=$engine-$model-$batch-$prec-$tree-$round root=.
  [ $tree = head ] && root=scratch/head
  timeout 45 env PYTHONPATH=$P python3 $root/benchmarks/bench.py $B --out $R/$name > $R/$name.log 2>&1; echo rc=$? >> $R/$name.log
  echo "$tree: $(grep -h "host" $R/$name.log | tail -1)"; save
}
for cell in "resnet18 128 bf16" "resnet20 128 fp32"; do
  set -- $cell
  run head $1 $2 $3 minidnn 1; run new $1 $2 $3 minidnn 1; run new $1 $2 $3 minidnn 2; run head $1 $2 $3 minidnn 2
  run new $1 $2 $3 torch 1
done
