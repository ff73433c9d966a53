"""Benchmarks: side-by-side measurements with JSON and plots. Nothing in the product imports this package."""
