#!/usr/bin/env bash
# One batched GPU session (see docs/gpu.md): the gpu-marked tests, a short training run on the GPU,
# and the benchmark, every log and result under $OUT (the device tool brings that folder back).
#   usage: tools/gpu_checks.sh [tests] [train] [bench]   (default: all three)
# The benchmark runs every cell in its own process (docs/benchmarks.md) and stops starting cells
# after BENCH_BUDGET seconds (default 480, so one session command of 10 minutes holds it); run the
# suite in parts and merge them here afterwards, e.g.
#   BENCH_ARGS="--models caffenet" BENCH_NAME=caffenet tools/gpu_checks.sh bench
#   BENCH_ARGS="--models resnet18,resnet20" BENCH_NAME=resnets tools/gpu_checks.sh bench
#   python benchmarks/bench.py --merge caffenet.json resnets.json --name h200
set -uo pipefail
cd "$(dirname "$0")/.."  # the repository root: the paths below are relative to it
OUT=${OUT:-/tmp/minidnn-gpu}
mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
steps=${*:-tests train bench}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [[ " $steps " == *" tests "* ]]; then
  start=$(date +%s)
  python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" --timeout=120 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  echo "gpu tests: $(( $(date +%s) - start )) s"
fi
if [[ " $steps " == *" train "* ]]; then
  python3 train.py --device cuda --model resnet20 --epochs 3 --out "$OUT/resnet20_cuda" 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tail -12 | tee "$OUT/train_cuda.log"
fi
if [[ " $steps " == *" bench "* ]]; then
  # shellcheck disable=SC2086 - BENCH_ARGS is a list of arguments
  python3 benchmarks/bench.py --out "$OUT" --name "${BENCH_NAME:-bench}" --budget-seconds "${BENCH_BUDGET:-480}" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/${BENCH_NAME:-bench}.log" | tail -60
fi
