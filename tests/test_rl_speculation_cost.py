"""Where speculation's time goes: every backend reports its drafting totals under ``stats()["speculation"]``, a
step's metrics carry them, and a step that ran slower than a compared plain variant says where the time went."""

from __future__ import annotations

from srt_agent.agent.rollout import RolloutSummary
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.rl.metrics import speculation_metrics
from srt_agent.rl.report import slower_line
from srt_agent.rl.rollouts import RolloutRun


def test_our_engine_reports_what_drafting_cost(tiny_llama):
    engine = Engine(tiny_llama, EngineOptions(drafter="srt", max_context=128))
    prompt = list(range(5, 25))
    params = SamplingParams(max_tokens=24, seed=3, temperature=0.0)
    for _ in range(3):  # greedy repeats: the tree drafts what was generated before
        engine.generate([prompt], params)
    stats = engine.totals.as_dict()
    spec = stats["speculation"]
    assert spec["drafted"] == stats["draft_verified"] > 0
    assert spec["accepted"] == stats["draft_accepted"] <= spec["drafted"]
    assert spec["host_s"] > 0 and spec["verify_s"] > 0


SUMMARY = RolloutSummary(0, 1.0, 0.0, 1.0, 0, 0, 0, 0.0, 0, 0, 0.0, 0, 0.0, 0.0, 0.0)


def _run(spec: dict) -> RolloutRun:
    return RolloutRun("srt", [], SUMMARY, speculation=spec)


def test_a_steps_speculation_metrics_add_its_runs():
    runs = [
        _run(dict(host_s=0.5, drafted=100, accepted=60, verify_s=2.0)),
        _run(dict(host_s=0.25, drafted=100, accepted=20, verify_s=2.0)),
    ]
    m = speculation_metrics(runs)
    assert m == {"srt/draft_host_s": 0.75, "srt/rejected_tokens": 120.0, "srt/rejected_s": 4.0 * 120 / 200}
    assert speculation_metrics([RolloutRun("none", [], SUMMARY)]) == {}


def test_a_slower_step_says_where_its_extra_time_went():
    metrics = {
        "step": 1.0,
        "timing_s/gen": 30.0,
        "compare/none/gen_s": 20.0,
        "srt/draft_host_s": 1.0,
        "srt/rejected_s": 6.0,
        "srt/rejected_tokens": 900.0,
    }
    line = slower_line(metrics, "srt", "none")
    assert "10.0 s longer than none" in line and "host 1.00 s" in line
    assert "rejected drafts 6.00 s (900 tokens)" in line and "the rest 3.00 s" in line
    assert slower_line({**metrics, "compare/none/gen_s": 31.0}, "srt", "none") is None


def test_a_trace_records_drafting_host_time_from_every_backends_speculation_figures():
    """The projection's host µs per row come from ``speculation.host_s``, which vLLM's proposer reports too."""
    from srt_agent.config import EnvConfig
    from srt_agent.rl.projection import host_s_per_row
    from srt_agent.rl.rollout_trace import TraceBook
    from srt_agent.rl.rollouts import RolloutVariant

    book = TraceBook(EnvConfig(model="tiny-llama"), [RolloutVariant("srt", "srt")])
    run = _run(dict(host_s=0.5, drafted=10, accepted=5, verify_s=0.1))
    run.bookkeeping_s = 0.25
    book.add(1, {"srt": [run, _run(dict(host_s=0.25, drafted=0, accepted=0, verify_s=0.0))]})
    step = book.traces["srt"].steps[0]
    assert (step.draft_s, step.bookkeeping_s) == (0.75, 0.25)
    assert host_s_per_row(book.traces["srt"]) is None  # no forwards recorded: nothing to divide by


def test_a_step_time_splits_into_speed_at_equal_load_and_work():
    """Ours ran 16 sequences at half their speed, and a tail of 1 sequence they never ran: that tail is counted
    at our own speed, the 16-row steps at theirs."""
    from srt_agent.engine.tail import TailStats, at_their_speed

    ours, theirs = TailStats(), TailStats()
    ours.count(16, 2.0, 100)  # 50 tok/s at 16 running
    ours.count(1, 1.0, 10)
    theirs.count(16, 1.0, 100)  # 100 tok/s at 16 running
    theirs.count(16, 0.5, 50)
    assert at_their_speed(ours.as_dict(), theirs.as_dict()) == 100 / (150 / 1.5) + 1.0
    assert at_their_speed(ours.as_dict(), TailStats().as_dict()) is None


def test_a_slower_step_splits_into_speed_work_and_the_rest():
    metrics = {
        "step": 2.0,
        "timing_s/gen": 10.0,
        "compare/none/gen_s": 7.0,
        "compare/none/step_s": 6.0,
        "compare/none/ours_step_s": 9.0,
        "compare/none/ours_at_their_speed_s": 8.5,
        "compare/none/identical": 0.25,
        "srt/draft_host_s": 0.1,
        "srt/rejected_s": 0.2,
    }
    line = slower_line(metrics, "srt", "none")
    assert "3.0 s longer than none" in line and "speed +0.50 s" in line and "work +2.50 s" in line
    assert "25% of trajectories identical" in line and "the rest +0.00 s" in line and "host 0.10 s" in line
