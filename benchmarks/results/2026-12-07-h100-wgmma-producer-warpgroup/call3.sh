#!/bin/bash
# Session 33, call 3. Tree = main + COPY_PREFETCH (channels_last.cuh's copies with an L2 prefetch hint; 0 by default).
# 1. wgmma_forward_builds.py, bf16 then TF32, all three directions: base, the copies with a 128- and 256-byte L2
# prefetch, and the PRODUCER build with two producer warpgroups and 6 stages; 2. the GPU tests of the wgmma and
# mma.sync channels-last kernels on a copy of the tree whose default is the faster prefetch (bf16 sums).
set -u
END=${END:-300}
R=/tmp/s33c3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s33c3.tgz -C /tmp s33c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
for d in bfloat16 float32; do
  timeout 100 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/wgmma_forward_builds.py \
    --out $R/prefetch-$d --dtypes $d --directions forward,backward_data,backward_filter --variants base \
    l128=COPY_PREFETCH:128 l256=COPY_PREFETCH:256 \
    w2s6=PRODUCER_STAGES:6,PRODUCER_IN_FLIGHT:1,PRODUCER_WARPGROUPS:2 > $R/prefetch-$d.log 2>&1
  echo "prefetch $d rc=$? at $SECONDS s"; grep "^|" $R/prefetch-$d/wgmma-forward-builds.md | cut -d'|' -f2-8
  save
done
best=$(python3 - <<'PY'
import json, statistics
rows = json.load(open("/tmp/s33c3/prefetch-bfloat16/wgmma-forward-builds.json"))["rows"]
sums = {v: sum(r[v] for r in rows) / sum(r["base"] for r in rows) for v in ("l128", "l256")}
print(min(sums, key=sums.get)[1:] if min(sums.values()) < 1 else 0)
PY
)
echo "faster prefetch (0: none): $best"
if [ "${best:-0}" != 0 ] && [ $((END - SECONDS)) -gt 60 ]; then
  rm -rf /tmp/pf; mkdir /tmp/pf; cp -r minidnn tests pyproject.toml /tmp/pf/
  sed -i "s/^#define COPY_PREFETCH 0$/#define COPY_PREFETCH $best/" /tmp/pf/minidnn/primitives/conv/channels_last.cuh
  grep -n "^#define COPY_PREFETCH" /tmp/pf/minidnn/primitives/conv/channels_last.cuh
  (cd /tmp/pf && timeout $((END - SECONDS)) env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
     tests/test_conv_wgmma.py tests/test_conv_nhwc.py tests/test_conv_strided_dgrad.py > $R/tests-prefetch-$best.log 2>&1;
   echo "tests with COPY_PREFETCH $best rc=$?"); tail -1 $R/tests-prefetch-$best.log
fi
save
