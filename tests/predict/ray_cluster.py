"""The real local Ray cluster of the `berth predict --ray` tests: `bench.local_processes.RayCluster` (the
benchmarks start the same one; a benchmark never imports the test tree)."""

from __future__ import annotations

from bench.local_processes import RayCluster, descendants

__all__ = ["RayCluster", "descendants"]
