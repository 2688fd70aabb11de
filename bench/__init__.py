"""Benchmarks of Carmy against its baselines: ``python -m bench.run`` (see bench/README.md)."""
