"""A step's rollout figures under verl's metric names, and the side-by-side drafter comparison."""

from __future__ import annotations

from collections.abc import Sequence

from ..agent.rollout import RolloutSummary
from ..agent.trajectory import Trajectory
from .batch import Sample
from .evaluate import tool_use_report


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"{prefix}/mean": sum(values) / len(values), f"{prefix}/max": max(values), f"{prefix}/min": min(values)}


def rollout_metrics(trajectories: Sequence[Trajectory], summary: RolloutSummary) -> dict[str, float]:
    """Rewards, lengths, turns, tool use and speculation of one step's rollouts (the training drafter's)."""
    report = tool_use_report(trajectories)
    out: dict[str, float] = {}
    out.update(_stats("critic/score", [t.reward for t in trajectories]))
    out.update(_stats("response_length", [float(len(t.response_ids)) for t in trajectories]))
    out.update(_stats("prompt_length", [float(len(t.prompt_ids)) for t in trajectories]))
    out.update(_stats("num_turns", [float(t.num_turns) for t in trajectories]))
    n = max(len(trajectories), 1)
    out["response_length/clip_ratio"] = sum(t.finish_reason == "length" for t in trajectories) / n
    out["env/accuracy"] = report.accuracy
    out["env/tool_call_rate"] = report.tool_call_rate
    out["env/code_ok_rate"] = report.code_ok_rate
    out["env/tool_calls"] = float(summary.tool_calls)
    out["env/tool_time_s"] = summary.tool_time_s
    out["env/error_trajectories"] = float(sum(t.finish_reason == "error" for t in trajectories))
    out["srt/model_tokens"] = float(summary.model_tokens)
    out["srt/forced_tokens"] = float(summary.forced_tokens)
    out["srt/forwards"] = float(summary.forwards)
    out["srt/tokens_per_forward"] = summary.tokens_per_forward
    out["srt/draft_proposed"] = float(summary.draft_proposed)
    out["srt/draft_accepted"] = float(summary.draft_accepted)
    out["srt/accepted_per_draft"] = summary.acceptance
    out["srt/idle_slot_s_tool_waits"] = summary.idle_slot_s_during_tool_waits
    out["srt/prefill_computed"] = float(summary.prefill_computed)
    out["srt/prefill_reused"] = float(summary.prefill_reused)
    out["srt/prefill_hit_rate"] = summary.prefill_hit_rate
    return out


def sample_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Shaped rewards, advantages, returns and values of the samples that were trained on."""
    out: dict[str, float] = {}
    out.update(_stats("critic/rewards", [s.reward for s in samples]))
    for name in ("advantages", "returns", "values"):
        values = [v for s in samples if getattr(s, name) is not None for v in s.trained(getattr(s, name))]
        out.update(_stats(f"critic/{name}", values))
    return out


def identical_share(reference: Sequence[Trajectory], other: Sequence[Trajectory]) -> float:
    """Share of trajectories whose response tokens match the reference run's, pair by pair."""
    if len(reference) != len(other):
        return 0.0
    if not reference:
        return 1.0
    return sum(a.response_ids == b.response_ids for a, b in zip(reference, other)) / len(reference)
