"""K3_CSV: confidence-scheduled speculative verification for the portable K3 inside SGLang (docs/spec.md)."""
