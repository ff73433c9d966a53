"""`srt-agent bench cache`: the workload, greedy verification, and the CLI's JSON."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from srt_agent.bench.cache import (
    METRICS,
    WorkloadSpec,
    accepted_tokens,
    available_drafters,
    make_workload,
    run_drafter,
)
from srt_agent.cli import app
from srt_agent.drafting import Draft, make_drafter


def test_accepted_tokens_walks_the_draft_tree_along_the_truth():
    #        -1 ─ 5 ─ 6 ─ 7
    #          └─ 9 ─ 8
    draft = Draft([5, 9, 6, 8, 7], [-1, -1, 0, 1, 2], [0.5, 0.5, 0.5, 0.5, 0.5], 3)
    assert accepted_tokens(draft, [9, 8, 1]) == 2
    assert accepted_tokens(draft, [5, 6, 7, 4]) == 3
    assert accepted_tokens(draft, [5, 8]) == 1
    assert accepted_tokens(draft, [1]) == 0
    assert accepted_tokens(Draft(), [1, 2]) == 0
    assert accepted_tokens(draft, []) == 0


def test_workload_is_deterministic_and_sized_as_asked():
    spec = WorkloadSpec(prompts=3, rollouts=2, steps=2, tokens=50, seed=4)
    steps = make_workload(spec)
    assert steps == make_workload(spec)
    assert len(steps) == 2 and all(len(step) == 6 for step in steps)
    assert all(len(r.response) == 50 and len(r.prompt_ids) == spec.prompt_tokens for s in steps for r in s)
    assert steps != make_workload(WorkloadSpec(prompts=3, rollouts=2, steps=2, tokens=50, seed=5))


def test_run_drafter_counts_every_token_once():
    steps = make_workload(WorkloadSpec(prompts=2, rollouts=2, steps=1, tokens=40))
    plain = run_drafter(make_drafter("none"), steps, "lockstep", budget=4)
    assert plain.accepted_per_draft == 0 and plain.drafts == plain.tokens == 160
    srt = run_drafter(make_drafter("srt"), steps, "sequential", budget=4)
    assert srt.tokens == 160 and srt.drafts < 160 and srt.accepted_per_draft > 0


def test_cli_bench_cache_quick_writes_the_documented_json(tmp_path):
    out = tmp_path / "bench" / "cache.json"
    result = CliRunner().invoke(app, ["bench", "cache", "--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    names = available_drafters()
    assert set(data["modes"]) == {"sequential", "lockstep"}
    for per in data["modes"].values():
        assert list(per) == names
        for metrics in per.values():
            assert set(METRICS) <= set(metrics)
            assert metrics["draft_us_mean"] > 0 and metrics["draft_us_p99"] >= 0
            assert metrics["insert_us_per_token"] > 0
        # Later rollouts copy earlier ones: the SRT tree must accept, and sharing within a step
        # must beat seeing only earlier steps.
        assert per["srt"]["accepted_per_draft"] > 1.0
        assert per["srt"]["accepted_per_draft"] > per["history"]["accepted_per_draft"]
        assert 0 < per["srt"]["bytes_per_token"] < 200
        assert per["ngram"]["bytes_per_token"] is None
    if "arctic" in names:
        assert set(data["ratios"]["lockstep"]) == {f"{n}/arctic" for n in names if n != "arctic"}
    else:
        assert "ratios" not in data


def test_cli_bench_cache_rejects_unknown_modes_and_drafters():
    runner = CliRunner()
    assert runner.invoke(app, ["bench", "cache", "--quick", "--mode", "parallel"]).exit_code != 0
    result = runner.invoke(app, ["bench", "cache", "--quick", "--drafter", "medusa"])
    assert result.exit_code == 1 and "unknown drafter" in result.output
