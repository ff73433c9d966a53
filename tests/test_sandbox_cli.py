"""`srt-agent sandbox run` and `srt-agent sandbox bench` end to end (serve: tests/test_server.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.tools.local import bwrap_path

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
runner = CliRunner()


def test_run_prints_the_result_as_json(tmp_path):
    program = tmp_path / "p.py"
    program.write_text("print(3 * 14)\nraise SystemExit(2)\n")
    outcome = runner.invoke(app, ["sandbox", "run", str(program), "--timeout-s", "5"])
    assert outcome.exit_code == 0, outcome.output
    result = json.loads(outcome.output)
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
