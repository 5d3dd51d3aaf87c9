"""Names Python resolves only when a line runs, checked statically: code that only a GPU or several ranks reach
(the NCCL backend, the CUDA paths) never runs on the CPU machines, so a misspelt name or a closure that assigns
a variable it reads (Python then treats it as local: UnboundLocalError) would first fail on a GPU.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ["minidnn", "train.py", "tools", "examples", "models"]
# F821: an undefined name; F823: a local variable read before it is assigned (e.g. `x /= 2` inside a closure).
RULES = "F821,F823"


def test_the_library_reads_no_name_it_never_defines():
    pytest.importorskip("ruff", reason="the dev extra brings ruff (pip install -e '.[dev]')")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", RULES,
                           "--output-format", "concise", *CHECKED], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
