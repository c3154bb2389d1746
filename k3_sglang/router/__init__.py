"""`k3 router`: a session-placing HTTP router in front of N SGLang workers.

Layout:
- `config`      frozen dataclasses (RouterConfig, WorkerSpec, PolicyConfig, ReliabilityConfig) + YAML loader
- `cost_model`  K3 capacity constants and the TTFT / KV-barrier formulas (pure)
- `prefix`      chained block hashes of a token or text prefix, an LRU prefix index (pure)
- `fleet`       worker and session state, the in-flight ledger, TTL expiry (pure, time passed in)
- `policy`      the placement decision for one request (pure)
- `session_key` session identity from headers or the conversation's opening
- `breaker`, `health`, `capacity`   reliability and capacity discovery (I/O at the edges)
- `proxy`, `app`, `metrics`, `errors`   the thin HTTP layer
- `threaded`    an app in a background thread on its own loop

Trace replay, baseline policies, synthetic traces, the mock worker and the router benchmarks are tooling
(`k3_sglang.tooling.router`); no router process imports them.
"""
