"""`srt-agent sandbox serve`: SandboxFusion's API on the local sandbox, driven by the real
`sandbox-fusion` client, raw HTTP and SandboxFusionSandbox; the security battery through it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from test_sandbox_security import (
    MAX_OUTPUT,
    MEMORY_MB,
    TIMEOUT_S,
    battery,
    check_case,
    listener,
    run_battery,
)

from srt_agent.tools import SandboxFusionSandbox
from srt_agent.tools.local import bwrap_path

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
__all__ = ["listener"]  # the battery's host listener fixture, shared with test_sandbox_security

WORKERS = 6
MAX_TIMEOUT_S = 6.0
DEFAULT_TIMEOUT_S = 1.5
MAX_MEMORY_MB = 384


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    """The server, started through the CLI on a free loopback port."""
    port = free_port()
    argv = [sys.executable, "-m", "srt_agent.cli", "sandbox", "serve", "--port", str(port), "--workers", str(WORKERS)]
    argv += ["--max-timeout-s", str(MAX_TIMEOUT_S), "--timeout-s", str(DEFAULT_TIMEOUT_S)]
    argv += ["--max-output-bytes", str(MAX_OUTPUT), "--memory-mb", "256", "--max-memory-mb", str(MAX_MEMORY_MB)]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/ping", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not start: {server.stdout.read().decode()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def post(endpoint: str, **body) -> dict:
    response = httpx.post(f"{endpoint}/run_code", json={"language": "python", **body}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def run_for_memory(endpoint: str, code: str, **body) -> dict:
    """Run `code` with the server's longest run time: what a memory test checks must not hinge on the
    wall clock (writing a 250 MB array took 0.2 s idle and over DEFAULT_TIMEOUT_S on a loaded machine)."""
    return post(endpoint, code=code, run_timeout=MAX_TIMEOUT_S, **body)


@pytest.fixture(scope="module")
def sf():
    """ByteDance's `sandbox-fusion` client."""
    return pytest.importorskip("sandbox_fusion", reason="an optional client: pip install 'srt-agent[sandbox-fusion]'")


class TestSandboxFusionClient:
    def test_ping(self, endpoint):
        assert httpx.get(f"{endpoint}/v1/ping").json() == "pong"

    def test_success(self, endpoint, sf):
        response = sf.run_code(sf.RunCodeRequest(code="print(input()[::-1])", stdin="abc", language="python"), endpoint=endpoint)
        assert response.status == sf.RunStatus.Success
        assert response.run_result.stdout == "cba\n" and response.run_result.return_code == 0
        assert sf.summary_run_code_result(response, sf.SummaryMapping()) == "Success"

    def test_failure(self, endpoint, sf):
        response = sf.run_code(sf.RunCodeRequest(code="raise SystemExit(4)", language="python"), endpoint=endpoint)
        assert response.status == sf.RunStatus.Failed and response.run_result.return_code == 4
        assert sf.summary_run_code_result(response, sf.SummaryMapping(RunFailed="wrong")) == "wrong"

    def test_time_limit(self, endpoint, sf):
        request = sf.RunCodeRequest(code="import time\ntime.sleep(30)", language="python", run_timeout=1)
        response = sf.run_code(request, endpoint=endpoint)
        assert response.status == sf.RunStatus.Failed and response.run_result.status == "TimeLimitExceeded"
        assert sf.summary_run_code_result(response, sf.SummaryMapping(RunTimeout="tle")) == "tle"


@pytest.fixture(scope="module")
def verl_sandbox_fusion():
    """verl's own SandboxFusion code: the reward function's request path (verl 0.9 ships no SandboxFusion tool)."""
    return pytest.importorskip(
        "verl.utils.reward_score.sandbox_fusion", reason="verl is an optional extra: pip install 'srt-agent[verl]'"
    )


class TestVerlRequestPath:
    """verl's `call_sandbox_api` and `compute_score` post to the server exactly as they post to SandboxFusion."""

    def test_call_sandbox_api(self, endpoint, verl_sandbox_fusion):
        from verl.utils.reward_score.sandbox_fusion.utils import call_sandbox_api

        body, error = call_sandbox_api(f"{endpoint}/run_code", "print(input() * 2)", "ab", 5, 5, 256, "python")
        assert error is None and body["status"] == "Success" and body["run_result"]["stdout"] == "abab\n"
        body, error = call_sandbox_api(f"{endpoint}/run_code", "print(1)", None, 5, 5, 256, "cpp")
        assert error is None and body["status"] == "SandboxError" and "python only" in body["message"]

    def test_compute_score_runs_test_cases(self, endpoint, verl_sandbox_fusion):
        completion = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
        cases = {"inputs": ["1 2\n", "5 7\n", "0 0\n"], "outputs": ["3\n", "12\n", "1\n"]}
        score, metadata = verl_sandbox_fusion.compute_score(f"{endpoint}/run_code", None, 256, completion, cases)
        assert score == pytest.approx(2 / 3)
        assert [m["status"] for m in metadata] == ["success", "success", "wrong_answer"]
        crashing = "```python\nraise ValueError('no')\n```"
        score, metadata = verl_sandbox_fusion.compute_score(f"{endpoint}/run_code", None, 256, crashing, cases)
        assert score == 0.0 and all("ValueError: no" in m["stderr"] for m in metadata)


