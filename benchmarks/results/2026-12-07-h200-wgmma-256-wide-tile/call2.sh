#!/bin/bash
# 2026-12-07 session 21, call 2 (carry scratch/pylib), on the machine call 1 left warm: the TF32 wgmma kernel alone
# at 128 and 256 wide (three and four stages) against cuDNN's TF32 (wgmma_tile_width.py). The tree was dcef8ac with
# scratch/wgmma-n256.patch applied (not committed): 27ab17e's kernel code, its rule then 256 for every TF32 product
# of more than 128 columns that 256-wide tiles fill as well (the report's "rule" column).
nvidia-smi --query-gpu=name --format=csv,noheader; timeout 105 env PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks/probes:scratch/pylib python3 benchmarks/probes/wgmma_tile_width.py --out $OUT/width 2>&1 | grep -v Warning | tail -30
