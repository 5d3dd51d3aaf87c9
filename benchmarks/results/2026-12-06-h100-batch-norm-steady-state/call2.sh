#!/bin/bash
# 2026-12-06 session 3, call 2, on c98e3c7 (the cuBLAS capture workspace from the device; the mixed-precision
# capture test with one algorithm forced): the memory-plan release test alone in a fresh process, the train.py
# mixed-precision capture tests, the whole GPU suite in 8 workers, then ResNet-20 b128 fp32 eager rounds head/new
# while time is left (head = e804f2a in scratch/head).
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 70 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_memory_plan.py -k hands_back > $R/memory-plan-alone.log 2>&1; echo rc=$? >> $R/memory-plan-alone.log; tail -2 $R/memory-plan-alone.log; save
echo "== suite"; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/suite.log 2>&1; echo rc=$? >> $R/suite.log; tail -4 $R/suite.log; save
run() {  # tree, round
  [ $SECONDS -gt 320 ] && { echo "skipped $*: out of time"; return; }
  local tree=$1 round=$2 root=.
  local name=minidnn-resnet20-128-fp32-$tree-$round
  [ $tree = head ] && root=scratch/head
  timeout 40 env PYTHONPATH=$P MINIDNN_CACHE_DIR=/tmp/cache-$tree python3 $root/benchmarks/bench.py --no-layers --no-agreement --warmup 3 --steps 20 --profile-steps 1 --precision fp32 --models resnet20 --batch 128 --engines minidnn --out $R/$name > $R/$name.log 2>&1; echo rc=$? >> $R/$name.log
  echo "$name: $(grep -h "host" $R/$name.log | tail -1)"; save
}
run new 1; run head 1; run head 2; run new 2; run new 3; run head 3
echo done