class TestRawHttp:
    def test_response_shape(self, endpoint):
        body = post(endpoint, code="import sys\nprint('out')\nprint('err', file=sys.stderr)")
        assert body["status"] == "Success" and body["message"] == "" and body["compile_result"] is None
        run = body["run_result"]
        assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == ("Finished", 0, "out\n", "err\n")
        assert run["execution_time"] > 0 and body["srt_status"] == "ok"

    def test_memory_limit_per_request(self, endpoint):
        code = "x = bytearray(250 << 20)\nprint('fits')"
        small = run_for_memory(endpoint, code, memory_limit_MB=128)
        large = run_for_memory(endpoint, code, memory_limit_MB=MAX_MEMORY_MB)
        default = run_for_memory(endpoint, code)  # the server's --memory-mb 256: no room beside a 250 MB array
        assert small["srt_status"] == "memory" and "MemoryError" in small["run_result"]["stderr"], small
        assert large["srt_status"] == "ok" and large["run_result"]["stdout"] == "fits\n", large
        assert default["srt_status"] == "memory", default

    def test_memory_limit_is_capped_by_the_server(self, endpoint):
        """A request asking for 64 GB runs under --max-memory-mb; just below the cap still fits."""
        above = run_for_memory(endpoint, f"x = bytearray({MAX_MEMORY_MB + 64} << 20)\nprint('fits')", memory_limit_MB=65536)
        below = run_for_memory(endpoint, f"x = bytearray({MAX_MEMORY_MB - 160} << 20)\nprint('fits')", memory_limit_MB=65536)
        assert above["srt_status"] == "memory" and "MemoryError" in above["run_result"]["stderr"], above
        assert below["srt_status"] == "ok" and below["run_result"]["stdout"] == "fits\n", below

    def test_run_timeout_defaults_to_the_servers(self, endpoint):
        run = post(endpoint, code="import time\nprint('start')\ntime.sleep(60)")["run_result"]
        assert (run["status"], run["stdout"]) == ("TimeLimitExceeded", "start\n")
        assert DEFAULT_TIMEOUT_S <= run["execution_time"] < MAX_TIMEOUT_S

    def test_run_timeout_is_capped_by_the_server(self, endpoint):
        body = post(endpoint, code="import time\ntime.sleep(60)", run_timeout=600)
        assert body["run_result"]["status"] == "TimeLimitExceeded"
        assert body["run_result"]["execution_time"] < MAX_TIMEOUT_S + 10

    @pytest.mark.parametrize(
        "extra, message",
        [
            ({"language": "cpp"}, "not supported"),
            ({"files": {"data.txt": "aGk="}}, "files and fetch_files"),
            ({"run_timeout": 0}, "run_timeout must be positive"),
        ],
    )
    def test_unsupported_requests_are_sandbox_errors(self, endpoint, extra, message):
        body = post(endpoint, code="print(1)", **extra)
        assert body["status"] == "SandboxError" and message in body["message"]

    def test_malformed_request_is_rejected(self, endpoint):
        assert httpx.post(f"{endpoint}/run_code", json={"language": "python"}).status_code == 422

    def test_requests_run_concurrently(self, endpoint):
        code = "import time\nstart = time.time()\ntime.sleep(1)\nprint(start, time.time())"
        client = SandboxFusionSandbox(endpoint, timeout_s=10)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: client.run(code), range(4)))
        spans = [tuple(map(float, r.stdout.split())) for r in results]
        overlapping = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
        assert all(r.status == "ok" for r in results) and overlapping >= 2


@pytest.fixture(scope="module")
def battery_through_server(endpoint, listener):
    sandbox = SandboxFusionSandbox(endpoint, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB, retries=1)
    return run_battery(sandbox, battery(listener[0]), workers=WORKERS)


@pytest.mark.parametrize("name", [case.name for case in battery(0)])
def test_battery_through_the_server(name, battery_through_server, listener):
    case = {case.name: case for case in battery(listener[0])}[name]
    check_case(case, battery_through_server)


def test_server_survives_the_battery(endpoint, battery_through_server, listener):
    assert listener[1] == []
    assert post(endpoint, code="print('still serving')")["run_result"]["stdout"] == "still serving\n"
