"""Benchmark harness of sb3-safe: ``python -m benchmarks run overhead|learning|stress [--quick]``."""
