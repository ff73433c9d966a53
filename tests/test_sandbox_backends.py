"""The SandboxFusion HTTP client (retries, status mapping) and the Docker sandbox's unreachable-daemon error.

ByteDance's SandboxFusion server needs Docker, which does not run here: the client is driven against
a small real HTTP server that answers with SandboxFusion's documented response shapes, and against
srt-agent's own server in tests/test_sandbox_server.py.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from srt_agent.tools import (
    DockerSandbox,
    SandboxFusionSandbox,
    SandboxUnavailable,
    make_sandbox,
)
from srt_agent.tools.sandbox_fusion import result_from_response


def finished(stdout: str = "", stderr: str = "", code: int = 0, status: str = "Success") -> dict:
    run = {"status": "Finished", "execution_time": 0.01, "return_code": code, "stdout": stdout, "stderr": stderr}
    return {"status": status, "message": "", "compile_result": None, "run_result": run, "files": {}}


class JoinedHTTPServer(ThreadingHTTPServer):
    """Closing waits for every handler, so none writes into a later test's captured output."""

    daemon_threads = False
    block_on_close = True


class ScriptedServer:
    """A real HTTP server that answers POST /run_code from a script of (HTTP status, body, delay)."""

    def __init__(self, script: list[tuple[int, dict | str, float]]):
        self.script = list(script)
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                outer.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                code, body, delay = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                time.sleep(delay)
                payload = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and hung up: what a timeout test wants

            def log_message(self, *args):
                pass

        self.httpd = JoinedHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def client(endpoint: str, **options) -> SandboxFusionSandbox:
    return SandboxFusionSandbox(endpoint, **{"timeout_s": 2, "retries": 3, "backoff_s": 0.01, **options})


class TestSandboxFusionClient:
    def test_posts_sandbox_fusion_json_and_maps_success(self):
        with ScriptedServer([(200, finished("4\n"), 0)]) as server:
            result = client(server.endpoint, memory_mb=256).run("print(2 + 2)", stdin="in", timeout_s=3)
        assert (result.status, result.stdout, result.exit_code) == ("ok", "4\n", 0)
        assert server.requests == [
            {
                "code": "print(2 + 2)",
                "language": "python",
                "run_timeout": 3,
                "compile_timeout": 10.0,
                "memory_limit_MB": 256,
                "stdin": "in",
            }
        ]

    def test_retries_server_errors_then_succeeds(self):
        script = [(503, "busy", 0), (500, "oops", 0), (200, finished("ok\n"), 0)]
        with ScriptedServer(script) as server:
            result = client(server.endpoint).run("print('ok')")
        assert result.status == "ok" and len(server.requests) == 3

    def test_gives_up_after_retries_with_a_sandbox_error(self):
        with ScriptedServer([(502, "bad gateway", 0)]) as server:
            result = client(server.endpoint, retries=2).run("print(1)")
        assert result.status == "sandbox_error" and "failed 2 times" in result.stderr and "HTTP 502" in result.stderr
        assert len(server.requests) == 2

    def test_retries_a_request_that_times_out(self):
        script = [(200, finished("slow\n"), 1.5), (200, finished("fast\n"), 0)]
        with ScriptedServer(script) as server:
            result = client(server.endpoint, timeout_s=0.2, compile_timeout_s=0.1, http_slack_s=0.2).run("print(1)")
        assert result.stdout == "fast\n" and len(server.requests) == 2

    def test_client_errors_are_not_retried(self):
        with ScriptedServer([(422, {"detail": "code missing"}, 0)]) as server:
            result = client(server.endpoint).run("print(1)")
        assert result.status == "sandbox_error" and "HTTP 422" in result.stderr and len(server.requests) == 1

    def test_unreachable_server_is_a_sandbox_error(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        result = client(f"http://127.0.0.1:{port}", retries=2).run("print(1)")
        assert result.status == "sandbox_error" and "ConnectError" in result.stderr

    def test_endpoint_from_environment(self, monkeypatch):
        monkeypatch.setenv("SANDBOX_FUSION_ENDPOINT", "http://sandbox.internal:9000/")
        assert SandboxFusionSandbox().endpoint == "http://sandbox.internal:9000"
        monkeypatch.delenv("SANDBOX_FUSION_ENDPOINT")
        assert SandboxFusionSandbox().endpoint == "http://localhost:8080"

    @pytest.mark.parametrize("options", [{"endpoint": "localhost:8080"}, {"timeout_s": 0}, {"retries": 0}])
    def test_bad_options_raise(self, options):
        with pytest.raises(ValueError):
            SandboxFusionSandbox(**options)


class TestSandboxFusionResponses:
    """ByteDance's server's response shapes (sandbox/server/sandbox_api.py) mapped to our statuses."""

    def test_success(self):
        assert result_from_response(finished("hi\n"), 0.1).status == "ok"

    def test_failed_program(self):
        body = finished(stderr="Traceback...\nValueError: x\n", code=1, status="Failed")
        result = result_from_response(body, 0.1)
        assert (result.status, result.exit_code) == ("error", 1)

    def test_memory_error(self):
        body = finished(stderr="Traceback...\nMemoryError\n", code=1, status="Failed")
        assert result_from_response(body, 0.1).status == "memory"

    def test_killed_by_signal(self):
        assert result_from_response(finished(code=-9, status="Failed"), 0.1).status == "killed"

    def test_time_limit(self):
        body = finished(status="Failed")
        body["run_result"].update(status="TimeLimitExceeded", return_code=None)
        assert result_from_response(body, 0.1).status == "timeout"

    def test_sandbox_error(self):
        body = {"status": "SandboxError", "message": "runner crashed", "compile_result": None, "run_result": None}
        result = result_from_response(body, 0.1)
        assert result.status == "sandbox_error" and result.stderr == "runner crashed"

    def test_srt_status_is_taken_when_present(self):
        body = {**finished("x" * 10, code=-9, status="Failed"), "srt_status": "output_limit", "truncated": True}
        result = result_from_response(body, 0.1)
        assert (result.status, result.truncated, result.exit_code) == ("output_limit", True, None)

    def test_fetched_files_are_decoded(self):
        body = {**finished(""), "files": {"out.bin": "AAH/", "a.txt": ""}}
        assert result_from_response(body, 0.1).files == {"out.bin": b"\x00\x01\xff", "a.txt": b""}

    @pytest.mark.parametrize("files", [["a"], {"a": 1}, {"a": "a"}])
    def test_files_that_are_not_base64_are_not_a_response(self, files):
        with pytest.raises(ValueError, match="files"):
            result_from_response({**finished(""), "files": files}, 0.1)


class TestDocker:
    def test_missing_docker_sdk_is_a_clear_error(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "docker", None)  # as if `pip install docker` never ran
        with pytest.raises(SandboxUnavailable, match=r"needs the docker SDK: pip install 'srt-agent\[docker\]'"):
            DockerSandbox(timeout_s=2)

    def test_unreachable_daemon_is_a_clear_error(self, monkeypatch, tmp_path):
        pytest.importorskip("docker", reason="the docker client is an optional extra: pip install 'srt-agent[docker]'")
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
        with pytest.raises(SandboxUnavailable, match="cannot reach the Docker daemon.*make_sandbox\\('local'\\)"):
            DockerSandbox(timeout_s=2)
        with pytest.raises(SandboxUnavailable, match="cannot reach the Docker daemon"):
            make_sandbox("docker")

    def test_bad_limits_are_rejected_before_contacting_docker(self):
        with pytest.raises(ValueError, match="cpus > 0"):
            DockerSandbox(cpus=0)
