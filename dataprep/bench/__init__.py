"""Measurement helpers shared by `dataprep demo` and `benchmarks/`."""
