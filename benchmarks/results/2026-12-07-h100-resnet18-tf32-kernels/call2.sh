#!/bin/bash
# Session 25, call 2 (carry scratch/pylib, scratch/calls), tree = HEAD + the COPY_L1/CTAS_PER_SM macros and the
# wgmma_forward_builds probe (uncommitted): the wgmma forward kernel's build variants against cuDNN per layer.
set -u
R=/tmp/s25c2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s25c2.tgz -C /tmp s25c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 420 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/wgmma_forward_builds.py --out $R/builds \
  --variants base l1=COPY_L1:1 three=CTAS_PER_SM:3 l1three=COPY_L1:1,CTAS_PER_SM:3 > $R/builds.log 2>&1
echo "builds rc=$? at $SECONDS s"; grep "^|" $R/builds/wgmma-forward-builds.md 2>/dev/null | cut -d'|' -f2-12 || tail -30 $R/builds.log
save
