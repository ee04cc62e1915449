"""Bandwidth caps in GB/s: a job held at a cap by MBA (issue #27)."""
