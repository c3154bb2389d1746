"""Suite-wide set-up: a per-checkout cache folder for the tiny K3 checkpoint (hermetic, reused)."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("K3_CACHE_DIR", str(REPO / ".k3-cache"))
