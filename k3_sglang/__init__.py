"""k3-sglang: a long-context Kimi K3 serving runtime built on SGLang.

Heavy modules (torch, sglang) are imported lazily by the pieces that need them, so
`import k3_sglang` and `k3 --help` stay fast.
"""

__version__ = "0.1.0"
PORTABLE_PACKAGE = "k3_sglang.models"  # the portable model, registered through SGLANG_EXTERNAL_MODEL_PACKAGE

from k3_sglang import _checkout  # noqa: E402

_checkout.install(__path__[0])
