#!/bin/bash
# 2026-12-06 session 6, call 4: tree 7bee1a7 (ready calls, ready GEMMs, optimizer steady state) as new, 2d188c0 in
# scratch/head: the whole GPU suite, then head/new alternating with PyTorch beside them on CPUs 0-3, then the phase probe.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 260 env MINIDNN_CACHE_DIR=/tmp/cache-t python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 > $R/tests.log 2>&1
echo rc=$? >> $R/tests.log
grep -E "^FAILED|^ERROR|passed|failed" $R/tests.log | tail -12; save
left=$((470 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if [ $left -gt 60 ]; then
  timeout $((left + 30)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree head=scratch/head --tree new=. \
    --cells resnet20:128:fp32,resnet20:128:tf32,resnet18:64:fp32 --rounds 2 --torch --cpus 0-3 --budget-seconds $left --timeout 90 \
    --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -12; tail -2 $R/ab.log; save
fi
timeout 30 env MINIDNN_CACHE_DIR=/tmp/cache-p taskset -c 0-3 python3 scratch/probe_opt.py > $R/probe-new.log 2>&1
echo "probe rc=$? at $SECONDS"; head -22 $R/probe-new.log; save
echo done at $SECONDS
