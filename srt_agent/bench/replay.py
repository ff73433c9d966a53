"""`srt-agent bench replay`: a recorded run's rollouts replayed (``srt_agent.rl.replay``, without the model) once per
combination of draft budgets, tree limits and run-ahead settings."""

from __future__ import annotations

from dataclasses import replace

from ..console import Progress
from ..engine.options import RunAheadOptions
from ..rl.replay import ReplayOptions, replay
from ..rl.rollout_trace import RolloutTrace


def replay_sweep(
    trace: RolloutTrace, pool: RolloutTrace | None = None, work: Progress | None = None, **values: list
) -> dict:
    """Replay `trace` once per combination of the given option values (empty lists keep the trace's
    setting): drafter, max_draft_tokens, max_depth, max_bytes, and with run-ahead content (the trace's
    own or `pool`'s) slack and tokens_per_sequence. `work` hears of each replay as it ends."""
    import itertools
    import time

    names = [k for k, v in values.items() if v]
    combos = list(itertools.product(*(values[k] for k in names))) if names else [()]
    work = work or Progress.unseen()
    work.update(total=len(combos))
    rows = []
    for combo in combos:
        setting = dict(zip(names, combo))
        ahead = {k: setting.pop(k) for k in ("slack", "tokens_per_sequence") if k in setting}
        options = ReplayOptions(**setting)
        if ahead:
            recorded = trace.run_ahead or (pool.run_ahead if pool is not None else None) or {}
            options.run_ahead = replace(RunAheadOptions(**recorded), **ahead)
        start = time.perf_counter()
        steps = replay(trace, options, pool)
        forwards = sum(s.forwards for s in steps)
        rows.append(
            dict(
                setting={**setting, **ahead},
                accepted_per_forward=sum(s.accepted for s in steps) / forwards if forwards else 0.0,
                simulated_s=sum(s.simulated_s for s in steps),
                run_ahead_tokens=sum(s.run_ahead_tokens for s in steps),
                steps=[
                    dict(
                        step=s.step,
                        accepted_per_forward=s.accepted_per_forward,
                        measured=s.recorded_accepted_per_forward,
                    )
                    for s in steps
                ],
                wall_s=time.perf_counter() - start,
            )
        )
        work.done(
            f"{rows[-1]['setting'] or 'as recorded'}: {rows[-1]['accepted_per_forward']:.2f} accepted per forward"
        )
    forwards = sum(t.forwards for s in trace.steps for t in s.trajectories)
    measured = sum(t.draft_accepted for s in trace.steps for t in s.trajectories) / forwards if forwards else 0.0
    return {"trace": trace.variant, "measured_accepted_per_forward": measured, "rows": rows}


def sweep_table(result: dict):
    """The sweep as a rich table."""
    from rich.table import Table

    table = Table(
        "setting",
        "accepted / step",
        "simulated s",
        "run-ahead tokens",
        "replay s",
        title=f"{result['trace']}: measured {result['measured_accepted_per_forward']:.3f} accepted tokens per step",
    )
    for row in result["rows"]:
        setting = ", ".join(f"{k}={v}" for k, v in row["setting"].items()) or "as recorded"
        table.add_row(
            setting,
            f"{row['accepted_per_forward']:.3f}",
            f"{row['simulated_s']:.1f}",
            str(row["run_ahead_tokens"]),
            f"{row['wall_s']:.2f}",
        )
    return table
