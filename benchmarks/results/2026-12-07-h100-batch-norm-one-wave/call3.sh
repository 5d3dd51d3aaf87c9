#!/bin/bash
# Session 29, call 3. Tree = f3ecf78: batch norm's channels-last statistics load eight rows before merging any (not
# yet run on a GPU). prev = 0cfa12a (call 2's tree; git archive of minidnn models train.py benchmarks). Carry
# scratch/pylib, scratch/calls, scratch/prev, scratch/s29. 1. the whole GPU suite; 2. batch norm per kernel with a
# digest of the results, this tree and prev in turn (scratch/s29/bn_compare.py); 3. captured channels-last steps:
# ResNet-18 b128 bf16 and TF32 (this tree, prev, PyTorch), where time is left.
set -u
END=${END:-470}
R=/tmp/s29c3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s29c3.tgz -C /tmp s29c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib; H=$PWD/scratch/prev
timeout 220 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
for tree in new prev; do
  root=.; [ $tree = prev ] && root=$H
  timeout 90 env PYTHONPATH=$root:$P python3 scratch/s29/bn_compare.py $R/bn-$tree.json > $R/bn-$tree.log 2>&1
  echo "bn $tree rc=$? at $SECONDS s"; save
done
python3 - $R <<'PY'
import json, sys
new, prev = (json.load(open(f"{sys.argv[1]}/bn-{t}.json")) for t in ("new", "prev"))
for a, b in zip(new, prev):
    stat = lambda r: sum(t for k, t in r["kernels"].items() if "statistics" in k)
    print(a["layer"], a["dtype"], "same bits" if a["digest"] == b["digest"] else "DIFFERENT",
          f"statistics {stat(a):.1f} us (prev {stat(b):.1f})")
PY
for cell in resnet18:128:bf16 resnet18:128:tf32; do
  name=${cell//:/-}; left=$((END - SECONDS)); [ $left -lt 100 ] && break
  timeout $((left - 5)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --tree prev=$H --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells $cell --budget-seconds 200 --timeout 120 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last \
    --torch-channels-last" --out $R/ab-$name > $R/ab-$name.log 2>&1
  echo "ab $cell rc=$? at $SECONDS s"; grep "^|" $R/ab-$name/ab.md 2>/dev/null | cut -d'|' -f2-7 | tail -3
  rm -f $R/ab-$name/*/bench.png; save
done
