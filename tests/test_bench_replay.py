"""Rollout traces and their replay without the model: exact where the engine's schedule is, sweepable."""

from __future__ import annotations

import pytest

from srt_agent.agent.env import ToolCallRecord
from srt_agent.agent.trajectory import Trajectory
from srt_agent.bench.replay import replay_sweep
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.engine.options import RunAheadOptions
from srt_agent.engine.stats import cost_table, engine_settings
from srt_agent.rl.replay import ReplayOptions, replay
from srt_agent.rl.rollout_trace import RolloutTrace, TracedRunAhead, TracedStep, TracedTrajectory

PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12]]
MAX_TOKENS = 16


pytestmark = pytest.mark.usefixtures("one_thread")


def recorded_run(model, steps: int = 3) -> RolloutTrace:
    """GRPO-shaped single-turn steps through the real engine (every draft verified: no timing in the
    schedule), recorded as a trace."""
    engine = Engine(
        model, EngineOptions(drafter="srt", max_batch=8, max_context=128, calibrate=False, adaptive_drafts=False)
    )
    trace = RolloutTrace(
        "srt", "srt", limits=dict(max_tokens_per_turn=MAX_TOKENS, max_response_tokens=1000), **engine_settings(engine)
    )
    for step in range(steps):
        cost = cost_table(engine.cost_model)
        params = [SamplingParams(temperature=0.3, max_tokens=MAX_TOKENS, seed=10 * step + i) for i in range(6)]
        outs = engine.generate([PROMPTS[i % 3] for i in range(6)], params, prompt_keys=[f"p{i % 3}" for i in range(6)])
        engine.end_step()
        trajectories = [
            TracedTrajectory(
                f"p{i % 3}",
                PROMPTS[i % 3],
                [o.token_ids],
                [],
                [],
                forwards=o.metrics.forwards,
                draft_accepted=o.metrics.draft_accepted,
            )
            for i, o in enumerate(outs)
        ]
        trace.steps.append(TracedStep(step + 1, trajectories, cost))
    return trace


def test_replay_reproduces_the_engine_exactly_when_its_schedule_has_no_timing(tiny_llama, tmp_path):
    trace = recorded_run(tiny_llama)
    assert sum(t.draft_accepted for s in trace.steps for t in s.trajectories) > 0  # siblings and history drafted
    loaded = RolloutTrace.load(trace.save(tmp_path / "trace.json"))
    for step in replay(loaded):
        assert step.forwards == sum(t.forwards for t in loaded.steps[step.step - 1].trajectories)
        assert step.accepted_per_forward == step.recorded_accepted_per_forward and step.error == 0.0
    # Without drafts nothing is accepted; with a smaller tree budget no more than with the recorded one.
    assert all(s.accepted == 0 for s in replay(loaded, ReplayOptions(drafter="none")))
    small = replay(loaded, ReplayOptions(max_draft_tokens=1))
    assert sum(s.accepted for s in small) <= sum(t.draft_accepted for s in loaded.steps for t in s.trajectories)


def test_recorded_run_ahead_content_feeds_the_simulated_bubbles(tiny_llama):
    trace = recorded_run(tiny_llama, steps=2)
    # Run-ahead content: the next step's actual continuations are real samples of the same prompts.
    trace.steps[0].run_ahead = [
        TracedRunAhead("p1", PROMPTS[1], t.turns[0]) for t in trace.steps[1].trajectories if t.prompt_key == "p1"
    ]
    trace.run_ahead = {"slack": 5.0, "tokens_per_sequence": 8}
    steps = replay(trace)
    assert steps[0].run_ahead_tokens == 2 * 8 and steps[1].run_ahead_tokens == 0
    sweep = replay_sweep(trace, max_draft_tokens=[2, 16], slack=[0.0, 5.0])
    assert len(sweep["rows"]) == 4
    by = {(r["setting"]["max_draft_tokens"], r["setting"]["slack"]): r for r in sweep["rows"]}
    assert by[(16, 0.0)]["run_ahead_tokens"] == 0 and by[(16, 5.0)]["run_ahead_tokens"] == 16
    assert by[(16, 5.0)]["accepted_per_forward"] >= by[(16, 0.0)]["accepted_per_forward"]
    with pytest.raises(ValueError, match="needs a drafter that takes it"):
        replay(trace, ReplayOptions(drafter="history", run_ahead=RunAheadOptions()))


def test_trajectories_split_into_calls_and_bad_traces_are_refused(tmp_path):
    traj = Trajectory("r", 0, 0, prompt_ids=[1, 2])
    traj.append([3])  # a forced opening of the response
    traj.append([4, 5], [0.0, 0.0])
    traj.append([6, 7])  # the interpreter's output
    traj.append([8], [0.0])
    traj.tool_calls = [ToolCallRecord("code_interpreter", {}, "ok", "", 0.25, turn=0)]
    traj.forwards, traj.draft_accepted = 3, 1
    t = TracedTrajectory.of(traj, "k")
    assert (t.prompt_ids, t.prefix_len, t.turns, t.observations, t.waits_s) == (
        [1, 2, 3],
        1,
        [[4, 5], [8]],
        [[6, 7]],
        [0.25],
    )
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a rollout trace"):
        RolloutTrace.load(tmp_path / "bad.json")
