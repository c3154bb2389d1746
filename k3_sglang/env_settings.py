"""The one place `K3_*` environment variables are read: frozen pydantic models parsed once per process.

Each settings model names its variables by a prefix and its field names (`K3_` + `max_n` = `K3_MAX_N`); an unset or
empty variable keeps the field's default; a field whose type is itself an `EnvModel` is a section parsed from the
same environment (WorkerSettings.spec: the `K3_SPEC_*` variables). pydantic checks types, choices (`Literal`) and
bounds; a bad value is a ValueError naming the variable, e.g. `K3_MAX_N must be an integer, got 'zero'`.

One model per process kind: `ServeSettings` (serving/settings.py) for the `k3 serve` process, `WorkerSettings`
(worker_settings.py) for SGLang's server processes (K3_CSV's `SpecSettings` is its `spec` section). Two concerns
have their own small models, read where they act: `KvEventsSettings` (serving/kv_events_config.py, `k3 serve`) and `RetentionSettings` (serving/retention.py, `k3 serve` and SGLang's
scheduler), `HiCacheSettings` (hicache/settings.py, SGLang's scheduler), `GuardSettings` (sglang_guard.py, every K3 process:
K3_ALLOW_SGLANG_VERSION). The router, planner and launch renderer read no environment (their input is flags and YAML).
Two variables are not settings but `k3 serve`'s hand-off to its server processes: K3_DEPLOYMENT (the deployment
decision as JSON, k3_sglang/deployment.py) and K3_SERVE_HOOKS.
"""
from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, EnvModel)


def _choices(annotation: Any) -> tuple[str, ...]:
    """The strings of a Literal[...] (or Literal[...] | None) annotation."""
    if typing.get_origin(annotation) is typing.Literal:
        return tuple(str(a) for a in typing.get_args(annotation))
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return _choices(arg)
    return ()


class EnvModel(BaseModel):
    """Base of the settings models: frozen, unknown fields refused, `from_env` reads ENV_PREFIX + FIELD_NAME."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    ENV_PREFIX: ClassVar[str] = "K3_"

    @classmethod
    def env_name(cls, field: str) -> str:
        return cls.ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None):
        """Parse the settings from `environ` (default os.environ); ValueError names the bad variable."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            if _is_section(field.annotation):
                values[name] = field.annotation.from_env(env)
                continue
            raw = env.get(cls.env_name(name), "").strip()
            if raw:
                values[name] = raw
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ValueError(cls._message(exc.errors()[0], values)) from None

    @classmethod
    def _message(cls, error: dict, values: dict[str, Any]) -> str:
        if not error["loc"]:  # a model-level check (model_validator): its own message
            return str(error.get("ctx", {}).get("error", error["msg"]))
        field = str(error["loc"][0])
        name, raw = cls.env_name(field), values.get(field)
        kind, ctx = error["type"], error.get("ctx", {})
        if kind == "literal_error":
            return f"{name} must be one of {', '.join(_choices(cls.model_fields[field].annotation))}, got {raw!r}"
        if kind in ("int_parsing", "int_type", "int_from_float"):
            return f"{name} must be an integer, got {raw!r}"
        if kind == "greater_than_equal":
            return f"{name} must be >= {ctx['ge']}, got {raw}"
        if kind == "value_error":
            return f"{name}: {ctx.get('error', error['msg'])}"
        return f"{name}: {error['msg']}, got {raw!r}"
