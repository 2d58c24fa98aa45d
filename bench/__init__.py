"""headrace benchmark suite: ``make bench`` / ``python -m bench.run`` (see docs/benchmarks.md)."""
