#!/bin/bash
# Session 34, call 1. Tree = main (the forward kernel's TMA build, off by default).
# 1. the TMA build's GPU tests; 2. wgmma_forward_builds.py base against tma, bf16 and TF32, cuDNN beside;
# 3. per tile width, TMA on where it won (summed over both types); the whole GPU suite on that tree (/tmp/on);
# 4. the TMA test against a mutant (tap offsets swapped); 5. ab.py: ResNet-18/50 b128 bf16 channels-last captured,
# the tree as it is (base) against /tmp/on, PyTorch AMP beside, one round, as time allows.
set -u
R=/tmp/s34c1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s34c1.tgz -C /tmp s34c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 150 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_wgmma.py \
  -k "tma" > $R/tma-tests.log 2>&1
rc=$?; echo "tma tests rc=$rc at $SECONDS s"; tail -1 $R/tma-tests.log
grep -E "^(FAILED|ERROR)" $R/tma-tests.log | head -10; grep -m3 -E "Error" $R/tma-tests.log | cut -c1-300; save
rm -rf /tmp/on; mkdir /tmp/on; cp -r $(ls -A | grep -v -e '^scratch$' -e '^.git$') /tmp/on/
if [ $rc -eq 0 ]; then
  for d in bfloat16 float32; do
    timeout 110 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/wgmma_forward_builds.py \
      --out $R/builds-$d --dtypes $d --variants base tma=TMA:1 > $R/builds-$d.log 2>&1
    echo "probe $d rc=$? at $SECONDS s"; grep "^|" $R/builds-$d/wgmma-forward-builds.md | cut -d'|' -f2-10
    save
  done
  on=$(python3 - <<'PY'
import json
rows = []
for d in ("bfloat16", "float32"):
    try:
        rows += json.load(open(f"/tmp/s34c1/builds-{d}/wgmma-forward-builds.json"))["rows"]
    except (OSError, ValueError, KeyError):
        pass
out = {}
for width in (64, 128):
    mine = [r for r in rows if ("layer1" in r["layer"]) == (width == 64) and "tma" in r]
    out[width] = bool(mine) and sum(r["tma"] for r in mine) < 0.98 * sum(r["base"] for r in mine)
print("{128: %s, 64: %s, 256: False}" % (out[128], out[64]))
PY
)
  echo "FORWARD_TMA chosen: $on"
  sed -i "s/^FORWARD_TMA: dict\[int, bool\] = .*/FORWARD_TMA: dict[int, bool] = $on/" \
    /tmp/on/minidnn/primitives/conv/implicit_gemm_wgmma.py
  grep -n "^FORWARD_TMA" /tmp/on/minidnn/primitives/conv/implicit_gemm_wgmma.py | tee $R/forward-tma.txt
fi
(cd /tmp/on && timeout 200 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests \
   > $R/suite.log 2>&1; echo "suite (on /tmp/on) rc=$? at $SECONDS s")
tail -1 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head -20; save
mutant() {  # name, sed expression, file, test file, -k
  rm -rf /tmp/mut; mkdir /tmp/mut; cp -r minidnn tests pyproject.toml /tmp/mut/
  sed -i "$2" /tmp/mut/$3; diff $3 /tmp/mut/$3 > $R/mutant-$1.diff
  (cd /tmp/mut && timeout 60 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 $4 \
     -k "$5" > $R/mutant-$1.log 2>&1; echo "mutant $1 rc=$? (want 1), diff lines $(grep -c '^<' $R/mutant-$1.diff)")
  tail -1 $R/mutant-$1.log
}
mutant tma-taps 's/(tap - r \* s.S) \* s.dilation_w, r \* s.dilation_h);/r * s.dilation_h, (tap - r * s.S) * s.dilation_w);/' \
  minidnn/primitives/conv/implicit_gemm_wgmma.cu tests/test_conv_wgmma.py "tma and bfloat16"
save
left=$((545 - SECONDS)); echo "== ab at $SECONDS s, budget $left s"
if grep -q True $R/forward-tma.txt 2>/dev/null && [ $left -gt 90 ]; then
  timeout $((left + 15)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=. --tree tma=/tmp/on --torch \
    --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet18:128:bf16,resnet50:128:bf16 --budget-seconds $left \
    --timeout 100 --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last" \
    --out $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? at $SECONDS s"; grep "^|" $R/ab/ab.md 2>/dev/null | head -12; tail -1 $R/ab.log
  rm -f $R/ab/*/bench.png
fi
save; echo done at $SECONDS
