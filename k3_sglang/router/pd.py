"""PD disaggregation facts the router needs: a server's role and KV layout, pairing checks, bootstrap fields.

SGLang's PD protocol (0.5.23, `disaggregation/`): the router sends the *same* request body to one
prefill and one decode server at once, with three extra fields. `bootstrap_host` and
`bootstrap_port` name the prefill server's bootstrap service (`--disaggregation-bootstrap-port`,
default 8998), and `bootstrap_room` (a random non-negative int) names this transfer on both sides.
The decode server preallocates KV pages and a KDA state slot, the prefill server computes the prompt
and writes MLA KV pages and the KDA state into them over Mooncake, then the decode server generates
and answers the client. A batched body carries one room per prompt (lists).

Two servers can pair only when their KV layouts agree: SGLang itself raises deep inside the decode
receiver on a page-size or KV-dtype mismatch (`common/conn.py`), so the router checks first and
refuses the pair with a message that names the field. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
ROOM_BITS = 63                 # bootstrap_room is a non-negative int64 on both sides
SGLANG_MODES = {"null": "mixed", "prefill": "prefill", "decode": "decode"}


@dataclass(frozen=True, slots=True)
class KVLayout:
    """How a server lays out the KV it sends or receives; a prefill and a decode server pair when equal.

    `kv_cache_dtype` is SGLang's flag value; under `auto` the cache takes the model dtype, so `dtype`
    is part of the layout too. `transfer_backend` is the KV transport (mooncake, nixl, ...).
    """

    page_size: int | None
    kv_cache_dtype: str | None
    dtype: str | None
    transfer_backend: str | None

    @property
    def effective_kv_dtype(self) -> str | None:
        """The KV cache dtype as stored: the flag, or `auto (<model dtype>)`."""
        if self.kv_cache_dtype in (None, "auto"):
            return None if self.dtype is None else f"auto ({self.dtype})"
        return self.kv_cache_dtype


def reported_role(info: Any) -> str | None:
    """mixed / prefill / decode from `/get_server_info`'s `disaggregation_mode` (None: not reported)."""
    mode = info.get("disaggregation_mode") if isinstance(info, Mapping) else None
    return SGLANG_MODES.get(mode) if isinstance(mode, str) else None


def reported_bootstrap_port(info: Any) -> int | None:
    """The prefill server's bootstrap port from `/get_server_info` (None: not reported)."""
    port = info.get("disaggregation_bootstrap_port") if isinstance(info, Mapping) else None
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None


def layout_from_server_info(info: Any) -> KVLayout | None:
    """The KV layout a server reports (None when it reports nothing usable)."""
    if not isinstance(info, Mapping):
        return None
    page = info.get("page_size")
    page = page if isinstance(page, int) and not isinstance(page, bool) and page > 0 else None

    def text(name: str) -> str | None:
        value = info.get(name)
        return str(value) if isinstance(value, str) and value else None

    layout = KVLayout(page, text("kv_cache_dtype"), text("dtype"), text("disaggregation_transfer_backend"))
    return None if layout == KVLayout(None, None, None, None) else layout


def layout_mismatch(prefill_url: str, prefill: KVLayout | None, decode_url: str, decode: KVLayout | None) -> str:
    """Why these two servers cannot pair ('' when they can, or when either layout is not known yet)."""
    if prefill is None or decode is None:
        return ""
    problems = []
    for name, p_value, d_value, flag in (
        ("page_size", prefill.page_size, decode.page_size, "--page-size"),
        ("kv_cache_dtype", prefill.effective_kv_dtype, decode.effective_kv_dtype, "--kv-cache-dtype (and --dtype)"),
        ("transfer_backend", prefill.transfer_backend, decode.transfer_backend, "--disaggregation-transfer-backend"),
    ):
        if p_value is not None and d_value is not None and p_value != d_value:
            problems.append(f"{name} {p_value} on prefill {prefill_url} but {d_value} on decode {decode_url} "
                            f"(both need the same {flag})")
    return "; ".join(problems)


def bootstrap_host(prefill_url: str) -> str:
    """The host a decode server reaches the prefill server's bootstrap service on: the prefill URL's host."""
    return urlsplit(prefill_url).hostname or "127.0.0.1"


def batch_size(path: str, body: Mapping[str, Any]) -> int | None:
    """Prompts in a batched request (None for a single prompt): /generate text or input_ids lists,
    /v1/completions prompt lists."""
    if path == "/generate":
        text, ids = body.get("text"), body.get("input_ids")
        if isinstance(text, list):
            return len(text)
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return len(ids)
        return None
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return len(prompt)
    return None


def parallel_samples(body: Mapping[str, Any]) -> int:
    """`n` of the request (OpenAI `n`, or `sampling_params.n` on /generate); 1 when absent."""
    params = body.get("sampling_params")
    values = [body.get("n"), params.get("n") if isinstance(params, Mapping) else None]
    return max([v for v in values if isinstance(v, int) and not isinstance(v, bool)] or [1])


def with_bootstrap(body: Mapping[str, Any], path: str, host: str, port: int, rng: random.Random) -> dict[str, Any]:
    """A copy of `body` with bootstrap_host/port/room set for one (prefill, decode) pair (lists for a batch)."""
    out = dict(body)
    size = batch_size(path, body)
    if size is None:
        out.update(bootstrap_host=host, bootstrap_port=port, bootstrap_room=rng.getrandbits(ROOM_BITS))
    else:
        out.update(bootstrap_host=[host] * size, bootstrap_port=[port] * size,
                   bootstrap_room=[rng.getrandbits(ROOM_BITS) for _ in range(size)])
    return out


def preflight_problems(workers: list[tuple[str, str]], infos: Mapping[str, Any]) -> list[str]:
    """What stops these workers from serving, judged from the `/get_server_info` of those that answered.

    `workers` are (url, registered role); `infos` maps url -> server info (absent or None: no answer,
    judged later, at pairing). Problems: a server whose reported role contradicts its registration
    (a PD server behind a plain `--worker` would hold every request for SGLang's 300 s bootstrap
    timeout); and, when every prefill and decode server answered, no pair with the same KV layout."""
    problems = []
    flags = {"mixed": "--worker", "prefill": "--prefill", "decode": "--decode"}
    for url, role in workers:
        actual = reported_role(infos.get(url))
        if actual is not None and actual != role:
            mode = "null" if actual == "mixed" else actual
            problems.append(f"{url} was given as {flags[role]} but reports disaggregation_mode {mode}: "
                            f"pass it with {flags[actual]}")
    prefills = [url for url, role in workers if role == "prefill"]
    decodes = [url for url, role in workers if role == "decode"]
    if prefills and decodes and all(infos.get(u) is not None for u in prefills + decodes):
        reasons = [layout_mismatch(p, layout_from_server_info(infos[p]), d, layout_from_server_info(infos[d]))
                   for d in decodes for p in prefills]
        if all(reasons):
            problems.append("no prefill and decode server can pair: " + "; ".join(reasons))
    return problems
