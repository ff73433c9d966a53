"""A step's rollout figures under verl's metric names, and the side-by-side drafter comparison."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..agent.rollout import RolloutSummary, summarize
from ..agent.trajectory import Trajectory
from ..engine.tail import at_their_speed, tail_figures
from .batch import Sample
from .evaluate import bootstrap_statistic, tool_use_report
from .rollouts import RolloutRun


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
    out["env/tool_fault_trajectories"] = float(
        sum(t.finish_reason == "error" and any(c.fault for c in t.tool_calls) for t in trajectories)
    )
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
    out.update(token_metrics(trajectories))
    return out


def token_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Where a step's sampled tokens went: all of them (a server session's every branch included), those of
    failed rollouts (never trained), and the sessions that branched with their tokens outside the last
    branch (trained with their session's advantage). The trainer's ``perf/trained_tokens`` is the rest,
    less the groups dynamic sampling dropped."""
    branched = [t for t in trajectories if t.branches]
    return {
        "rollout/rollouts": float(len(trajectories)),
        "rollout/sampled_tokens": float(sum(t.model_tokens + _branch_tokens(t) for t in trajectories)),
        "rollout/error_tokens": float(
            sum(t.model_tokens + _branch_tokens(t) for t in trajectories if t.finish_reason == "error")
        ),
        "rollout/branched_sessions": float(len(branched)),
        "rollout/branches": float(sum(len(t.branches) for t in branched)),
        "rollout/branch_tokens": float(sum(_branch_tokens(t) for t in branched)),
    }


def _branch_tokens(traj: Trajectory) -> int:
    return sum(b.model_tokens for b in traj.branches)


