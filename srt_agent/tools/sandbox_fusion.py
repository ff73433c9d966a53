"""A SandboxFusion server as the code sandbox: `POST {endpoint}/run_code` with raw JSON.

Works with ByteDance's server (`docker run -p 8080:8080 volcengine/sandbox-fusion:server-20250609`)
and with `srt-agent sandbox serve`. Raw JSON rather than the `sandbox-fusion` client because the
client's request model has no `memory_limit_MB`.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from .base import SANDBOX_STATUSES, SandboxResult, SandboxStatus, is_memory_error

DEFAULT_ENDPOINT = "http://localhost:8080"


def endpoint_from_env() -> str:
    """`SANDBOX_FUSION_ENDPOINT`, or SandboxFusion's default `http://localhost:8080`."""
    return os.environ.get("SANDBOX_FUSION_ENDPOINT", DEFAULT_ENDPOINT)


def result_from_response(body: dict, wall_s: float) -> SandboxResult:
    """Map a SandboxFusion `/run_code` response onto a SandboxResult; ValueError if it is not one."""
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {type(body).__name__}")
    run = body.get("run_result") or body.get("compile_result")
    if run is not None and not isinstance(run, dict):
        raise ValueError(f"run_result must be an object, got {type(run).__name__}")
    if body.get("status") == "SandboxError" or run is None or run.get("status") == "Error":
        message = body.get("message") or (run or {}).get("stderr") or "the SandboxFusion server reported an error"
        return SandboxResult(status="sandbox_error", stderr=str(message), wall_s=wall_s)
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
    code = run.get("return_code")
    if not isinstance(stdout, str) or not isinstance(stderr, str) or not (code is None or type(code) is int):
        raise ValueError("run_result's stdout, stderr and return_code have the wrong types")
    status: SandboxStatus
    if run.get("status") == "TimeLimitExceeded":
        status = "timeout"
    elif code == 0:
        status = "ok"
    elif code is not None and code < 0:
        status = "killed"
    elif is_memory_error(stderr):
        status = "memory"
    else:
        status = "error"
    if body.get("srt_status") in SANDBOX_STATUSES:  # srt-agent's server reports its exact status
        status = body["srt_status"]
    if status == "output_limit":
        code = None  # the server stopped it (SandboxFusion clients are shown SIGKILL's code)
    files = body.get("files") or {}
    try:
        fetched = {str(name): base64.b64decode(data) for name, data in files.items()}
    except (AttributeError, TypeError, binascii.Error) as exc:
        raise ValueError(f"files is not a map of names to base64: {exc}") from exc
    truncated = bool(body.get("truncated", False))
    return SandboxResult(
        status=status, stdout=stdout, stderr=stderr, exit_code=code, wall_s=wall_s, truncated=truncated, files=fetched
    )


@dataclass
class SandboxFusionSandbox:
    """A client of a SandboxFusion `/run_code` endpoint, retrying on 5xx answers and timeouts.

    A server that stays unreachable after `retries` attempts gives a `sandbox_error` result (the
    trajectory goes on); bad options raise ValueError.
    """

    endpoint: str | None = None
    timeout_s: float = 10.0
    memory_mb: int = 512
    retries: int = 3
    backoff_s: float = 0.5
    http_slack_s: float = 10.0  # the HTTP timeout is the run timeout plus this (queueing, startup)
    _client: httpx.Client = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.endpoint = (self.endpoint or endpoint_from_env()).rstrip("/")
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"SandboxFusionSandbox endpoint must be an http(s) URL, got {self.endpoint!r}")
        if self.timeout_s <= 0 or self.memory_mb <= 0 or self.retries < 1:
            raise ValueError("SandboxFusionSandbox needs timeout_s > 0, memory_mb > 0 and retries >= 1")
        self._client = httpx.Client()  # thread-safe; keeps connections to the server alive between calls

    def close(self) -> None:
        self._client.close()

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        files: Mapping[str, bytes | None] | None = None,
        fetch_files: Sequence[str] = (),
    ) -> SandboxResult:
        """Run `code` on the server; never raises for the program or the network.

        `files` (name -> content; None entries are sent as null, which servers skip) are written into
        the run's working directory; `fetch_files` come back in the result's `files`.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        payload = {
            "code": code,
            "language": "python",
            "run_timeout": timeout,
            "memory_limit_MB": self.memory_mb,
            "stdin": stdin,
        }
        if files:
            payload["files"] = {
                name: None if data is None else base64.b64encode(data).decode() for name, data in files.items()
            }
        if fetch_files:
            payload["fetch_files"] = list(fetch_files)
        start = time.monotonic()
        problem = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._client.post(
                    f"{self.endpoint}/run_code", json=payload, timeout=timeout + self.http_slack_s
                )
            except httpx.TransportError as exc:  # connection refused, timeouts, resets
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500:
                problem = f"HTTP {response.status_code}: {response.text[:500]}"
                continue
            if response.status_code != 200:
                return SandboxResult(
                    status="sandbox_error",
                    stderr=f"SandboxFusion at {self.endpoint} rejected the request: HTTP {response.status_code}: {response.text[:500]}",
                    wall_s=time.monotonic() - start,
                )
            try:
                return result_from_response(response.json(), time.monotonic() - start)
            except ValueError as exc:  # not JSON, or not SandboxFusion's answer
                problem = f"a response that is not SandboxFusion's ({exc}): {response.text[:200]!r}"
                continue
        return SandboxResult(
            status="sandbox_error",
            stderr=f"SandboxFusion at {self.endpoint} failed {self.retries} times; last: {problem}",
            wall_s=time.monotonic() - start,
        )
