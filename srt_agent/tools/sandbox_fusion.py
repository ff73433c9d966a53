"""SandboxFusion servers as the code sandbox: `POST {endpoint}/run_code` with raw JSON.

Works with ByteDance's server (`docker run -p 8080:8080 volcengine/sandbox-fusion:server-20250609`)
and with `srt-agent sandbox serve`; several servers (a list, or URLs separated by commas) share the calls,
least loaded first, a failed one skipped (hosts.py). Raw JSON rather than the `sandbox-fusion` client
because the client's request model has no `memory_limit_MB`.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from .base import SANDBOX_STATUSES, SandboxResult, SandboxStatus, is_memory_error
from .hosts import DEFAULT_ENDPOINT, ENDPOINT_ENV, HostPool, endpoints_from

__all__ = ["DEFAULT_ENDPOINT", "ENDPOINT_ENV", "SandboxFusionSandbox", "endpoints_from", "result_from_response"]


def result_from_response(body: dict, wall_s: float) -> SandboxResult:
    """Map a SandboxFusion `/run_code` response onto a SandboxResult; ValueError if it is not one."""
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {type(body).__name__}")
    run = body.get("run_result") or body.get("compile_result")
    if run is not None and not isinstance(run, dict):
        raise ValueError(f"run_result must be an object, got {type(run).__name__}")
    if body.get("status") == "SandboxError" or run is None or run.get("status") == "Error":
        message = body.get("message") or (run or {}).get("stderr") or "the SandboxFusion server reported an error"
        if body.get("srt_status") == "overloaded" and run is not None:  # srt-agent's server: what the program wrote
            stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or message)
            return SandboxResult(status="overloaded", stdout=stdout, stderr=stderr, wall_s=wall_s)
        return SandboxResult(status="sandbox_error", stderr=str(message), wall_s=wall_s)
    compiled = body.get("compile_result")
    did_not_compile = body.get("run_result") is None and compiled is not None
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
    code = run.get("return_code")
    if not isinstance(stdout, str) or not isinstance(stderr, str) or not (code is None or type(code) is int):
        raise ValueError("run_result's stdout, stderr and return_code have the wrong types")
    status: SandboxStatus
    if did_not_compile:
        status = "compile_error"
    elif run.get("status") == "TimeLimitExceeded":
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
    """A client of SandboxFusion `/run_code` endpoints, retrying on 5xx answers and timeouts.

    `endpoint` is one server URL, several (a list, or URLs separated by commas), or None for
    `SANDBOX_FUSION_ENDPOINT`. A call goes to the least loaded server; one that fails (unreachable, 5xx,
    a timeout, an answer that is not SandboxFusion's) is skipped and the call tried on another, up to
    `retries` attempts (at least one per server). When every attempt fails the result is a `sandbox_error`; a server's ``overloaded`` answer comes
    back as it is (the caller decides on a retry; CodeInterpreter does) and rests that server. Bad options
    raise ValueError. `compile_timeout_s` is SandboxFusion's `compile_timeout`: for an interpreted language
    the time `srt-agent sandbox serve` may keep the call queued.
    """

    endpoint: str | Sequence[str] | None = None
    timeout_s: float = 10.0
    memory_mb: int = 512
    retries: int = 3
    backoff_s: float = 0.5
    http_slack_s: float = 10.0  # the HTTP timeout is the compile and run timeouts plus this
    compile_timeout_s: float = 10.0
    language: str = "python"
    _client: httpx.Client = field(init=False, repr=False, compare=False)
    hosts: HostPool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        urls = endpoints_from(self.endpoint)
        self.endpoint = ",".join(urls)
        if self.timeout_s <= 0 or self.memory_mb <= 0 or self.retries < 1 or self.compile_timeout_s <= 0:
            raise ValueError(
                "SandboxFusionSandbox needs timeout_s > 0, memory_mb > 0, retries >= 1 and compile_timeout_s > 0"
            )
        self.hosts = HostPool(urls, rest_s=self.backoff_s)
        self._client = httpx.Client()  # thread-safe; keeps connections to the servers alive between calls

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
        language: str | None = None,
    ) -> SandboxResult:
        """Run `code` (in `language`, default the client's) on a server; never raises for the program or the
        network.

        `files` (name -> content; None entries are sent as null, which servers skip) are written into
        the run's working directory; `fetch_files` come back in the result's `files`.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        payload = {
            "code": code,
            "language": language or self.language,
            "run_timeout": timeout,
            "compile_timeout": self.compile_timeout_s,
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
        problems: list[str] = []
        tried: list[str] = []
        attempts = max(self.retries, len(self.hosts.urls))
        for _ in range(attempts):
            url = self.hosts.pick(avoid=tried)
            if url in tried:  # no other host left to try: wait before asking this one again
                time.sleep(self.backoff_s * 2 ** min(tried.count(url) - 1, 6))
            tried.append(url)
            result, problem = self._post(url, payload, timeout + self.compile_timeout_s + self.http_slack_s, start)
            self.hosts.done(url, ok=result is not None and result.status != "overloaded")  # rest a busy host too
            if result is not None:
                return result
            problems.append(f"{url}: {problem}")
        where = f"SandboxFusion at {self.endpoint}" if len(self.hosts.urls) == 1 else "every SandboxFusion server"
        return SandboxResult(
            status="sandbox_error",
            stderr=f"{where} failed {attempts} times; last: {problems[-1]}",
            wall_s=time.monotonic() - start,
        )

    def _post(
        self, url: str, payload: dict, http_timeout: float, start: float
    ) -> tuple[SandboxResult | None, str | None]:
        """One attempt at `url`: (a result to return, None), or (None, why it should be retried)."""
        try:
            response = self._client.post(f"{url}/run_code", json=payload, timeout=http_timeout)
        except httpx.TransportError as exc:  # connection refused, timeouts, resets
            return None, f"{type(exc).__name__}: {exc}"
        if response.status_code >= 500:
            return None, f"HTTP {response.status_code}: {response.text[:500]}"
        if response.status_code != 200:
            return SandboxResult(
                status="sandbox_error",
                stderr=f"SandboxFusion at {url} rejected the request: HTTP {response.status_code}: {response.text[:500]}",
                wall_s=time.monotonic() - start,
            ), None
        try:
            return result_from_response(response.json(), time.monotonic() - start), None
        except ValueError as exc:  # not JSON, or not SandboxFusion's answer
            return None, f"a response that is not SandboxFusion's ({exc}): {response.text[:200]!r}"
