"""A client of router replicas: the official `openai` client with one base URL per replica, trying the next
replica when one cannot be reached (as a client behind a load balancer with retries would be).

Only connection failures (the replica is gone: refused, reset, or closed before any answer) move a request to the
next replica; an HTTP error answer is the answer. Used by the replica-loss tests and `k3 bench router`.
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import openai


class FailoverClient:
    """`chat(...)` through replica `start % n` first, then the others in turn on a connection failure."""

    def __init__(self, base_urls: list[str], timeout_s: float = 30.0) -> None:
        self.clients = [openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout_s)
                        for url in base_urls]
        self.failovers = 0

    def chat(self, start: int, session_id: str, messages: list[dict], max_tokens: int = 8) -> tuple[str, dict]:
        """(answer text, response headers) of one chat turn sent with `X-Session-Id: session_id`."""
        last: Exception | None = None
        for k in range(len(self.clients)):
            client = self.clients[(start + k) % len(self.clients)]
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="default", messages=messages, max_tokens=max_tokens,
                    extra_headers={"X-Session-Id": session_id})
            except openai.APIConnectionError as exc:
                last = exc
                self.failovers += 1
                continue
            return raw.parse().choices[0].message.content, dict(raw.headers)
        raise RuntimeError(f"every replica failed: {last}")

    def close(self) -> None:
        for client in self.clients:
            client.close()


def start_router(workers: list[str], port: int, *extra: str, log_path: str | None = None) -> subprocess.Popen:
    """A `k3 router` process on 127.0.0.1:`port` in front of `workers` (stdout/stderr to `log_path`)."""
    args = [sys.executable, "-m", "k3_sglang.cli", "router", "--port", str(port), "--log-level", "warning", *extra]
    for url in workers:
        args += ["--worker", url]
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the process owns it
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Wait until a router answers `/readiness` 200 (RuntimeError if it exits or the time runs out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"router at {url} exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/readiness", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"router at {url} not ready after {timeout_s:.0f} s")


def stop(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate a process we started (kill it if it does not exit in time)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)
