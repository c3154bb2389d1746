"""K3 kernels: a pure-PyTorch reference per family (`<family>/naive.py`), portable Triton kernels beside it, and
`dispatch` choosing between them by device.

Import as `k3_sglang.kernels` (the folder is mapped there by setup.py; `kernels` is Hugging Face's package).
Nothing heavy is imported here: Triton modules load only when a Triton op is first dispatched.
"""
