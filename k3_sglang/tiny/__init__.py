"""The tiny K3 checkpoint: deterministic random weights, a small BPE tokenizer, the XTML template."""
