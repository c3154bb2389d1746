"""k3-sglang: a long-context Kimi K3 serving runtime built on SGLang.

Heavy modules (torch, sglang) are imported lazily by the pieces that need them, so
`import k3_sglang` and `k3 --help` stay fast.
"""

__version__ = "0.1.0"

from k3_sglang import _checkout  # noqa: E402

_checkout.install(__path__[0])
