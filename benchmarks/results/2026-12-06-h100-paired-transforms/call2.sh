#!/bin/bash
# 2026-12-06 session 8, call 2: the paired transforms' GPU tests and removal check; find's per-call choices in
# ResNet-20's eager step (new); then head (0212f79), new (a108c7f: paired transforms, max(GPU, host) rule) and sum
# (new with eager calls chosen by GPU + host time) with PyTorch, on CPUs 0-3.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
(cd scratch/new && timeout 150 env PYTHONPATH=.:$P python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
  tests/test_conv_winograd.py tests/test_conv_call_cache.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log)
grep -E "^FAILED|^ERROR|passed|failed" $R/tests.log | tail -12; echo "tests done at $SECONDS s"; save
(cd scratch/new && cp minidnn/primitives/conv/winograd.py /tmp/w.bak && \
  sed -i 's/^PAIRED = {("filter", "input"), ("output", "input"), ("input", "gradient")}/PAIRED = set()/' minidnn/primitives/conv/winograd.py && \
  grep -c "^PAIRED = set()" minidnn/primitives/conv/winograd.py > $R/removal.log; \
  timeout 60 env PYTHONPATH=.:$P python3 -m pytest -m gpu -q -p no:cacheprovider -x \
  "tests/test_conv_winograd.py::test_gpu_paired_transforms_give_the_singles_bits_in_fewer_launches" >> $R/removal.log 2>&1; \
  echo "PAIRED emptied rc=$?" >> $R/removal.log; cp /tmp/w.bak minidnn/primitives/conv/winograd.py)
grep -E "rc=|passed|failed" $R/removal.log; echo "removal done at $SECONDS s"; save
(cd scratch/new && timeout 90 env PYTHONPATH=.:$P taskset -c 0-3 python3 benchmarks/probes/eager_plan_choices.py \
  --model resnet20 --batch 128 --precision fp32 --out $R/plan-choices-resnet20 > $R/plan-choices.log 2>&1; \
  echo "plan choices rc=$? at $SECONDS s")
tail -2 $R/plan-choices.log; save
left=$((520 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
timeout $((left + 60)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=scratch/new \
  --tree sum=scratch/sum --cells resnet20:128:fp32,resnet18:64:fp32 --rounds 2 --torch --cpus 0-3 \
  --budget-seconds $left --timeout 120 --out $R/ab > $R/ab.log 2>&1
echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -14; tail -2 $R/ab.log
rm -f $R/ab/*/bench.png; save
echo done at $SECONDS
