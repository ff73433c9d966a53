"""A pool of sandbox servers one client spreads its calls over: least loaded first, failed hosts rested.

Load is what this client has in flight at each host (a host that answered ``overloaded`` or failed counts as
failed). A failed host is skipped for a rest that doubles with each failure in a row (up to `max_rest_s`)
and ends at its next success; when every host rests, the one whose rest ends first is tried.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_ENDPOINT = "http://localhost:8080"
ENDPOINT_ENV = "SANDBOX_FUSION_ENDPOINT"


def endpoints_from(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Server URLs from one URL, a comma-separated list or a sequence (default: `SANDBOX_FUSION_ENDPOINT`,
    else SandboxFusion's `http://localhost:8080`); ValueError for an empty list or one that is not http(s)."""
    if spec is None:
        spec = os.environ.get(ENDPOINT_ENV, DEFAULT_ENDPOINT)
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    urls = tuple(dict.fromkeys(str(p).strip().rstrip("/").removesuffix("/run_code") for p in parts if str(p).strip()))
    if not urls:
        raise ValueError("no sandbox server URL given")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a sandbox server endpoint must be an http(s) URL, got {url!r}")
    return urls


@dataclass
class _Host:
    url: str
    in_flight: int = 0
    failures: int = 0
    rest_until: float = 0.0
    calls: int = 0


@dataclass
class HostPool:
    """The hosts of one client (thread-safe): `pick` one for a call, then report it `done`."""

    urls: tuple[str, ...]
    rest_s: float = 1.0
    max_rest_s: float = 30.0
    _hosts: dict[str, _Host] = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._hosts = {url: _Host(url) for url in self.urls}

    def pick(self, avoid: Sequence[str] = ()) -> str:
        """The least loaded host not resting (and not in `avoid`, unless nothing else is left)."""
        now = time.monotonic()
        with self._lock:
            candidates = [h for h in self._hosts.values() if h.url not in avoid] or list(self._hosts.values())
            awake = [h for h in candidates if h.rest_until <= now]
            if awake:
                host = min(awake, key=lambda h: (h.in_flight, h.calls))
            else:
                host = min(candidates, key=lambda h: h.rest_until)
            host.in_flight += 1
            host.calls += 1
            return host.url

    def done(self, url: str, ok: bool) -> None:
        with self._lock:
            host = self._hosts[url]
            host.in_flight -= 1
            if ok:
                host.failures, host.rest_until = 0, 0.0
            else:
                host.failures += 1
                rest = min(self.max_rest_s, self.rest_s * 2 ** (host.failures - 1))
                host.rest_until = time.monotonic() + rest

    def stats(self) -> dict:
        with self._lock:
            return {
                h.url: {"in_flight": h.in_flight, "failures": h.failures, "calls": h.calls}
                for h in self._hosts.values()
            }
