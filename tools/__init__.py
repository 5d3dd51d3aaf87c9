"""Command-line tools and test runners that sit beside the library: the micro-batch planner (plan.py) and the
batched GPU session (gpu_checks.sh). Not part of the installed package."""
