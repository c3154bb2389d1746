"""Reading an SGLang command line as `k3 serve` composes it (a flag given as `--flag value` or `--flag=value`)."""
from __future__ import annotations


def has_flag(args: list[str], flag: str) -> bool:
    """Whether `flag` appears in `args`, in either form."""
    return any(a == flag or a.startswith(flag + "=") for a in args)


def flag_value(args: list[str], flag: str, default: str | None = None) -> str | None:
    """The first value given to `flag` in `args`, or `default`."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return default
