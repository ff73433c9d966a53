"""`srt-agent sandbox run` and `srt-agent sandbox bench` end to end; `sandbox serve` takes any served sandbox
from the registry (its API: tests/test_sandbox_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import httpx
import pytest
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.tools import SANDBOX_KINDS, SandboxResult
from srt_agent.tools.factory import SandboxEntry
from srt_agent.tools.local import bwrap_path
from srt_agent.tools.server import running_server

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
runner = CliRunner()


def test_run_prints_the_result_as_json(tmp_path):
    program = tmp_path / "p.py"
    program.write_text("print(3 * 14)\nraise SystemExit(2)\n")
    outcome = runner.invoke(app, ["sandbox", "run", str(program), "--timeout-s", "5"])
    assert outcome.exit_code == 0, outcome.output
    result = json.loads(outcome.stdout)
    assert (result["status"], result["stdout"], result["exit_code"]) == ("error", "42\n", 2)


def test_run_reports_an_unavailable_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    outcome = runner.invoke(app, ["sandbox", "run", "-", "--kind", "docker"], input="print(1)")
    assert outcome.exit_code == 1 and "Docker daemon" in outcome.output


def test_bench_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    outcome = runner.invoke(app, ["sandbox", "bench", "--runs", "2", "--workers", "2", "--json", str(out)])
    assert outcome.exit_code == 0, outcome.output
    result = json.loads(out.read_text())
    assert set(result) == {"program", "bare_python", "local", "server"}
    for name in ("local", "server"):
        assert result[name]["latency"]["runs"] == 2 and result[name]["throughput"][0]["all_ok"]


def test_bench_load_mode_reports_a_flood(tmp_path):
    """`sandbox bench --concurrency`: a small flood against a server started in-process, as JSON."""
    out = tmp_path / "load.json"
    args = ["sandbox", "bench", "--concurrency", "3", "--program", "print", "--run-timeout", "5", "--json", str(out)]
    outcome = runner.invoke(app, [*args, "--probe-after", "0.1"])
    assert outcome.exit_code == 0, outcome.output
    result = json.loads(out.read_text())
    assert (result["answered_in_time"], result["successes"], result["statuses"]) == (3, 3, {"Success/Finished (ok)": 3})
    assert result["probe"]["status"] == "Success/Finished (ok)" and result["p99_s"] >= result["p50_s"] > 0


def test_bench_load_mode_probes_during_and_after_a_flood(tmp_path):
    """`--probe-every`: interactive print(1) probes while the flood runs and `--after` it, their figures apart."""
    out = tmp_path / "load.json"
    args = ["sandbox", "bench", "--concurrency", "3", "--program", "sleep", "--run-timeout", "6", "--json", str(out)]
    outcome = runner.invoke(app, [*args, "--probe-after", "0.1", "--probe-every", "0.5", "--after", "1"])
    assert outcome.exit_code == 0, outcome.output
    probes = json.loads(out.read_text())["probes"]
    assert probes["during"]["count"] >= 1 and probes["after"]["count"] >= 1, probes
    assert set(probes["during"]["statuses"]) == set(probes["after"]["statuses"]) == {"Success/Finished (ok)"}
    assert probes["during"]["p99_s"] >= probes["during"]["p50_s"] > 0


@dataclass
class PlainSandbox:
    """A sandbox registered by a test: programs run with this interpreter, not isolated."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_output_bytes: int = 65536
    tmp_mb: int = 64
    max_file_mb: int = 16
    sandboxed: bool = False

    def languages(self) -> list[str]:
        return ["python"]

    def origin(self) -> dict[str, str]:
        return {"plain": sys.executable}

    def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None, **_) -> SandboxResult:
        done = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, timeout=30)
        return SandboxResult(status="ok" if done.returncode == 0 else "error", stdout=done.stdout, stderr=done.stderr)


def test_serve_serves_any_registered_sandbox(monkeypatch):
    monkeypatch.setitem(SANDBOX_KINDS, "plain", SandboxEntry(f"{__name__}:PlainSandbox", served=True))
    served = []
    monkeypatch.setattr("srt_agent.tools.server.serve", lambda config, **_: served.append(config))
    outcome = runner.invoke(app, ["sandbox", "serve", "--backend", "plain", "--memory-mb", "300"])
    assert outcome.exit_code == 0, outcome.output
    assert f"sandbox plain: {sys.executable}" in outcome.output
    config = served[0]
    assert isinstance(config.sandbox, PlainSandbox) and config.sandbox.memory_mb == 300
    with running_server(config) as url:
        runtime = httpx.get(f"{url}/v1/runtime", timeout=30).json()
        answer = httpx.post(f"{url}/run_code", json={"code": "print(6 * 7)", "language": "python"}, timeout=30).json()
    assert runtime["languages"] == ["python", "python3"] and runtime["sandboxed"] is False
    assert runtime["python"]["plain"] == sys.executable
    assert (answer["status"], answer["run_result"]["stdout"]) == ("Success", "42\n")


def test_serve_refuses_a_sandbox_that_runs_nothing_itself():
    outcome = runner.invoke(app, ["sandbox", "serve", "--backend", "sandbox_fusion"])
    assert outcome.exit_code == 1 and "choose local or docker" in outcome.output


def test_sandboxes_load_on_first_use():
    modules = ("srt_agent.tools.local", "srt_agent.tools.docker_sandbox", "srt_agent.tools.sandbox_fusion")
    probe = f"import sys, srt_agent.tools; print(any(m in sys.modules for m in {modules}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
