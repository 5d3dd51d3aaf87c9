#!/bin/bash
# 2026-12-04 (session 2) call 3: where the eager step's host time goes, at 98c5d54 + the probes' edits.
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1
export PYTHONPATH=.:scratch/pylib
echo "== host costs"; timeout 120 python3 benchmarks/probes/host_costs.py --out $R/host-costs > $R/host-costs.log 2>&1; echo rc=$? >> $R/host-costs.log; save
echo "== profile"; timeout 200 python3 benchmarks/probes/eager_step_profile.py --out $R/profile --models resnet18:128 --modes bf16 --steps 10 > $R/profile.log 2>&1; echo rc=$? >> $R/profile.log; save
