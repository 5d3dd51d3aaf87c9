#!/bin/bash
# 2026-12-04 call 2: implicit_gemm_wgmma's pipeline builds. Tree: the working tree (copy after wgmma loop reorder,
# STAGES/IN_FLIGHT macros); scratch/head = git archive of 1aaa30b (the kernels before).
set -u
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
P=scratch/pylib
echo "== probe before" ; timeout 120 env PYTHONPATH=scratch/head:$P:benchmarks/probes python3 benchmarks/probes/wgmma_pipeline_depth.py --out $R --builds current --label before > $R/probe-before.log 2>&1; echo rc=$? >> $R/probe-before.log
echo "== probe after" ; timeout 200 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/wgmma_pipeline_depth.py --out $R --builds 3,0 4,0 4,1 5,1 5,2 --label after > $R/probe-after.log 2>&1; echo rc=$? >> $R/probe-after.log
CHOICE=$(python3 scratch/choose.py $R/wgmma-pipeline-after.json 2>>$R/choice.txt); echo "choice=$CHOICE" >> $R/choice.txt
for V in "$CHOICE" "128=4,1;64=4,1"; do
  echo "== tests $V" >> $R/tests.log
  SCRATCH_WGMMA_PIPELINE="$V" timeout 100 env PYTHONPATH=scratch/variant:.:$P python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv_wgmma.py 2>&1 | tail -4 >> $R/tests.log
done
B="--no-layers --no-agreement --warmup 2 --steps 6 --profile-steps 1 --precision bf16 --models resnet18 --batch 128"
echo "== bench before" ; timeout 100 env PYTHONPATH=$P python3 scratch/head/benchmarks/bench.py $B --engines minidnn-graph --out $R/r18-before > $R/bench-before.log 2>&1; echo rc=$? >> $R/bench-before.log
echo "== bench after" ; SCRATCH_WGMMA_PIPELINE="$CHOICE" timeout 100 env PYTHONPATH=scratch/variant:.:$P python3 benchmarks/bench.py $B --engines minidnn-graph --out $R/r18-after > $R/bench-after.log 2>&1; echo rc=$? >> $R/bench-after.log
echo "== bench torch" ; timeout 80 env PYTHONPATH=.:$P python3 benchmarks/bench.py $B --engines torch --out $R/r18-torch > $R/bench-torch.log 2>&1; echo rc=$? >> $R/bench-torch.log
cd $OUT && tar czf r.tgz r && rm -rf r
