"""A SandboxFusion-compatible server under load: many programs at once, then one small probe.

Sends `concurrency` copies of a program to any `/run_code` URL (ours, a real SandboxFusion) at once, each
with the client timeout verl's SandboxFusion client uses (compile and run timeouts plus 10 s), then, while
they run, a `print(1)`. Reports the share answered within the client timeout, latency percentiles, the
statuses the server gave, and how long the probe took. With `probe_every_s`, `print(1)` probes (run timeout
`probe_run_timeout`: 5 s makes them interactive on our server) go one after another, that often, from
`probe_after_s` until `after_s` past the flood's last answer: their latencies during and after the flood.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

PROGRAMS = {
    "busy": "while True:\n    pass\n",  # a CPU-bound loop that never ends: every answer should be a timeout
    "print": "print(1)\n",
    "sleep": "import time\ntime.sleep(3)\nprint(1)\n",
}
CLIENT_MARGIN_S = 10.0  # verl's client waits compile_timeout + run_timeout + this


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


def verdict(answer: dict) -> str:
    """One answer's status as SandboxFusion names it (run status when it ran), plus ours where given."""
    run = answer.get("run_result") or answer.get("compile_result") or {}
    name = f"{answer.get('status')}/{run.get('status')}" if run else str(answer.get("status"))
    return f"{name} ({answer['srt_status']})" if answer.get("srt_status") else name


async def _call(client: httpx.AsyncClient, url: str, body: dict, timeout: float) -> tuple[float, str, dict | None]:
    start = time.monotonic()
    try:
        response = await client.post(url, json=body, timeout=timeout)
    except httpx.TimeoutException:
        return time.monotonic() - start, "client timeout", None
    except httpx.TransportError as exc:
        return time.monotonic() - start, f"transport error: {type(exc).__name__}", None
    elapsed = time.monotonic() - start
    if response.status_code != 200:
        return elapsed, f"HTTP {response.status_code}", None
    answer = response.json()
    return elapsed, verdict(answer), answer


async def run_load(
    url: str,
    concurrency: int = 100,
    program: str = "busy",
    run_timeout: float = 10.0,
    compile_timeout: float = 10.0,
    client_timeout: float | None = None,
    probe_after_s: float = 1.0,
    probe_every_s: float | None = None,
    probe_run_timeout: float = 5.0,
    after_s: float = 10.0,
) -> dict:
    """The figures of one load run against `url` (a server's base URL or its `/run_code`)."""
    endpoint = url.rstrip("/") if url.rstrip("/").endswith("/run_code") else url.rstrip("/") + "/run_code"
    code = PROGRAMS.get(program, program)
    client_timeout = client_timeout or compile_timeout + run_timeout + CLIENT_MARGIN_S
    body = {"code": code, "language": "python", "run_timeout": run_timeout, "compile_timeout": compile_timeout}
    limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
    async with httpx.AsyncClient(limits=limits) as client:
        started = time.monotonic()
        calls = [asyncio.create_task(_call(client, endpoint, body, client_timeout)) for _ in range(concurrency)]
        await asyncio.sleep(probe_after_s)
        probe_body = {**body, "code": PROGRAMS["print"]}
        if probe_every_s is not None:
            probe_body["run_timeout"] = probe_run_timeout
            flood = asyncio.gather(*calls)
            probes = await _probe_series(client, endpoint, probe_body, flood, probe_every_s, after_s)
        probe = await _call(client, endpoint, probe_body, client_timeout)
        answers = await asyncio.gather(*calls)
        wall = time.monotonic() - started
    in_time = [a for a in answers if a[2] is not None and a[0] <= client_timeout]
    latencies = [a[0] for a in in_time]
    return {
        "url": endpoint,
        "program": code,
        "concurrency": concurrency,
        "run_timeout_s": run_timeout,
        "compile_timeout_s": compile_timeout,
        "client_timeout_s": client_timeout,
        "answered_in_time": len(in_time),
        "answered_in_time_share": len(in_time) / concurrency,
        "successes": sum(1 for a in in_time if a[2]["status"] == "Success"),
        "p50_s": percentile(latencies, 0.50),
        "p99_s": percentile(latencies, 0.99),
        "max_s": max(latencies, default=None),
        "statuses": dict(Counter(a[1] for a in answers)),
        "wall_s": wall,
        "probe": {"sent_after_s": probe_after_s, "latency_s": probe[0], "status": probe[1],
                  "stdout": ((probe[2] or {}).get("run_result") or {}).get("stdout"),
                  "queued_s": (probe[2] or {}).get("srt_queued_s")},
        **({"probes": probes} if probe_every_s is not None else {}),
    }  # fmt: skip


async def _probe_series(
    client: httpx.AsyncClient, endpoint: str, body: dict, flood: asyncio.Future, every_s: float, after_s: float
) -> dict:
    """`print(1)` probes one after another, every `every_s`, while `flood` runs and `after_s` past its end;
    their latency percentiles and statuses, during the flood and after it."""
    seen: dict[str, list[tuple[float, str]]] = {"during": [], "after": []}
    ended_at = None
    while ended_at is None or time.monotonic() - ended_at < after_s:
        sent = time.monotonic()
        latency, status, _ = await _call(client, endpoint, body, body["compile_timeout"] + body["run_timeout"] + 10)
        ended_at = ended_at or (time.monotonic() if flood.done() else None)
        seen["during" if ended_at is None or ended_at > sent else "after"].append((latency, status))
        await asyncio.sleep(max(0.0, every_s - (time.monotonic() - sent)))
    return {
        phase: {"count": len(found), "p50_s": percentile([a for a, _ in found], 0.5),
                "p99_s": percentile([a for a, _ in found], 0.99), "max_s": max((a for a, _ in found), default=None),
                "statuses": dict(Counter(status for _, status in found))}
        for phase, found in seen.items()
    }  # fmt: skip


def load_bench(url: str, **options) -> dict:
    """`run_load` from synchronous code."""
    return asyncio.run(run_load(url, **options))
