#!/bin/bash
# 2026-12-04 session 6 call A: batch norm's channels-last kernels, float math and float per-thread sums in the half
# build (working tree) against HEAD (scratch/t0) and the element-wise change alone (scratch/t1); then the step.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
git log -1 --format=%H >> $R/machine.txt 2>&1; git status --short >> $R/machine.txt 2>&1
P=benchmarks/probes/batch_norm_kernels.py
echo "== tests"; PYTHONPATH=.:scratch/pylib timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/test_primitives_batchnorm.py tests/test_autocast.py > $R/tests.log 2>&1; echo rc=$? >> $R/tests.log; save
for t in t0 t1; do
  echo "== probe $t"; PYTHONPATH=scratch/$t:scratch/pylib python3 -c "import minidnn; print(minidnn.__file__)" > $R/which-$t.txt 2>&1
  PYTHONPATH=scratch/$t:scratch/pylib timeout 60 python3 $P --out $R/probe-$t-cl --channels-last --dtypes bfloat16 --no-torch > $R/probe-$t-cl.log 2>&1; echo rc=$? >> $R/probe-$t-cl.log; save
done
echo "== probe new cl"; PYTHONPATH=.:scratch/pylib timeout 90 python3 $P --out $R/probe-new-cl --channels-last --dtypes bfloat16 > $R/probe-new-cl.log 2>&1; echo rc=$? >> $R/probe-new-cl.log; save
echo "== probe nchw"; for t in t0 .; do n=$(basename $t); PYTHONPATH=$t:scratch/pylib timeout 60 python3 $P --out $R/probe-nchw-${t/./new} --dtypes bfloat16 --no-torch > $R/probe-nchw-${t/./new}.log 2>&1; echo rc=$? >> $R/probe-nchw-${t/./new}.log; done; save
export PYTHONPATH=.:scratch/pylib
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
echo "== captured cl"; timeout 120 python3 benchmarks/bench.py $B --engines minidnn-graph --channels-last --out $R/captured-cl > $R/bench-captured-cl.log 2>&1; echo rc=$? >> $R/bench-captured-cl.log; save
echo "== eager cl"; timeout 60 python3 benchmarks/bench.py $B --engines minidnn --channels-last --out $R/eager-cl > $R/bench-eager-cl.log 2>&1; echo rc=$? >> $R/bench-eager-cl.log; save
echo "== torch"; timeout 60 python3 benchmarks/bench.py $B --engines torch --out $R/torch > $R/bench-torch.log 2>&1; echo rc=$? >> $R/bench-torch.log; save
echo done
