"""`srt-agent bench paper`'s machinery on a tiny random model: every method regenerates every step from the
same weights and seeds, the exact ones token for token, SPEC-RL flagged; the tables and plots come out."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from helpers.progress_lines import progress_lines
from rich.console import Console

from srt_agent.bench import paper as paper_bench
from srt_agent.bench.paper import (
    Method,
    PaperBenchConfig,
    ablation_table,
    available_methods,
    merge_results,
    paper_table,
    plot_paper,
    run_paper_bench,
)
from srt_agent.console import progress
from srt_agent.rl.rollouts import PolicyRollouts

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "cold_start.enabled=false",
    "engine.calibrate=false",
    "max_tokens_per_turn=12",
    "max_response_tokens=40",
    "max_turns=2",
    "engine.max_batch=4",
    "engine.max_context=512",
    "engine.run_ahead.tokens_per_sequence=8",
]


def test_methods_missing_from_the_build_are_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(
        paper_bench, "PAPER_METHODS", paper_bench.PAPER_METHODS + (Method("future", "A future drafter", "no-such"),)
    )
    runnable, skipped = available_methods(("srt", "future"))
    assert [m.name for m in runnable] == ["none", "srt"]  # the baseline always runs first: it trains
    assert "not in this build" in skipped["future"]
    with pytest.raises(ValueError, match="unknown method"):
        available_methods(("warp-drive",))


def test_paper_bench_on_a_tiny_model(tmp_path):
    cfg = PaperBenchConfig(
        algorithms=("grpo",),
        steps=2,
        prompts_per_step=2,
        samples=2,
        dataset_n=2,
        ablation_samples=4,
        model="tiny-llama",
        out=str(tmp_path / "runs"),
        overrides=TINY,
    )
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    with progress(console, "bench paper", paper_bench.paper_steps(cfg)) as work:
        result = run_paper_bench(cfg, log=lambda _: None, work=work)
    assert progress_lines(shown.getvalue(), "bench paper") == 4  # a line per RL step: 2 of GRPO, 2 of its n-ablation
    names = [m["name"] for m in result["methods"]]
    assert names[0] == "none" and {"srt", "srt+run-ahead", "spec-rl", "suffix", "history", "ngram"} <= set(names)
    assert set(names) | set(result["skipped"]) == {m.name for m in paper_bench.PAPER_METHODS}
    for run in result["runs"]:
        assert run["samples"] == 2 and len(run["reward"]) == 2
        # the training rollouts come from an engine of their own; every measured method regenerates them
        assert {r["variant"] for r in run["rows"]} == set(run["cells"]) | {paper_bench.TRAINER}
        # every method's rollouts of every step were compared, step 1 (untimed) included
        assert [(r["step"], r["trajectories"]) for r in run["rows"] if r["variant"] == "srt"] == [(1, 4), (2, 4)]
        for name, c in run["cells"].items():
            assert c["steps"] == 1 and c["step_s"] >= c["gen_s"] > 0 and c["ms_per_token"] > 0
            assert not c["mismatch"], name
        # float64 tiny model: no near-ties, so every exact method matches plain decoding
        exact = {name: (c["identical"], c["differing_tokens"]) for name, c in run["cells"].items() if c["exact"]}
        assert set(exact) == set(run["cells"]) - {"spec-rl"} and set(exact.values()) == {(1.0, 0)}
        spec = run["cells"]["spec-rl"]
        assert not spec["exact"] and spec["lenience"] > 1
        assert (spec["differing_tokens"] > 0) == (spec["differing_trajectory_share"] > 0)
    wide = result["ablation"]["runs"][1]
    assert (
        wide["samples"] == 4
        and wide["prompts_per_step"] == 1
        and set(wide["cells"]) == {"none", "suffix", "srt", "srt+run-ahead"}
    )
    table = paper_table(result)
    assert table.count("\n| ") == len(names) and "GRPO" in table and "SPEC-RL" in table
    assert "SRT's lead over SuffixDecoding" in ablation_table(result)
    paths = plot_paper(result, tmp_path / "plots")
    assert len(paths) == 2 and all(p.stat().st_size > 0 for p in paths)
    merged = merge_results([result, json.loads(json.dumps(result))])  # e.g. one process per algorithm
    assert len(merged["runs"]) == 2 and paper_table(merged).count("\n| ") == len(names)
    assert result["mismatches"] == merged["mismatches"] == [] and "MISMATCH" not in table


@pytest.mark.parametrize("changed", ["srt", "none"])
def test_a_token_that_differs_from_plain_decoding_is_flagged(tmp_path, monkeypatch, changed):
    """One token of one trajectory of `changed` altered in step 1, which the times leave out: the baseline
    is checked against the training rollouts, every other method against the baseline."""
    real_run = PolicyRollouts.run

    def run(self, drafter, *args, **kwargs):
        out = real_run(self, drafter, *args, **kwargs)
        if drafter == changed and not altered and len(out.trajectories) > 1:  # not the untimed one-task warm-up
            out.trajectories[-1].response_ids[0] += 1
            altered.append(drafter)
        return out

    altered, logged = [], []
    monkeypatch.setattr(PolicyRollouts, "run", run)
    cfg = PaperBenchConfig(
        algorithms=("grpo",),
        methods=("srt", "suffix"),
        steps=2,
        prompts_per_step=2,
        samples=2,
        dataset_n=2,
        ablation_samples=0,
        model="tiny-llama",
        out=str(tmp_path / "runs"),
        overrides=TINY,
    )
    result = run_paper_bench(cfg, log=logged.append)
    cells = result["runs"][0]["cells"]
    flagged = {name for name, c in cells.items() if c["mismatch"]}
    # an altered baseline makes every method differ from it in that step
    assert flagged == ({"srt"} if changed == "srt" else {"none", "srt", "suffix"})
    assert (cells[changed]["identical"], cells[changed]["differing_tokens"]) == (7 / 8, 1)  # 1 of 2 steps × 4
    assert len(result["mismatches"]) == len(flagged) and f"grpo n=2: {changed} differs" in "\n".join(
        result["mismatches"]
    )
    assert any(f"step 1: MISMATCH: {changed}'s rollouts" in line for line in logged)
    assert "MISMATCH" in paper_table(result)


def test_a_missing_trajectory_differs_in_all_its_tokens():
    ref = [SimpleNamespace(response_ids=[1, 2, 3]), SimpleNamespace(response_ids=[4, 5])]
    assert paper_bench.token_differences(ref, ref) == (0, 0)
    assert paper_bench.token_differences(ref, ref[:1]) == (1, 2)
    assert paper_bench.token_differences(ref[:1], ref) == (1, 2)
    assert paper_bench.token_differences(ref, [SimpleNamespace(response_ids=[1, 9]), ref[1]]) == (1, 2)
