#!/bin/bash
# 2026-12-06 session 5, call 1, tree 9ee0667 + the two probes: CuPy host costs, the step's host under a GPU backlog,
# and removal checks of session 4's GPU tests (each guarded line taken out of a copy of the tree: the test must fail).
set -u
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
nproc >> $R/machine.txt; lscpu | grep -E "Model name|MHz" >> $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONPATH=.:$P PYTHONUNBUFFERED=1
timeout 100 env MINIDNN_CACHE_DIR=/tmp/cache-hc python3 benchmarks/probes/host_costs.py --out $R/host-costs > $R/host-costs.log 2>&1
echo "host_costs rc=$?"; cat $R/host-costs/host-costs.md 2>/dev/null || tail -5 $R/host-costs.log; save
timeout 240 env MINIDNN_CACHE_DIR=/tmp/cache-bl python3 benchmarks/probes/step_host_under_backlog.py --out $R/backlog \
  --cells minidnn:resnet20:128:fp32,torch:resnet20:128:fp32,minidnn:resnet20:128:tf32,torch:resnet20:128:tf32,minidnn:resnet18:64:fp32,torch:resnet18:64:fp32 \
  > $R/backlog.log 2>&1
echo "backlog rc=$? at $SECONDS"; grep "^|" $R/backlog/backlog.md 2>/dev/null || tail -20 $R/backlog.log; save
# Removal checks: copy, take the line out, run the one test; "red" is what it must say.
removal() {  # name file old new test
  local d=/tmp/rm-$1; rm -rf $d; mkdir -p $d; cp -r minidnn tests models benchmarks pyproject.toml conftest.py $d/ 2>/dev/null
  python3 - "$d/$2" "$3" "$4" <<'PY' || { echo "$1: the line was not found"; return; }
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
assert text.count(old) == 1, text.count(old)
open(path, "w").write(text.replace(old, new))
PY
  (cd $d && timeout 120 env PYTHONPATH=.:$P MINIDNN_CACHE_DIR=/tmp/cache-rm python3 -m pytest -m gpu -q -p no:cacheprovider -x "$5" > $R/removal-$1.log 2>&1)
  if [ $? -eq 0 ]; then echo "$1: GREEN (the test does not guard the line)"; else echo "$1: red"; fi
}
{
removal conv-ready minidnn/primitives/conv/api.py "ready = _ready.get(key)" "ready = None" \
  tests/test_conv_call_cache.py::test_gpu_a_repeated_call_goes_from_its_key_to_its_launch
removal relu-kept minidnn/primitives/activation.py "else (key, _kept.get(key))" "else (key, None)" \
  "tests/test_primitives_activation.py::test_gpu_repeated_relu_calls_skip_the_checks_and_keep_their_bits"
removal bn-capture minidnn/primitives/batchnorm.py "if cupy.cuda.get_current_stream().is_capturing():" "if False:" \
  tests/test_primitives_batchnorm.py::test_gpu_kept_calls_allocate_only_their_results_and_nothing_is_kept_in_a_capture
removal bn-scratch minidnn/primitives/batchnorm.py "_launches[key] = launch._replace(scratch=scratch, coef=scratch[launch.coef_offset:])" "_launches[key] = launch" \
  tests/test_primitives_batchnorm.py::test_gpu_kept_calls_allocate_only_their_results_and_nothing_is_kept_in_a_capture
removal control minidnn/primitives/activation.py "_kept: dict[tuple, tuple] = {}" "_kept: dict[tuple, tuple] = {}" \
  "tests/test_primitives_activation.py::test_gpu_repeated_relu_calls_skip_the_checks_and_keep_their_bits"
} 2>&1 | tee $R/removals.txt
save
echo done at $SECONDS
