"""Benchmarks: ``python -m bench --help``. Figures are medians and p99, and ratios
against a baseline measured in the same run."""
