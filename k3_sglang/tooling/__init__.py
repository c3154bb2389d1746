"""Tooling, not product: benchmarks (`k3 bench`), simulators, trace replay and the mock worker.

No server or router process imports this package (tests/unit/test_runtime_layout.py checks it); the CLI reaches it
lazily (`k3 bench ...`, `k3 router replay`, `k3 router make-trace`)."""
