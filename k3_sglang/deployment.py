"""One deployment decision: on which platform, with which SGLang command line, parsed once.

`k3 serve` parses the user's SGLang flags once with SGLang's own parser (`ServerArgs.add_cli_args`, a `--config`
YAML merged exactly as SGLang's `prepare_server_args` merges it) into a frozen `Deployment`: the platform SGLang's
K3 (`sglang.srt.models.kimi_k3`, the one model) runs on (k3_cpu or cuda), the parallel sizes, the speculative
algorithm, the PD mode, HiCache, dtype, chunked prefill, KV events, and `given` (every SGLang field the user set, on the command line or in the
YAML). Our defaults, the limits, the server environment and `serving/launch.py` read that object; nothing scans the
raw command line. A flag set in a `--config` file is therefore seen exactly as the same flag on the command line.

SGLang's server processes get the decision through one variable, `K3_DEPLOYMENT` (JSON, written by `k3 serve`), which
the plugins' "does this apply" read (`current()`), instead of re-deriving it from the environment. A server SGLang
started without `k3 serve` (plain `sglang serve` with `SGLANG_PLATFORM=k3_cpu`) has no such variable: `current()`
then reads SGLang's own platform selector, in this one place.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

ENV_VAR = "K3_DEPLOYMENT"
PLATFORM_CPU = "k3_cpu"  # k3_sglang.platform.PLATFORM_NAME (not imported: that module stays import-light)
PlatformName = Literal["k3_cpu", "cuda"]


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit; we want one clear CLI error
        raise ValueError(f"SGLang does not accept this command line: {message}")


@functools.lru_cache(maxsize=2)
def _parser(suppress_defaults: bool) -> argparse.ArgumentParser:
    """SGLang's server parser with our attention backends among its choices; with suppress_defaults, a copy that
    leaves every field the command line does not set out of the namespace (and requires nothing)."""
    from sglang.srt.server_args import ServerArgs

    from k3_sglang.dcp_mla import add_backend_choice as add_dcp_backend_choice
    from k3_sglang.sglang_cpu import add_backend_choice

    add_backend_choice()  # the k3_cpu_mla and k3_dcp_mla backends our plugins register in SGLang's processes
    add_dcp_backend_choice()
    parser = _RaisingParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    if suppress_defaults:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
            action.required = False
    return parser


def _merge_config(argv: list[str]) -> list[str]:
    """argv with a `--config` YAML's flags merged in as SGLang merges them (config first, the command line wins)."""
    if "--config" not in argv:
        return list(argv)
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    try:
        return ConfigArgumentMerger(_parser(False)).merge_config_with_args(list(argv))
    except Exception as exc:  # noqa: BLE001 - a missing, unreadable or malformed YAML file: one clear error
        raise ValueError(f"--config: {exc}") from None


def parse_sglang_argv(argv: list[str]) -> argparse.Namespace:
    """SGLang's own parse of a server command line (its parser, `--config` YAML merged as SGLang does), without
    ServerArgs resolution. Raises ValueError for a command line SGLang would reject."""
    return _parser(False).parse_args(_merge_config(argv))


def given_fields(argv: list[str]) -> frozenset[str]:
    """The SGLang fields (dest names) `argv` sets, on the command line or in its `--config` YAML (aliases such as
    --tp / --tp-size count as one field)."""
    return frozenset(vars(_parser(True).parse_args(_merge_config(argv))))


def dest_of(flag: str) -> str:
    """SGLang's field (dest) for a flag, e.g. "--tp" -> "tp_size"."""
    action = _parser(False)._option_string_actions.get(flag)
    if action is None:
        raise KeyError(f"SGLang has no flag {flag}")
    return action.dest


def _int(args, name: str, default: int = 1) -> int:
    value = getattr(args, name, None)
    return default if value is None else int(value)


def _str(args, name: str, default: str | None = None) -> str | None:
    value = getattr(args, name, None)
    value = getattr(value, "value", value)  # enums compare by their string value
    return default if value is None else str(value)


