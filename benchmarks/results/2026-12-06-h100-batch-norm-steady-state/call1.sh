#!/bin/bash
# 2026-12-06 session 3, call 1. head = e804f2a (main at the session's start, scratch/head), new = the working tree
# (batch norm's steady-state launches, implicit GEMM's launch configuration looked up, api's whole-batch call
# without views). The memory-plan release test alone, the whole GPU suite in 8 workers, then eager steps
# head/new alternating, each engine in its own process with its own find cache, PyTorch beside; a profile of new.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_memory_plan.py -k hands_back > $R/memory-plan-alone.log 2>&1; echo rc=$? >> $R/memory-plan-alone.log; tail -2 $R/memory-plan-alone.log
echo "== suite"; timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log; tail -4 $R/suite.log; save
run() {  # tree, model, batch, precision, engine, round
  [ $SECONDS -gt 530 ] && { echo "skipped $*: out of time"; return; }
  local tree=$1 model=$2 batch=$3 prec=$4 engine=$5 round=$6
  local B="--no-layers --no-agreement --warmup 3 --steps 8 --profile-steps 1 --precision $prec --models $model --batch $batch --engines $engine"
  local name=$engine-$model-$batch-$prec-$tree-$round root=.
  [ $tree = head ] && root=scratch/head
  timeout 45 env PYTHONPATH=$P MINIDNN_CACHE_DIR=/tmp/cache-$tree python3 $root/benchmarks/bench.py $B --out $R/$name > $R/$name.log 2>&1; echo rc=$? >> $R/$name.log
  echo "$name: $(grep -h "host" $R/$name.log | tail -1)"; save
}
run head resnet20 128 fp32 minidnn 1; run new resnet20 128 fp32 minidnn 1; run new resnet20 128 fp32 minidnn 2; run head resnet20 128 fp32 minidnn 2
run new resnet20 128 fp32 torch 1
run head resnet18 128 bf16 minidnn 1; run new resnet18 128 bf16 minidnn 1; run new resnet18 128 bf16 minidnn 2; run head resnet18 128 bf16 minidnn 2
run new resnet18 128 bf16 torch 1
run head resnet20 128 tf32 minidnn 1; run new resnet20 128 tf32 minidnn 1
run new resnet20 128 tf32 torch 1
[ $SECONDS -lt 500 ] && timeout 60 env MINIDNN_CACHE_DIR=/tmp/cache-new python3 benchmarks/probes/eager_step_profile.py --out $R/profile --models resnet20:128 --modes fp32 --engines minidnn --steps 5 > $R/profile.log 2>&1; echo rc=$? >> $R/profile.log; save
echo done
