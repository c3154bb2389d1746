"""K3_CSV: confidence-scheduled speculative verification for SGLang's K3 (docs/spec.md)."""
