"""Benchmarks: each prints a table, writes JSON under bench/out/, and reports a ratio
against a baseline measured in the same run."""
