"""Faults at the SandboxFusion-compatible server and its client: malformed and oversized requests and a
raising sandbox among good requests in flight, and a server that answers garbage.

Each bad request gets its own clear answer (422, 413, 400 or a SandboxError naming the problem) while
the good ones, sent at the same time, come back right; the client turns a garbage answer into a
`sandbox_error` result instead of raising.
"""

from __future__ import annotations

import http.server
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers.fault_injection import HostState, InjectedFault, host_leaks
from helpers.faults_report import FaultRecord

from srt_agent.tools import LocalSandbox, SandboxFusionSandbox
from srt_agent.tools.local import bwrap_path
from srt_agent.tools.server import ServerConfig, running_server

MAX_REQUEST_BYTES = 64 << 10
RAISE_MARK = "# the sandbox raises on this one"


class RaisingSandbox(LocalSandbox):
    """The local sandbox, except that it raises (a sandbox bug) for programs carrying RAISE_MARK."""

    def run(self, code, *, stdin="", timeout_s=None):
        if RAISE_MARK in code:
            raise InjectedFault("the sandbox broke")
        return super().run(code, stdin=stdin, timeout_s=timeout_s)


def chunked(data: bytes):
    for i in range(0, len(data), 8192):
        yield data[i : i + 8192]


JSON = {"content-type": "application/json"}
BAD_REQUESTS = {
    # kind: (request keyword arguments for httpx.post, expected status, text in the answer)
    "not JSON": (dict(content=b"{code: print(1)", headers=JSON), 422, "JSON"),
    "wrong types": (dict(json={"code": ["print(1)"], "language": "python"}), 422, "code"),
    "no code": (dict(json={"language": "python"}), 422, "code"),
    "oversized": (
        dict(json={"code": "#" * (2 * MAX_REQUEST_BYTES), "language": "python"}),
        413,
        "over this server's limit",
    ),
    "oversized, chunked": (
        dict(content=chunked(b'{"code": "' + b"#" * (2 * MAX_REQUEST_BYTES) + b'"}'), headers=JSON),
        413,
        "over this server's limit",
    ),
    "sandbox raises": (
        dict(json={"code": f"print(1)\n{RAISE_MARK}", "language": "python"}),
        200,
        "InjectedFault: the sandbox broke",
    ),
}


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
def test_bad_requests_among_good_ones(ledger):
    host = HostState.now()
    config = ServerConfig(RaisingSandbox(timeout_s=10), workers=4, max_request_bytes=MAX_REQUEST_BYTES)
    good = [f"import time\ntime.sleep(0.3)\nprint({i} ** 2)" for i in range(8)]
    with running_server(config) as url, httpx.Client(base_url=url, timeout=30) as client:
        post = lambda kwargs: client.post("/run_code", **kwargs)  # noqa: E731
        with ThreadPoolExecutor(8) as pool:
            bodies = [{"code": code, "language": "python"} for code in good]
            requests = [dict(content=chunked(json.dumps(bodies[0]).encode()), headers=JSON)] + [
                dict(json=b) for b in bodies[1:]
            ]
            good_answers = [pool.submit(post, request) for request in requests]  # the first one chunked
            bad_answers = {kind: pool.submit(post, spec[0]) for kind, spec in BAD_REQUESTS.items()}
            good_answers = [f.result() for f in good_answers]
            bad_answers = {kind: f.result() for kind, f in bad_answers.items()}
        after = post(dict(json={"code": "print('still serving')", "language": "python"}))
    hit = [
        i for i, r in enumerate(good_answers) if r.status_code != 200 or r.json()["run_result"]["stdout"] != f"{i**2}\n"
    ]
    hit += [] if after.json()["run_result"]["stdout"] == "still serving\n" else ["after"]
    leaks = host_leaks(host)
    for kind in BAD_REQUESTS:
        ledger.record(FaultRecord("server", kind, 1, len(good) + 1, len(hit), len(leaks)))
    assert hit == [] and leaks == []
    for kind, (_, status, text) in BAD_REQUESTS.items():
        answer = bad_answers[kind]
        assert answer.status_code == status and text in answer.text, (kind, answer.status_code, answer.text[:300])
    assert bad_answers["sandbox raises"].json()["status"] == "SandboxError"


class GarbageHandler(http.server.BaseHTTPRequestHandler):
    """Answers every POST with 200 and a body that is not SandboxFusion's."""

    bodies = [b"[1, 2, 3]", b'{"status": "Success", "run_result": "done"}', b'{"run_result": {"stdout": 7}}', b"<html>"]

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["content-length"]))
        body = self.bodies[self.server.answered % len(self.bodies)]
        self.server.answered += 1
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_answering_garbage_is_a_sandbox_error(ledger):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GarbageHandler)
    server.answered = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = SandboxFusionSandbox(
            f"http://127.0.0.1:{server.server_port}", retries=len(GarbageHandler.bodies), backoff_s=0.01
        )
        result = client.run("print(1)")
        client.close()
    finally:
        server.shutdown()
        server.server_close()
    ledger.record(FaultRecord("server", "client gets garbage", server.answered, 0, 0, 0))
    assert server.answered == len(GarbageHandler.bodies)  # every garbage answer was retried
    assert result.status == "sandbox_error" and "not SandboxFusion's" in result.stderr
    assert json.loads(GarbageHandler.bodies[0]) == [1, 2, 3]
