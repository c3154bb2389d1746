"""Benchmarks run by `k3 bench TARGET`."""
