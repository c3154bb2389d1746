"""Shared test helpers (numerics)."""
