"""Typed field checks for the planner's dataclasses and YAML/JSON loaders.

Each check raises ValueError naming the field, so `k3 plan` can report exactly which input is
wrong. Booleans are rejected where numbers are expected (YAML reads `yes` as True).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, Iterable


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def require_int(name: str, value: Any, minimum: int = 1) -> int:
    """An int >= minimum (default: positive)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def require_float(name: str, value: Any, low: float = 0.0, high: float | None = None,
                  low_inclusive: bool = False) -> float:
    """A number in (low, high] (or [low, high] with low_inclusive), returned as float."""
    if not _is_number(value):
        raise ValueError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    value = float(value)
    too_low = value < low if low_inclusive else value <= low
    if too_low or (high is not None and value > high):
        bound = f"{'[' if low_inclusive else '('}{low}, {high if high is not None else 'inf'}]"
        raise ValueError(f"{name}: must be in {bound}, got {value}")
    return value


def require_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """One of a fixed set of strings."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}: unknown value {value!r}; choose from {', '.join(choices)}")
    return value


def require_str(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
    return value


def require_bool(name: str, value: Any) -> bool:
    """A real boolean (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    return value


def require_mapping(name: str, value: Any) -> dict:
    """A mapping (YAML object)."""
    if not isinstance(value, dict):
        raise ValueError(f"{name}: expected a mapping, got {type(value).__name__} {value!r}")
    return value


def build_dataclass(cls: type, data: Any, prefix: str) -> Any:
    """Construct a frozen dataclass from a mapping, rejecting unknown keys by name.

    Lists become tuples (the dataclasses are frozen and hashable). Field checks happen in the
    dataclass's own __post_init__, with `prefix` prepended to their messages.
    """
    assert is_dataclass(cls)
    data = require_mapping(prefix, data)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{prefix}.{unknown[0]}: unknown field; known fields are {', '.join(sorted(known))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    try:
        return cls(**values)
    except ValueError as exc:
        raise ValueError(f"{prefix}.{exc}") from None
    except TypeError as exc:  # a required field is missing
        raise ValueError(f"{prefix}: {exc}") from None
