"""`srt-agent sandbox serve`: SandboxFusion's API on the local sandbox, driven by the real
`sandbox-fusion` client, raw HTTP and SandboxFusionSandbox (the hostile battery through it, on the local
sandbox and on Docker: test_sandbox_hostile.py)."""

from __future__ import annotations

import asyncio
import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers.sandbox_hostile import MAX_OUTPUT
from helpers.sandboxes import cli_server

from srt_agent.tools import LocalSandbox, SandboxFusionSandbox, languages
from srt_agent.tools.local import RUNTIME_MOUNT, bwrap_path
from srt_agent.tools.runtime import runtime_python
from srt_agent.tools.server import ServerConfig, running_server

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")

WORKERS = 6
MAX_TIMEOUT_S = 12.0
DEFAULT_TIMEOUT_S = 4.0  # long enough for a program to start on a loaded machine
MAX_MEMORY_MB = 384
MEMORY_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def endpoint():
    """The server, started through the CLI on a free loopback port."""
    options = ["--workers", str(WORKERS), "--max-timeout-s", str(MAX_TIMEOUT_S), "--timeout-s", str(DEFAULT_TIMEOUT_S)]
    options += ["--max-output-bytes", str(MAX_OUTPUT), "--memory-mb", "256", "--max-memory-mb", str(MAX_MEMORY_MB)]
    with cli_server(options) as url:
        yield url


def post(endpoint: str, http_timeout_s: float = 30, **body) -> dict:
    response = httpx.post(f"{endpoint}/run_code", json={"language": "python", **body}, timeout=http_timeout_s)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def memory_endpoint():
    """A server for the memory-limit tests, whose runs may take up to MEMORY_TIMEOUT_S: what they check must not
    hinge on the wall clock (writing a 250 MB array took 0.2 s idle, over the 1.5 s default with both cores busy,
    up to 4 s at a load average of 15)."""
    options = ["--memory-mb", "256", "--max-memory-mb", str(MAX_MEMORY_MB), "--max-timeout-s", str(MEMORY_TIMEOUT_S)]
    with cli_server(options) as url:
        yield url


def run_for_memory(endpoint: str, code: str, **body) -> dict:
    return post(endpoint, MEMORY_TIMEOUT_S + 30, code=code, run_timeout=MEMORY_TIMEOUT_S, **body)


@pytest.fixture(scope="module")
def sf():
    """ByteDance's `sandbox-fusion` client."""
    return pytest.importorskip("sandbox_fusion", reason="an optional client: pip install 'srt-agent[sandbox-fusion]'")


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


LOOPBACK_SERVER = """\
import http.server, threading, requests
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'special string')
server = http.server.HTTPServer(('', 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(requests.get(f'http://localhost:{server.server_port}', timeout=5).text)
"""

# The representative requests a SandboxFusion user sends: (request fields, summary mapping's answer, checks).
REPRESENTATIVE = {
    "print": ({"code": "print(123)"}, "Success", lambda r: r.run_result.stdout == "123\n"),
    "stdin": ({"code": "print(input()[::-1])", "stdin": "abc"}, "Success", lambda r: r.run_result.stdout == "cba\n"),
    "exit_code": ({"code": "raise SystemExit(4)"}, "RunFailed", lambda r: r.run_result.return_code == 4),
    "exception": (
        {"code": "assert 1 == 2"},
        "RunFailed",
        lambda r: "AssertionError" in r.run_result.stderr and r.run_result.status == "Finished",
    ),
    "syntax_error": ({"code": "int a = 1"}, "RunFailed", lambda r: "SyntaxError" in r.run_result.stderr),
    "timeout": (
        {"code": "import time\nprint('started')\ntime.sleep(30)", "run_timeout": 1},
        "RunTimeout",
        lambda r: r.run_result.status == "TimeLimitExceeded" and r.run_result.stdout == "started\n",
    ),
    "unicode": ({"code": "print('héllo ✓ 你好')"}, "Success", lambda r: r.run_result.stdout == "héllo ✓ 你好\n"),
    "files": (
        {"code": "print(open('dir1/dir2/flag').read())", "files": {"dir1/dir2/flag": b64("hello, a test")}},
        "Success",
        lambda r: r.run_result.stdout == "hello, a test\n",
    ),
    "fetch_files": (
        {
            "code": "open('a.txt', 'w').write('secret'); open('/mnt/b', 'w').write('sauce')",
            "fetch_files": ["a.txt", "/mnt/b"],
        },
        "Success",
        lambda r: r.files == {"a.txt": b64("secret"), "/mnt/b": b64("sauce")},
    ),
    "null_files": (
        {"code": "import os\nprint(sorted(os.listdir('.')))", "files": {"kept": b64("x"), "skipped": None}},
        "Success",
        lambda r: r.run_result.stdout == "['kept']\n",
    ),
    "output_cap": (
        {"code": f"print('x' * {2 * MAX_OUTPUT})"},
        "RunFailed",
        lambda r: r.run_result.return_code == -9 and "output" in r.message and len(r.run_result.stdout) <= MAX_OUTPUT,
    ),
    "localhost_server": ({"code": LOOPBACK_SERVER}, "Success", lambda r: r.run_result.stdout == "special string\n"),
}


