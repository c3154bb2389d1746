"""`k3 serve`: SGLang's own server with K3 registered, on CPU or GPU."""