@dataclass(frozen=True)
class Deployment:
    """What `k3 serve` serves: the platform SGLang's K3 runs on, and the SGLang settings that decide our defaults, limits,
    environment and plugins. `given`: the SGLang fields the user set (a default of ours yields to each).
    `args`: SGLang's parsed namespace of the same command line (what the limits read); not carried to the server
    processes."""

    platform: PlatformName = "k3_cpu"
    tp: int = 1
    ep: int = 1
    dcp: int = 1
    pp: int = 1
    dp: int = 1
    speculative_algorithm: str | None = None
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str | None = None
    hicache: bool = False
    hicache_storage_backend: str | None = None
    dtype: str = "auto"
    chunked_prefill_size: int | None = None
    kv_events_config: str | None = None
    skip_tokenizer_init: bool = False
    dynamic_chunking: bool = False
    given: frozenset[str] = frozenset()
    args: argparse.Namespace | None = field(default=None, compare=False, repr=False)

    # -- what the decision implies --------------------------------------------------------------------------------
    @property
    def on_cpu(self) -> bool:
        return self.platform == PLATFORM_CPU

    @property
    def sglang_cpu(self) -> bool:
        """SGLang's own K3 on the k3_cpu platform (our CPU kernels plugged into its seams, k3_sglang/sglang_cpu)."""
        return self.on_cpu

    @property
    def ranks(self) -> int:
        """Processes one server starts (TP x PP)."""
        return self.tp * self.pp

    @property
    def k3_csv(self) -> bool:
        return (self.speculative_algorithm or "").upper() == "K3_CSV"

    @property
    def pd(self) -> bool:
        return self.disaggregation_mode != "null"

    def sets(self, name: str) -> bool:
        """Whether the user set SGLang field `name` (dest name, e.g. "max_total_tokens")."""
        return name in self.given

    # -- building and carrying it ---------------------------------------------------------------------------------
    @classmethod
    def from_argv(cls, argv: list[str], platform: PlatformName = PLATFORM_CPU,
                  model_path: str | None = None) -> Deployment:
        """Parse the user's SGLang flags once (SGLang's parser, `--config` merged). model_path is prepended when
        given (SGLang requires one; `k3 serve` takes it as its own flag). Raises ValueError for a command line
        SGLang would reject."""
        argv = list(argv)
        full = ["--model-path", str(model_path or ".")] + argv
        args = parse_sglang_argv(full)
        return cls.from_args(args, given_fields(argv), platform)

    @classmethod
    def from_args(cls, args, given: frozenset[str] = frozenset(),
                  platform: PlatformName = PLATFORM_CPU) -> Deployment:
        """The decision read from SGLang's argument names (a parsed namespace or a ServerArgs)."""
        speculative = _str(args, "speculative_algorithm")
        return cls(
            platform=platform, tp=_int(args, "tp_size"), ep=_int(args, "ep_size"),
            dcp=_int(args, "dcp_size"), pp=_int(args, "pp_size"), dp=max(1, _int(args, "dp_size")),
            speculative_algorithm=speculative.upper() if speculative else None,
            disaggregation_mode=_str(args, "disaggregation_mode", "null"),
            disaggregation_transfer_backend=_str(args, "disaggregation_transfer_backend"),
            hicache=bool(getattr(args, "enable_hierarchical_cache", False)),
            hicache_storage_backend=_str(args, "hicache_storage_backend"),
            dtype=_str(args, "dtype", "auto"),
            chunked_prefill_size=getattr(args, "chunked_prefill_size", None),
            kv_events_config=_str(args, "kv_events_config"),
            skip_tokenizer_init=bool(getattr(args, "skip_tokenizer_init", False)),
            dynamic_chunking=bool(getattr(args, "enable_dynamic_chunking", False)),
            given=frozenset(given), args=args)

    def sets_flag(self, flag: str) -> bool:
        """Whether the user set the SGLang field behind `flag` (any of its spellings, or its YAML key)."""
        return dest_of(flag) in self.given

    def applied(self, flags: list[str]) -> Deployment:
        """This deployment with `flags` (ours: defaults for fields the user left unset) applied onto its parsed
        namespace by SGLang's parser, the user's own fields untouched: what the server will run."""
        args = _parser(True).parse_args(list(flags), namespace=copy.copy(self.args))
        added = given_fields(flags)
        return Deployment.from_args(args, self.given | added, self.platform)

    def to_json(self) -> str:
        """The decision as the JSON `K3_DEPLOYMENT` carries (no namespace; `given` as a sorted list)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("args", "given")}
        return json.dumps({**data, "given": sorted(self.given)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Deployment:
        try:
            data = json.loads(text)
            data["given"] = frozenset(data.get("given", ()))
            data.pop("model", None)  # written by a k3 serve from before the portable model retired
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{ENV_VAR} is not a deployment k3 serve wrote: {exc}") from None

    def env(self) -> dict[str, str]:
        """The variable that hands this decision to SGLang's server processes."""
        return {ENV_VAR: self.to_json()}


def coerce(deployment: Deployment | list[str]) -> Deployment:
    """A Deployment, or one parsed from a raw SGLang flag list (callers and tests outside `k3 serve`)."""
    return deployment if isinstance(deployment, Deployment) else Deployment.from_argv(list(deployment))


def current(environ: Mapping[str, str] | None = None) -> Deployment | None:
    """The deployment of this (server) process: `K3_DEPLOYMENT` when `k3 serve` started it; else, for a server
    started another way, what SGLang's own selector says (SGLANG_PLATFORM=k3_cpu; with only K3_SERVE_HOOKS=1,
    SGLang's K3 on CUDA); None where K3 is not in play (plain SGLang on a GPU host)."""
    from k3_sglang.serving.kv_events_config import HOOKS_ENV

    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR, "").strip()
    if raw:
        return Deployment.from_json(raw)
    on_cpu = env.get("SGLANG_PLATFORM") == PLATFORM_CPU
    if not (on_cpu or env.get(HOOKS_ENV) == "1"):
        return None
    return Deployment(platform=PLATFORM_CPU if on_cpu else "cuda")
