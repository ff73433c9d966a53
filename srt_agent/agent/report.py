"""Rollouts on the terminal: a rich progress bar while trajectories finish, a summary table at the end."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..config import ConfigError, EngineConfig, load_env_config, validate_config
from ..config.tasks import Task
from ..console import progress
from .controller import MultiTurnController
from .rollout import RolloutSummary, build_controller, run_rollouts, write_jsonl
from .trajectory import Trajectory


def run_with_progress(
    controller: MultiTurnController, tasks: Sequence[Task], n_samples: int, console: Console
) -> tuple[list[Trajectory], RolloutSummary]:
    """Run the rollouts with progress (a bar on a terminal, a line per trajectory in a log) showing finished
    trajectories and the running mean reward."""
    rewards: list[float] = []
    with progress(console, "rollout", len(tasks) * n_samples, lines=None) as work:

        def done(traj: Trajectory) -> None:
            rewards.append(traj.reward)
            work.done(f"reward {traj.reward:.2f}, mean reward {sum(rewards) / len(rewards):.3f}")

        return run_rollouts(controller, tasks, n_samples, done)


def summary_table(summary: RolloutSummary, title: str = "rollout summary") -> Table:
    """The end-of-run figures: reward, turns, tokens per forward, speculation, tools."""
    table = Table("metric", "value", title=title)
    rows = [
        ("trajectories", f"{summary.trajectories}"),
        ("mean reward", f"{summary.mean_reward:.3f}"),
        ("mean turns", f"{summary.mean_turns:.2f}"),
        ("model tokens", f"{summary.model_tokens}"),
        ("forced (tool) tokens", f"{summary.forced_tokens}"),
        ("forward passes", f"{summary.forwards}"),
        ("tokens per forward", f"{summary.tokens_per_forward:.2f}"),
        (
            "draft accepted / proposed",
            f"{summary.draft_accepted} / {summary.draft_proposed} ({summary.acceptance:.1%})",
        ),
        (
            "prefill computed / reused",
            f"{summary.prefill_computed} / {summary.prefill_reused} (hit rate {summary.prefill_hit_rate:.1%})",
        ),
        ("prefix cache blocks in use", f"{summary.prefix_blocks_in_use}"),
        ("tool calls", f"{summary.tool_calls} {summary.tool_statuses}"),
        ("tool time (s, summed)", f"{summary.tool_time_s:.2f}"),
        ("idle slot-seconds during tool waits", f"{summary.idle_slot_s_during_tool_waits:.2f}"),
        ("finish reasons", f"{summary.finish_reasons}"),
        ("wall time (s)", f"{summary.wall_s:.2f}"),
        ("tokens per second", f"{summary.model_tokens / summary.wall_s if summary.wall_s else 0.0:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def rollout_env_file(
    env_file: Path,
    console: Console,
    model: str | None = None,
    n_samples: int | None = None,
    limit: int | None = None,
    drafter: str | None = None,
    out: Path | None = None,
    backend: str | None = None,
) -> RolloutSummary:
    """Load an env config, run its rollouts with a progress bar, write JSONL to `out`, print the summary."""
    config = load_env_config(env_file)
    if drafter is not None:
        config.engine = validate_config(EngineConfig, {**config.engine.model_dump(), "drafter": drafter}, "--drafter")
    if backend is not None:
        config.engine = validate_config(EngineConfig, {**config.engine.model_dump(), "backend": backend}, "--backend")
    tasks = config.dataset.tasks(limit)
    if not tasks:
        raise ConfigError(f"{env_file}: dataset: no tasks")
    n_samples = n_samples or config.n_samples
    controller = build_controller(
        config, model=model, log=lambda line: console.print(f"[dim]{line}[/dim]", highlight=False)
    )
    try:
        trajectories, summary = run_with_progress(controller, tasks, n_samples, console)
    finally:
        controller.engine.close()
    if out is not None:
        write_jsonl(trajectories, out)
        console.print(f"[green]wrote {len(trajectories)} trajectories to {out}[/green]")
    console.print(summary_table(summary, f"{config.name}: {len(tasks)} tasks x {n_samples} samples"))
    return summary
