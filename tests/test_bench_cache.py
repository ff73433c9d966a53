"""`srt-agent bench cache`: the workload, greedy verification, and the CLI's JSON."""

from __future__ import annotations

import json

from helpers.progress_lines import progress_lines
from typer.testing import CliRunner

from srt_agent.bench.cache import (
    METRICS,
    WorkloadSpec,
    accepted_tokens,
    available_drafters,
    make_workload,
    run_drafter,
)
from srt_agent.bench.cache_scale import ScaleSetting, scale_run
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
    assert progress_lines(result.output, "bench cache") == 2 * len(names)  # a line per mode and drafter
    if "arctic" in names:
        assert set(data["ratios"]["lockstep"]) == {f"{n}/arctic" for n in names if n != "arctic"}
    else:
        assert "ratios" not in data


def test_cli_bench_cache_rejects_unknown_modes_and_drafters():
    runner = CliRunner()
    assert runner.invoke(app, ["bench", "cache", "--quick", "--mode", "parallel"]).exit_code != 0
    result = runner.invoke(app, ["bench", "cache", "--quick", "--drafter", "medusa"])
    assert result.exit_code == 1 and "unknown drafter" in result.output


def test_a_reduced_scale_run_crosses_every_bound_at_bounded_work():
    """`bench cache --scale` in small: 64 rollouts in flight over budgets a few steps overflow. Every bound is
    crossed (the prompt trees' node cap and byte budget, the global tree's cap), every step finishes, and keeping
    the bounds costs at most a few tokens re-inserted per token stored."""
    run = scale_run(
        ScaleSetting.parse("64x300"), steps=3, rollouts_per_prompt=4, max_bytes=1 << 22, max_nodes_per_prompt=4000
    )
    steps = run["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["finished"] for s in steps)
    assert all(s["tokens"] == 64 * 300 for s in steps)
    assert sum(s["rebuilds"] for s in steps) > 0 and sum(s["trimmed_sequences"] for s in steps) > 0
    assert sum(s["evicted_prompts"] for s in steps) > 0
    assert all(s["work_per_token"] <= 4 for s in steps) and all(s["bytes"] <= 1 << 22 for s in steps)
    assert all(s["accepted_per_draft"] > 0 for s in steps[1:])  # later steps draft from the earlier ones


def test_cli_bench_cache_scale_writes_json_and_refuses_a_bad_setting(tmp_path):
    out = tmp_path / "scale.json"
    result = CliRunner().invoke(app, ["bench", "cache", "--scale", "16x50", "--steps", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [run["setting"] for run in data["scale"]] == [{"rollouts": 16, "tokens": 50}]
    assert len(data["scale"][0]["steps"]) == 2
    assert progress_lines(result.output, "bench cache") == 2  # a line per step
    bad = CliRunner().invoke(app, ["bench", "cache", "--scale", "16by50"])
    assert bad.exit_code == 2 and "ROLLOUTSxTOKENS" in bad.output
