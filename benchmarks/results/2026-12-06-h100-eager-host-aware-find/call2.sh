#!/bin/bash
# 2026-12-06 session 2, call 2: the tree to land. The memory-plan release test alone in fresh processes, the
# whole GPU suite in 8 pytest-xdist workers, then ResNet-20 b128 in TF32 head/new, each engine
# in its own process with its own find cache, PyTorch beside.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
for i in 1 2; do
  timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_memory_plan.py -k hands_back > $R/memory-plan-alone-$i.log 2>&1; echo rc=$? >> $R/memory-plan-alone-$i.log; tail -2 $R/memory-plan-alone-$i.log
done
save
echo "== suite"; timeout 260 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log; tail -4 $R/suite.log; save
run() {  # tree, model, batch, precision, engine, round
  local tree=$1 model=$2 batch=$3 prec=$4 engine=$5 round=$6
  local B="--no-layers --no-agreement --warmup 3 --steps 8 --profile-steps 1 --precision $prec --models $model --batch $batch --engines $engine"
  local name=$engine-$model-$batch-$prec-$tree-$round root=.
  [ $tree = head ] && root=scratch/head
  timeout 50 env PYTHONPATH=$P MINIDNN_CACHE_DIR=/tmp/cache-$tree python3 $root/benchmarks/bench.py $B --out $R/$name > $R/$name.log 2>&1; echo rc=$? >> $R/$name.log
  echo "$name: $(grep -h "host" $R/$name.log | tail -1)"; save
}
run head resnet20 128 tf32 minidnn 1; run new resnet20 128 tf32 minidnn 1; run new resnet20 128 tf32 minidnn 2; run head resnet20 128 tf32 minidnn 2
run new resnet20 128 tf32 torch 1
echo done
