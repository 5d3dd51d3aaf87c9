#!/bin/bash
# Session 25, call 4 (carry scratch/pylib, scratch/calls), tree 1823688 + temporary NO_COPIES/NO_PRODUCTS diagnostic
# macros (uncommitted) and the probe's --directions: where the TF32 kernels' time goes, copies or products.
set -u
R=/tmp/s25c4; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s25c4.tgz -C /tmp s25c4; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 300 env PYTHONPATH=.:$P:benchmarks/probes python3 benchmarks/probes/wgmma_forward_builds.py --out $R/diag \
  --variants base nocopy=NO_COPIES:1 noproducts=NO_PRODUCTS:1 --dtypes float32,bfloat16 \
  --directions forward,backward_filter > $R/diag.log 2>&1
echo "diag rc=$? at $SECONDS s"; grep "^|" $R/diag/wgmma-forward-builds.md 2>/dev/null | cut -d'|' -f2-9 || tail -30 $R/diag.log
save
