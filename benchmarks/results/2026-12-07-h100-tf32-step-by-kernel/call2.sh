#!/bin/bash
# 2026-12-07 session 22, call 2 (carry scratch/pylib), on the machine call 1 left warm, same tree: ResNet-50 b128
# TF32 channels-last captured beside PyTorch's TF32 channels_last, each in its own process.
R=/tmp/r4; mkdir -p $R; P=$PWD/scratch/pylib; export PYTHONUNBUFFERED=1; timeout 280 env PYTHONPATH=$P python3 benchmarks/ab.py --tree new=. --torch --engine minidnn-graph --rounds 1 --cpus 0-3 --cells resnet50:128:tf32 --budget-seconds 250 --timeout 120 --bench-args="--no-layers --no-agreement --warmup 2 --steps 10 --profile-steps 1 --channels-last --torch-channels-last" --out $R/ab-r50-cl > $R/ab-r50.log 2>&1; echo "rc=$? $SECONDS"; grep "^|" $R/ab-r50-cl/ab.md; rm -f $R/*/*/bench.png; tar czf $OUT/r4.tgz -C /tmp r4
