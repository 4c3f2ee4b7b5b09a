"""Benchmarks: scripts that print a table and write JSON with the machine facts.

Run them from the repository root, e.g. ``python -m bench.train_speed --quick``; results go to
``bench/results/``.
"""
