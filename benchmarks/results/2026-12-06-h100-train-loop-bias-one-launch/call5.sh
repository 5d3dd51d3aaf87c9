#!/bin/bash
# 2026-12-06 session 10, call 5: why train.py's third eager epoch on shapes10 starts slowly (ResNet-20 b128):
# train.py under cProfile (3 epochs), then train.py plain for 4 epochs.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/r.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt 2>&1; cat $R/machine.txt
P=$PWD/scratch/pylib
export PYTHONUNBUFFERED=1
timeout 150 env PYTHONPATH=.:$P python3 -m cProfile -o $R/train.prof train.py --model resnet20 --batch-size 128 \
  --device cuda --epochs 3 --data shapes10 --out /tmp/run1 --workers 0 --no-cuda-graph --train-size 20000 \
  --test-size 2000 > $R/profiled.log 2>&1; echo "profiled rc=$? at $SECONDS s"
cp /tmp/run1/metrics.jsonl $R/profiled-metrics.jsonl 2>/dev/null
python3 -c "
import pstats; s=pstats.Stats('$R/train.prof'); s.sort_stats('cumulative').print_stats(70)" > $R/profile-cumulative.txt 2>&1
python3 -c "
import pstats; s=pstats.Stats('$R/train.prof'); s.sort_stats('tottime').print_stats(40)" > $R/profile-tottime.txt 2>&1
save
timeout 120 env PYTHONPATH=.:$P python3 train.py --model resnet20 --batch-size 128 \
  --device cuda --epochs 4 --data shapes10 --out /tmp/run2 --workers 0 --no-cuda-graph --train-size 20000 \
  --test-size 2000 > $R/plain.log 2>&1; echo "plain rc=$? at $SECONDS s"
cp /tmp/run2/metrics.jsonl $R/plain-metrics.jsonl 2>/dev/null
python3 -c "
import json
for f in ('profiled','plain'):
    try: print(f, [r['images_per_second'] for r in map(json.loads, open('$R/'+f+'-metrics.jsonl'))])
    except Exception as e: print(f, e)"
save
echo done at $SECONDS
