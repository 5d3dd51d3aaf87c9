#!/bin/bash
# Session 33, call 1. Tree = main e005ddb + the forward kernel's PRODUCER build (uncommitted; off by default).
# 1. the PRODUCER build's GPU test (bit for bit the barrier build's); 2. wgmma_forward_builds.py: base against
# PRODUCER pipelines (128 rows; 256 rows in bf16), bf16 and TF32, cuDNN beside; 3. the whole GPU suite; 4. LRN's channels-last GPU test
# against two value mutants (must go red); 5. the PRODUCER test against a mutant (B always from column tile 0).
set -u
END=${END:-560}
R=/tmp/s33c1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s33c1.tgz -C /tmp s33c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 150 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_wgmma.py \
  -k producer > $R/producer-tests.log 2>&1
rc=$?; echo "producer tests rc=$rc at $SECONDS s"; tail -1 $R/producer-tests.log
grep -E "^(FAILED|ERROR)" $R/producer-tests.log | head -10; save
if [ $rc -le 1 ]; then
  for d in bfloat16 float32; do
    v="base p3=PRODUCER_STAGES:3 p4f1=PRODUCER_STAGES:4,PRODUCER_IN_FLIGHT:1 p6f1=PRODUCER_STAGES:6,PRODUCER_IN_FLIGHT:1"
    [ $d = bfloat16 ] && v="$v r256=PRODUCER_STAGES:3,PRODUCER_IN_FLIGHT:1,PRODUCER_ROWS:256"
    timeout 120 env PYTHONPATH=.:benchmarks/probes:$P python3 benchmarks/probes/wgmma_forward_builds.py \
      --out $R/builds-$d --dtypes $d --variants $v > $R/builds-$d.log 2>&1
    echo "probe $d rc=$? at $SECONDS s"; grep "^|" $R/builds-$d/wgmma-forward-builds.md | cut -d'|' -f2-15
    save
  done
fi
timeout 220 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -1 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head -20; save
mutant() {  # name, sed expression, file, test file, -k
  rm -rf /tmp/mut; mkdir /tmp/mut; cp -r minidnn tests pyproject.toml /tmp/mut/
  sed -i "$2" /tmp/mut/$3; diff $3 /tmp/mut/$3 > $R/mutant-$1.diff
  (cd /tmp/mut && timeout 90 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 $4 \
     -k "$5" > $R/mutant-$1.log 2>&1; echo "mutant $1 rc=$? (want 1), diff lines $(grep -c '^<' $R/mutant-$1.diff)")
  tail -1 $R/mutant-$1.log
}
mutant lrn-forward 's/j <= last; ++j) {/j < last; ++j) {/' minidnn/primitives/lrn.cu tests/test_primitives_lrn.py \
  channels_last
mutant lrn-backward 's/j <= last; ++j) window += acc_t(ratio/j < last; ++j) window += acc_t(ratio/' \
  minidnn/primitives/lrn.cu tests/test_primitives_lrn.py channels_last
mutant producer-column 's/tile % n_tiles \* BLOCK_N + copy_row,$/copy_row,/' \
  minidnn/primitives/conv/implicit_gemm_wgmma.cu tests/test_conv_wgmma.py "producer and two_column and bfloat16"
save
