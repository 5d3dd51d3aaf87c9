#!/bin/bash
# Session 29, call 1 (carry scratch/pylib, scratch/calls, scratch/s29), tree 1626d99:
# 1. the whole GPU suite (first GPU run of b7cf6a6 and 8116cd0, and of 1626d99's convert.add layout rule);
# 2. a removal check of 1626d99: convert.add's old rule back, its layout test must fail;
# 3. batch norm's channels-last kernels one by one (scratch/s29/bn_tail.py with bn-tail-macros.patch applied to this
#    copy): how long the last block's merge of the splits takes, and fewer splits;
# 4. the batch-norm probe (forward and backward per call, PyTorch beside), float32 and bfloat16, where time is left.
set -u
R=/tmp/s29c1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/s29c1.tgz -C /tmp s29c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
export PYTHONUNBUFFERED=1; P=$PWD/scratch/pylib
timeout 220 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/suite.log 2>&1
echo "suite rc=$? at $SECONDS s"; tail -2 $R/suite.log; grep -E "^(FAILED|ERROR)" $R/suite.log | head; save
cp minidnn/primitives/convert.py /tmp/convert.py.kept
python3 - <<'PY'
p = 'minidnn/primitives/convert.py'; s = open(p).read()
new = '''    channels_last = layout.is_channels_last(a)
    a, b = layout.like(a, channels_last), layout.like(b, channels_last)
'''
assert new in s; open(p, 'w').write(s.replace(new, '    (a, b), channels_last = layout.common((a, b))\n'))
PY
timeout 60 env PYTHONPATH=.:$P python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_memory_format.py \
  -k "first_operand or max_pooling_on_channels_last" > $R/removal.log 2>&1
echo "removal check rc=$? (must be 1)"; tail -1 $R/removal.log; cp /tmp/convert.py.kept minidnn/primitives/convert.py
git apply scratch/s29/bn-tail-macros.patch && echo patched
timeout 280 env PYTHONPATH=.:$P python3 scratch/s29/bn_tail.py $R/bn-tail.json > $R/bn-tail.log 2>&1
echo "bn-tail rc=$? at $SECONDS s"; tail -3 $R/bn-tail.log | cut -c1-300; save
git apply -R scratch/s29/bn-tail-macros.patch
left=$((570 - SECONDS)); [ $left -gt 60 ] && timeout $((left - 10)) env PYTHONPATH=.:$P:benchmarks/probes python3 \
  benchmarks/probes/batch_norm_kernels.py --channels-last --dtypes float32,bfloat16 --out $R/bn > $R/bn.log 2>&1
echo "bn rc=$? at $SECONDS s"; grep "^|" $R/bn/batch-norm.md 2>/dev/null | tail -3 || tail -5 $R/bn.log; save