class TestSandboxFusionClient:
    """ByteDance's PyPI client (sync and async) on the representative requests, and its summariser."""

    def test_ping(self, endpoint):
        assert httpx.get(f"{endpoint}/v1/ping").json() == "pong"

    @pytest.mark.parametrize("name", REPRESENTATIVE)
    def test_representative_request(self, endpoint, sf, name):
        fields, summary, check = REPRESENTATIVE[name]
        if name == "localhost_server" and runtime_python() is None:
            pytest.skip("the program imports requests: the sandbox runtime is not built")
        request = sf.RunCodeRequest(language="python", **fields)
        response = sf.run_code(request, endpoint=endpoint, max_attempts=1)
        mapping = sf.SummaryMapping(Success="Success", RunFailed="RunFailed", RunTimeout="RunTimeout")
        assert sf.summary_run_code_result(response, mapping) == summary, response
        assert check(response), response

    def test_async_client(self, endpoint, sf):
        async def many():
            requests = [sf.RunCodeRequest(code=f"print({i} * {i})", language="python") for i in range(4)]
            return await asyncio.gather(*(sf.run_code_async(r, endpoint=endpoint, max_attempts=1) for r in requests))

        responses = asyncio.run(many())
        assert [r.run_result.stdout for r in responses] == [f"{i * i}\n" for i in range(4)]


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
        body, error = call_sandbox_api(f"{endpoint}/run_code", "package main", None, 5, 5, 256, "go")
        assert error is None and body["status"] == "Failed" and "not supported" in body["message"]

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

    def test_memory_limit_per_request(self, memory_endpoint):
        code = "x = bytearray(250 << 20)\nprint('fits')"
        small = run_for_memory(memory_endpoint, code, memory_limit_MB=128)
        large = run_for_memory(memory_endpoint, code, memory_limit_MB=MAX_MEMORY_MB)
        default = run_for_memory(memory_endpoint, code)  # the server's --memory-mb 256: no room beside a 250 MB array
        assert small["srt_status"] == "memory" and "MemoryError" in small["run_result"]["stderr"], small
        assert large["srt_status"] == "ok" and large["run_result"]["stdout"] == "fits\n", large
        assert default["srt_status"] == "memory", default

    def test_memory_limit_is_capped_by_the_server(self, memory_endpoint):
        """A request asking for 64 GB runs under --max-memory-mb; just below the cap still fits."""
        above = run_for_memory(
            memory_endpoint, f"x = bytearray({MAX_MEMORY_MB + 64} << 20)\nprint('fits')", memory_limit_MB=65536
        )
        below = run_for_memory(
            memory_endpoint, f"x = bytearray({MAX_MEMORY_MB - 160} << 20)\nprint('fits')", memory_limit_MB=65536
        )
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

    def test_a_known_language_it_does_not_run_fails(self, endpoint):
        body = post(endpoint, code="package main", language="go")
        assert (body["status"], body["run_result"]) == ("Failed", None) and "not supported" in body["message"]

    @pytest.mark.parametrize("timeout", [0, -1])
    def test_a_run_timeout_of_zero_is_a_time_limit(self, endpoint, timeout):
        body = post(endpoint, code="print(1)", run_timeout=timeout)
        assert (body["status"], body["run_result"]["status"], body["srt_status"]) == (
            "Failed",
            "TimeLimitExceeded",
            "timeout",
        )

    def test_bash_runs(self, endpoint):
        body = post(
            endpoint, code="read x\necho $((x * 2))\ncat f", language="bash", stdin="21\n", files={"f": b64("file")}
        )
        assert (body["status"], body["run_result"]["stdout"]) == ("Success", "42\nfile"), body

    @pytest.mark.parametrize(
        "body, detail",
        [
            ({"code": "print(1)"}, "language"),
            ({"code": "print(1)", "language": "cobol"}, "language"),
            ({"language": "python"}, "code"),
            (
                {"code": "print(1)", "language": "python", "files": {"../up": "aGk="}},
                "leaves the run's working directory",
            ),
            (
                {"code": "print(1)", "language": "python", "files": {"/etc/x": "aGk="}},
                "outside the run's working directory",
            ),
            (
                {"code": "print(1)", "language": "python", "fetch_files": ["../../etc/passwd"]},
                "leaves the run's working directory",
            ),
            ({"code": "print(1)", "language": "python", "files": {"a": "a"}}, "not base64"),
        ],
    )
    def test_schema_errors_are_422_saying_why(self, endpoint, body, detail):
        response = httpx.post(f"{endpoint}/run_code", json=body)
        assert response.status_code == 422 and detail in response.text, response.text

    def test_files_over_the_working_directory_are_refused(self):
        big = base64.b64encode(bytes(2 << 20)).decode()
        with running_server(ServerConfig(LocalSandbox(timeout_s=5, tmp_mb=1))) as url:  # a 1 MB working directory
            response = httpx.post(
                f"{url}/run_code", json={"code": "", "language": "python", "files": {"a": big}}, timeout=30
            )
        assert response.status_code == 413 and "1 MB working directory" in response.text

    def test_missing_fetch_files_are_named(self, endpoint):
        body = post(endpoint, code="open('here', 'w').write('x')", fetch_files=["here", "gone"])
        assert body["status"] == "Success" and body["files"] == {"here": b64("x")} and "['gone']" in body["message"]

    def test_output_cap_keeps_our_status(self, endpoint):
        body = post(endpoint, code="while True:\n    print('spam')")
        run = body["run_result"]
        assert (body["status"], run["status"], run["return_code"]) == ("Failed", "Finished", -9)
        assert (body["srt_status"], body["truncated"]) == ("output_limit", True)

    def test_runtime_is_reported(self, endpoint):
        report = httpx.get(f"{endpoint}/v1/runtime", timeout=30).json()
        assert {"bash", "python", "python3"} <= set(report["languages"]) and report["sandboxed"] is True
        assert set(report["languages"]) - {"python3"} == set(languages.available())
        assert report["python"]["version"].count(".") == 2 and report["limits"]["max_timeout_s"] == MAX_TIMEOUT_S
        if runtime_python() is not None:
            assert (
                report["python"]["executable"] == f"{RUNTIME_MOUNT}/bin/python"
                and "sympy" in report["python"]["packages"]
            )
            assert report["python"]["host_executable"] == str(runtime_python())

    @pytest.mark.skipif(not Path("/usr/bin/python3").is_file(), reason="machine: no /usr/bin/python3 to choose")
    def test_serve_python_picks_the_interpreter(self):
        with cli_server(["--python", "/usr/bin/python3"]) as url:
            report = httpx.get(f"{url}/v1/runtime", timeout=30).json()
            body = post(url, code="import sys\nprint(sys.executable)")
        assert report["python"]["executable"] == body["run_result"]["stdout"].strip() == "/usr/bin/python3"

    def test_our_client_sends_and_fetches_files(self, endpoint):
        client = SandboxFusionSandbox(endpoint, timeout_s=10)
        code = "open('out.bin', 'wb').write(open('in.bin', 'rb').read()[::-1])"
        result = client.run(code, files={"in.bin": b"\x00\x01\x02", "skipped": None}, fetch_files=["out.bin"])
        assert (result.status, result.files) == ("ok", {"out.bin": b"\x02\x01\x00"}), result
        capped = client.run("print('x' * 10**6)")
        assert (capped.status, capped.exit_code, capped.truncated) == ("output_limit", None, True)

    def test_requests_run_concurrently(self, endpoint):
        code = "import time\nstart = time.time()\ntime.sleep(1)\nprint(start, time.time())"
        client = SandboxFusionSandbox(endpoint, timeout_s=10)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: client.run(code), range(4)))
        spans = [tuple(map(float, r.stdout.split())) for r in results]
        overlapping = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
        assert all(r.status == "ok" for r in results) and overlapping >= 2
