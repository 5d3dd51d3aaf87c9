#!/bin/bash
# 2026-12-07 session 21, calls 3 to 5 (carry scratch/pylib), each on the machine the call before left warm, on
# call 2's tree: the GPU tests of the 256-wide tile (device time left: 66, 51 and 34 s). Their output tails are in
# test-runs/2026-12-07-27ab17e-kernel-touched-files.log.
timeout 58 env PYTHONPATH=.:scratch/pylib python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_wgmma.py -k "tf32" 2>&1 | tail -4
timeout 44 env PYTHONPATH=.:scratch/pylib python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_wgmma.py 2>&1 | tail -3
timeout 27 env PYTHONPATH=.:scratch/pylib python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_conv_nhwc.py 2>&1 | tail -2
