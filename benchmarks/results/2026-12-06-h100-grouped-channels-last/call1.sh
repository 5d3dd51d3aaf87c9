#!/bin/bash
# 2026-12-06 session 17, call 1 (carry scratch/pylib, scratch/base, this script): the whole GPU suite on the grouped
# channels-last kernels; two GPU removal checks (wgmma's group offset of x; the forward gather's pixel stride);
# CaffeNet b256 bf16 captured, base (main 07c54cd: grouped layers on implicit_gemm's mma.sync NCHW kernels) against
# the grouped channels-last kernels, PyTorch AMP beside (ab.py, one round), channels-last then NCHW; then the probe
# of CaffeNet's grouped bf16 layers in the time left.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%h > $R/tree.txt 2>/dev/null; git status --short | grep -v "^??" | head -5 >> $R/tree.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 320 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/gpu-suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/gpu-suite.log; grep -E "^(FAILED|ERROR)" $R/gpu-suite.log | head; save
broken() { # $1 name, $2 file, $3 sed expression: the grouped GPU tests with one line broken, then restored
  cp $2 /tmp/orig; sed -i "$3" $2; cmp -s $2 /tmp/orig && { echo "removal $1: sed changed nothing"; return; }
  timeout 80 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "groups" \
    tests/test_conv_wgmma.py tests/test_conv_nhwc.py > $R/removal-$1.log 2>&1
  echo "removal $1 rc=$? at $SECONDS s (expected 1)"; tail -1 $R/removal-$1.log; cp /tmp/orig $2; save; }
broken wgmma-group-x minidnn/primitives/conv/implicit_gemm_wgmma.cu 's/^    x += group \* s.C;$//'
broken gather-pixel-stride minidnn/primitives/conv/channels_last.cuh 's/(h \* s.W + w_) \* s.channels_in() + tap.c/(h * s.W + w_) * s.C + tap.c/'
git diff --stat | tail -1 > $R/restored.txt
for form in channels-last nchw; do
  extra=""; [ $form = channels-last ] && extra=" --channels-last"
  left=$((520 - SECONDS)); echo "== ab $form at $SECONDS s, budget $left s"
  [ $left -gt 60 ] && timeout $((left + 30)) env PYTHONPATH=$P python3 benchmarks/ab.py --tree base=scratch/base \
    --tree new=. --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells caffenet:256:bf16 \
    --budget-seconds $left --timeout 90 \
    --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1$extra" \
    --out $R/ab-$form > $R/ab-$form.log 2>&1
  echo "ab $form rc=$? at $SECONDS s"; grep "^|" $R/ab-$form/ab.md 2>/dev/null | head -8; tail -1 $R/ab-$form.log
  rm -f $R/ab-$form/*/bench.png; save
done
if [ $SECONDS -lt 500 ]; then
  timeout $((585 - SECONDS)) env PYTHONPATH=.:$P python3 benchmarks/probes/grouped_half_convolution.py \
    --out $R/probe > $R/probe.log 2>&1
  echo "probe rc=$? at $SECONDS s"; tail -12 $R/probe.log
fi
save; echo done at $SECONDS
