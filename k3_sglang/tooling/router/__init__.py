"""Router tooling: trace replay against a simulated fleet, synthetic traces, baseline policies, the mock worker
and the proxy / PD benchmarks."""