def sample_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Shaped rewards, advantages, returns and values of the samples that were trained on."""
    out: dict[str, float] = {}
    out.update(_stats("critic/rewards", [s.reward for s in samples if s.lead]))  # once per rollout
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


@dataclass
class _NoWaits:
    waits: int = 0
    wait_s: float = 0.0
    idle_slot_s: float = 0.0


def merged_summary(runs: Sequence[RolloutRun]) -> RolloutSummary:
    """One rollout summary over several runs (a step's rollout rounds)."""
    trajectories = [t for run in runs for t in run.trajectories]
    merged = summarize(trajectories, _NoWaits(), sum(run.wall_s for run in runs))
    merged.tool_wait_s = sum(run.summary.tool_wait_s for run in runs)
    merged.idle_slot_s_during_tool_waits = sum(run.summary.idle_slot_s_during_tool_waits for run in runs)
    return merged


@dataclass(frozen=True)
class StepFigures:
    """A variant's rollouts of one step, all its runs together: generation time, generated tokens,
    verification steps, drafting, what run-ahead did (its figures summed; {} without run-ahead) and the
    share of trajectories identical to a reference's token for token (None without a reference)."""

    gen_s: float
    model_tokens: int
    forwards: int
    draft_proposed: int
    draft_accepted: int
    run_ahead: dict
    identical: float | None = None
    tail: dict = field(default_factory=dict)  # TailStats figures summed over the runs ({} if none counted)

    @property
    def tokens_per_forward(self) -> float:
        return self.model_tokens / self.forwards if self.forwards else 0.0

    @property
    def accepted_per_forward(self) -> float:
        return self.draft_accepted / self.forwards if self.forwards else 0.0

    @property
    def acceptance(self) -> float:
        return self.draft_accepted / self.draft_proposed if self.draft_proposed else 0.0

    @property
    def tok_s(self) -> float:
        return self.model_tokens / self.gen_s if self.gen_s > 0 else 0.0


def step_figures(runs: Sequence[RolloutRun], reference: Sequence[RolloutRun] | None = None) -> StepFigures:
    """The figures of a variant's runs of one step (see `StepFigures`), identity against `reference`'s."""
    trajectories = [t for run in runs for t in run.trajectories]
    identical = None
    if reference is not None:
        identical = identical_share([t for run in reference for t in run.trajectories], trajectories)
    return StepFigures(
        gen_s=sum(run.wall_s for run in runs),
        model_tokens=sum(t.model_tokens for t in trajectories),
        forwards=sum(t.forwards for t in trajectories),
        draft_proposed=sum(t.draft_proposed for t in trajectories),
        draft_accepted=sum(t.draft_accepted for t in trajectories),
        run_ahead=_summed([run.run_ahead for run in runs if run.run_ahead]),
        identical=identical,
        tail=_added([run.tail for run in runs if run.tail]),
    )


def _added(stats: Sequence[dict]) -> dict:
    """Dicts of numbers added key by key (nested dicts too; a key some lack counts as zero there); {} for none."""
    keys = dict.fromkeys(k for s in stats for k in s)
    return {
        k: _added([s[k] for s in stats if k in s])
        if any(isinstance(s.get(k), dict) for s in stats)
        else sum(s.get(k, 0) for s in stats)
        for k in keys
    }


def _summed(stats: Sequence[dict]) -> dict:
    """Run-ahead figures (`RunAheadStats.as_dict`) of several runs added up; {} for none."""
    if not stats:
        return {}
    out = _added([{k: v for k, v in s.items() if k != "tokens_by_bubble"} for s in stats])
    out["tokens_by_bubble"] = {b: sum(s["tokens_by_bubble"][b] for s in stats) for b in stats[0]["tokens_by_bubble"]}
    return out


RUN_AHEAD_KEYS = (
    "tokens",
    "rows",
    "real_rows",
    "sequences",
    "preempted",
    "added_s",
    "tokens_upcoming",
    "prefill_tokens",
    "copied_tokens",
)


def run_ahead_metrics(runs: Sequence[RolloutRun], gen_s: float) -> dict[str, float]:
    """What run-ahead did during these rollout runs: tokens put into the trees (per bubble), the
    share of the forward passes' rows it fed, and its predicted share of the generation time."""
    return _run_ahead_metrics(step_figures(runs).run_ahead, gen_s)


def _run_ahead_metrics(total: dict, gen_s: float) -> dict[str, float]:
    if not total:
        return {}
    out = {f"run_ahead/{k}": float(total[k]) for k in RUN_AHEAD_KEYS}
    for bubble, tokens in total["tokens_by_bubble"].items():
        out[f"run_ahead/tokens_{bubble}"] = float(tokens)
    out["run_ahead/row_share"] = total["rows"] / max(total["rows"] + total["real_rows"], 1)
    out["run_ahead/time_share"] = total["added_s"] / gen_s if gen_s > 0 else 0.0
    return out


def tail_metrics(runs: Sequence[RolloutRun], prefix: str = "srt") -> dict[str, float]:
    """``<prefix>/tail_share`` and ``<prefix>/tail_tok_s``: the share of the runs' engine step time with at
    most `TAIL_SEQUENCES` sequences running, and the generated tokens per second there (engine/tail.py)."""
    return _tail_metrics(step_figures(runs).tail, prefix)


def _tail_metrics(tail: dict, prefix: str) -> dict[str, float]:
    if not tail:
        return {}
    return {f"{prefix}/{k}": v for k, v in tail_figures(tail).items() if v is not None}


def speculation_metrics(runs: Sequence[RolloutRun], prefix: str = "srt") -> dict[str, float]:
    """What drafting cost the runs beyond plain decoding: ``<prefix>/draft_host_s`` (host time drafting),
    ``<prefix>/rejected_tokens`` (drafted, verified, not accepted) and ``<prefix>/rejected_s`` (the cost
    model's seconds for verifying them); {} where the backend reports none."""
    total = _added([run.speculation for run in runs if run.speculation])
    if not total:
        return {}
    rejected = max(total["drafted"] - total["accepted"], 0)
    share = rejected / total["drafted"] if total["drafted"] else 0.0
    return {
        f"{prefix}/draft_host_s": float(total["host_s"]),
        f"{prefix}/rejected_tokens": float(rejected),
        f"{prefix}/rejected_s": float(total["verify_s"] * share),
    }


def compare_metrics(name: str, main: Sequence[RolloutRun], runs: Sequence[RolloutRun]) -> dict[str, float]:
    """``compare/<name>/…``: a compared drafter's regeneration of the step (`runs`) against the training
    drafter's (`main`): its time, the speedup (its time / ours), time per generated token, drafting figures
    and the share of trajectories identical to ours."""
    theirs, ours = step_figures(runs, main), step_figures(main)
    wall, main_wall, main_tokens = theirs.gen_s, ours.gen_s, ours.model_tokens
    out = {
        f"compare/{name}/gen_s": wall,
        f"compare/{name}/speedup": wall / main_wall if main_wall > 0 else 0.0,
        # time per generated token, theirs over ours: what compares speed when the trajectories differ
        f"compare/{name}/token_speedup": (wall / max(theirs.model_tokens, 1)) / (main_wall / main_tokens)
        if main_wall > 0 and main_tokens
        else 0.0,
        f"compare/{name}/tokens_per_forward": theirs.tokens_per_forward,
        f"compare/{name}/accepted_per_forward": theirs.accepted_per_forward,
        f"compare/{name}/identical": theirs.identical,
    }
    out.update({f"compare/{name}/{k}": v for k, v in _run_ahead_metrics(theirs.run_ahead, wall).items()})
    out.update(_tail_metrics(theirs.tail, f"compare/{name}"))
    out.update(_load_metrics(ours.tail, theirs.tail, f"compare/{name}"))
    return out


def _load_metrics(ours: dict, theirs: dict, prefix: str) -> dict[str, float]:
    """Both variants' engine step seconds, and ours at their speed with as many sequences running
    (`at_their_speed`): what splits a slower step into speed and work."""
    at = at_their_speed(ours, theirs) if ours and theirs else None
    if at is None:
        return {}
    return {
        f"{prefix}/step_s": theirs["step_s"],
        f"{prefix}/ours_step_s": ours["step_s"],
        f"{prefix}/ours_at_their_speed_s": at,
    }


def speed_totals(history: Sequence[dict[str, float]], compared: Sequence[str]) -> dict:
    """Over a run's steps, per compared drafter: its generation time over ours (all steps, first visits,
    revisits), each with its 95% paired bootstrap interval over the steps (``…_interval``), and the mean
    identical share; our total generation and update time."""
    totals: dict = {}
    gen = sum(m.get("timing_s/gen", 0.0) for m in history)
    for name in compared:
        for key, chosen in (
            (f"speedup_vs_{name}", list(history)),
            (f"speedup_vs_{name}_first", [m for m in history if m.get("training/revisit") == 0.0]),
            (f"speedup_vs_{name}_revisit", [m for m in history if m.get("training/revisit") == 1.0]),
        ):
            theirs = [m.get(f"compare/{name}/gen_s", 0.0) for m in chosen]
            mine = [m.get("timing_s/gen", 0.0) for m in chosen]

            def ratio(rows: Sequence[int], theirs=theirs, mine=mine) -> float:
                ours = sum(mine[i] for i in rows)
                return sum(theirs[i] for i in rows) / ours if ours > 0 else 0.0

            if sum(mine) > 0:
                totals[key] = ratio(range(len(chosen)))
                totals[f"{key}_interval"] = bootstrap_statistic(len(chosen), ratio)
        shares = [m.get(f"compare/{name}/identical", 0.0) for m in history]
        totals[f"identical_vs_{name}"] = sum(shares) / len(shares) if shares else None
    totals["gen_s"] = gen
    totals["update_s"] = sum(m.get("timing_s/update_actor", 0.0) for m in history)
    return totals
