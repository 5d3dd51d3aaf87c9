#!/bin/bash
# 2026-12-07 session 21, the last call (carry scratch/pylib): the whole GPU suite on main (no GPU code changed since
# 678642e), the first full run since 05697d2.
set -u
R=/tmp/r6; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r6.tgz -C /tmp r6; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
git log -1 --format=%h > $R/tree.txt 2>/dev/null; git status --short | grep -v "^??" | head -12 >> $R/tree.txt
export PYTHONUNBUFFERED=1
timeout 270 env PYTHONPATH=.:$PWD/scratch/pylib python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests > $R/tests.log 2>&1
echo "tests rc=$? at $SECONDS s"; tail -3 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -20; save
