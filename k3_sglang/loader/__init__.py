"""Checkpoint layout for K3: expected-tensor manifest, name mapping and weight loading."""
