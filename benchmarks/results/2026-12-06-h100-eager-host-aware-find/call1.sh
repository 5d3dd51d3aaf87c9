#!/bin/bash
# 2026-12-06 session 2, call 1: eager calls choose by max(GPU, host) (this tree, "new") against main before it
# (scratch/head: 1e1c699's code, the library of 6218ac7). Tests first (the memory-plan test alone in fresh
# processes, the new capture and find tests), then eager steps alternating head/new, each engine in its own
# process with its own find cache, PyTorch beside; the captured step head/new; the plan-choice probe.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
for i in 1 2; do
  timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_memory_plan.py -k hands_back > $R/memory-plan-alone-$i.log 2>&1; echo rc=$? >> $R/memory-plan-alone-$i.log; tail -2 $R/memory-plan-alone-$i.log
done
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_memory_plan.py tests/test_cuda_graphs.py "tests/test_primitives_conv.py::test_find_times_the_gpu_not_the_hosts_launches" > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log; tail -2 $R/tests.log; save
run() {  # tree, model, batch, precision, engine, round
  local tree=$1 model=$2 batch=$3 prec=$4 engine=$5 round=$6
  local B="--no-layers --no-agreement --warmup 3 --steps 8 --profile-steps 1 --precision $prec --models $model --batch $batch --engines $engine"
  local name=$engine-$model-$batch-$prec-$tree-$round root=.
  [ $tree = head ] && root=scratch/head
  timeout 60 env PYTHONPATH=$P MINIDNN_CACHE_DIR=/tmp/cache-$tree python3 $root/benchmarks/bench.py $B --out $R/$name > $R/$name.log 2>&1; echo rc=$? >> $R/$name.log
  echo "$name: $(grep -h "host" $R/$name.log | tail -1)"; save
}
run head resnet20 128 fp32 minidnn 1; run new resnet20 128 fp32 minidnn 1; run new resnet20 128 fp32 minidnn 2; run head resnet20 128 fp32 minidnn 2
run new resnet20 128 fp32 torch 1
timeout 60 env MINIDNN_CACHE_DIR=/tmp/cache-new python3 benchmarks/probes/eager_plan_choices.py --model resnet20 --batch 128 --precision fp32 --out $R/plan-choices-resnet20-128-fp32 > $R/plan-choices-resnet20.log 2>&1; tail -1 $R/plan-choices-resnet20.log; save
run head resnet20 128 fp32 minidnn-graph 1; run new resnet20 128 fp32 minidnn-graph 1
run head resnet18 64 fp32 minidnn 1; run new resnet18 64 fp32 minidnn 1; run new resnet18 64 fp32 minidnn 2; run head resnet18 64 fp32 minidnn 2
run new resnet18 64 fp32 torch 1
timeout 60 env MINIDNN_CACHE_DIR=/tmp/cache-new python3 benchmarks/probes/eager_plan_choices.py --model resnet18 --batch 64 --precision fp32 --out $R/plan-choices-resnet18-64-fp32 > $R/plan-choices-resnet18.log 2>&1; tail -1 $R/plan-choices-resnet18.log; save
run head resnet18 128 bf16 minidnn 1; run new resnet18 128 bf16 minidnn 1
run new resnet18 128 bf16 torch 1
echo done
