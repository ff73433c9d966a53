"""One client, several sandbox servers: calls go to the least loaded, a server that is down is skipped (the
call retried on another) and rested. Real `srt-agent sandbox serve` instances over HTTP, and a port where
nothing listens."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from srt_agent.tools import LocalSandbox, SandboxFusionSandbox, make_sandbox
from srt_agent.tools.hosts import HostPool, endpoints_from
from srt_agent.tools.local import bwrap_path
from srt_agent.tools.server import ServerConfig, running_server

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")


def dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def started(url: str) -> int:
    return httpx.get(f"{url}/v1/load").json()["started"]


@pytest.fixture(scope="module")
def servers():
    config = ServerConfig(LocalSandbox(timeout_s=10))
    with running_server(config) as first, running_server(config) as second:
        yield first, second


def test_urls_from_a_list_commas_or_the_environment(monkeypatch):
    assert endpoints_from("http://a:1/, http://b:2/run_code") == ("http://a:1", "http://b:2")
    assert endpoints_from(["http://a:1", "http://a:1"]) == ("http://a:1",)
    monkeypatch.setenv("SANDBOX_FUSION_ENDPOINT", "http://x:9,http://y:9")
    assert SandboxFusionSandbox().hosts.urls == ("http://x:9", "http://y:9")
    with pytest.raises(ValueError, match="must be an http"):
        endpoints_from("a:1,http://b:2")
    with pytest.raises(ValueError, match="no sandbox server URL"):
        endpoints_from(" , ")


def test_calls_spread_over_the_least_loaded(servers):
    before = [started(url) for url in servers]
    client = make_sandbox("sandbox_fusion", endpoint=list(servers), timeout_s=10)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: client.run(f"import time\ntime.sleep(0.5)\nprint({i})"), range(8)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert [started(url) - b for url, b in zip(servers, before)] == [4, 4]


def test_a_host_that_is_down_is_skipped_and_rested(servers):
    down = dead_url()
    client = SandboxFusionSandbox([down, *servers], timeout_s=10, backoff_s=30)
    before = sum(started(url) for url in servers)
    results = [client.run("print('up')") for _ in range(4)]
    assert all(r.stdout == "up\n" for r in results), results
    assert sum(started(url) for url in servers) - before == 4
    assert client.hosts.stats()[down]["calls"] == 1  # tried once, then resting


def test_every_host_down_is_a_sandbox_error():
    client = SandboxFusionSandbox([dead_url(), dead_url()], retries=1, backoff_s=0.01)
    result = client.run("print(1)")
    assert result.status == "sandbox_error" and "every SandboxFusion server failed 2 times" in result.stderr


def test_pool_prefers_awake_hosts_then_the_soonest_awake():
    pool = HostPool(("http://a", "http://b"), rest_s=10)
    first = pool.pick()
    pool.done(first, ok=False)
    other = pool.pick()
    assert other != first
    pool.done(other, ok=False)
    assert pool.pick() == first  # both rest: the one that rests the least longer
