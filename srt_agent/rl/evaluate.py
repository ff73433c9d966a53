"""How a policy uses the interpreter: tool-call rate, clean-run rate, accuracy and mean reward over
trajectories, each with a 95% interval (Wilson for shares, bootstrap for the mean reward) so that a
change between two evaluations can be told from noise.

:func:`evaluate_policy` is the one held-out evaluation: the trainer's "before RL" / "after RL" reports and
``srt-agent eval`` both run it.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..agent.parsing import CODE_TOOL_NAME
from ..agent.rewards import score_response
from ..agent.trajectory import Trajectory
from ..config import EnvConfig, RewardConfig
from ..config.tasks import Task
from ..console import Phase, no_bar

if TYPE_CHECKING:
    from .rollouts import PolicyRollouts, RolloutRun

#: the figures a held-out evaluation reports (``val/<name>`` in the trackers)
HELD_OUT_FIGURES = ("accuracy", "tool_call_rate", "code_ok_rate", "mean_reward")


@dataclass
class ToolUseReport:
    """Shares of trajectories that call the code tool, whose code all ran cleanly, that answered right."""

    trajectories: int
    tool_call_rate: float
    code_ok_rate: float
    accuracy: float
    mean_tool_calls: float
    mean_response_tokens: float
    mean_reward: float = 0.0
    intervals: dict[str, list[float]] = field(default_factory=dict)  # 95% interval per figure

    def __post_init__(self) -> None:
        if not self.intervals and self.trajectories:  # a report saved before intervals existed
            self.intervals = {
                k: wilson_interval(round(getattr(self, k) * self.trajectories), self.trajectories)
                for k in ("tool_call_rate", "code_ok_rate", "accuracy")
            }

    def as_dict(self) -> dict:
        return asdict(self)

    def interval(self, name: str) -> str:
        return interval_text(name, getattr(self, name), self.intervals.get(name))


def interval_text(name: str, value: float, bounds: Sequence[float] | None) -> str:
    """A figure and its interval as text, e.g. ``42% [19%, 68%]`` (a share) or ``+0.25 [-0.10, +0.60]``."""
    fmt = "{:+.2f}" if name == "mean_reward" else "{:.0%}"
    return fmt.format(value) + (f" [{fmt.format(bounds[0])}, {fmt.format(bounds[1])}]" if bounds else "")


def ratio_text(value: float | None, bounds: Sequence[float] | None = None) -> str:
    """A ratio and its interval as text, e.g. ``1.05x [0.98, 1.12]`` (``–`` without a value)."""
    if value is None:
        return "–"
    return f"{value:.2f}x" + (f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "")


def wilson_interval(successes: int, n: int, z: float = 1.96) -> list[float]:
    """The Wilson score interval of a binomial share (95% for z = 1.96); [0, 1] when n is 0."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    # exact ends for a share of 0 or 1 (rounding leaves 0.9999999999999999, which excludes the share itself)
    return [0.0 if successes == 0 else low, 1.0 if successes == n else high]


def bootstrap_interval(values: Sequence[float], draws: int = 2000, level: float = 0.95, seed: int = 0) -> list[float]:
    """A percentile bootstrap interval of the mean of `values` (seeded: the same values give the same interval)."""
    if not values:
        return [0.0, 0.0]
    return bootstrap_statistic(len(values), lambda rows: sum(values[i] for i in rows) / len(rows), draws, level, seed)


def bootstrap_statistic(
    n: int, statistic: Callable[[list[int]], float], draws: int = 2000, level: float = 0.95, seed: int = 0
) -> list[float]:
    """A percentile bootstrap interval of `statistic` over `n` paired units: each draw resamples the unit
    indices with replacement and hands them to `statistic` (so figures of one unit stay together: a paired
    bootstrap). Seeded: the same units give the same interval; [0, 0] when n is 0."""
    if n == 0:
        return [0.0, 0.0]
    rng = random.Random(seed)
    values = sorted(statistic([rng.randrange(n) for _ in range(n)]) for _ in range(draws))
    tail = (1 - level) / 2
    return [values[int(tail * (draws - 1))], values[int((1 - tail) * (draws - 1))]]


def _assistant_text(traj: Trajectory) -> str:
    return "".join(m.get("content", "") for m in traj.messages[len(traj.prompt) :] if m.get("role") == "assistant")


def is_correct(traj: Trajectory) -> bool:
    """The env's verdict on the final answer when it gave one (``Env.correct``: reasoning-gym's scorer for its
    tasks), else whether the last ``\\boxed{}`` equals the ground truth (no shaping, no penalties)."""
    if traj.correct is not None:
        return traj.correct
    return score_response(_assistant_text(traj), traj.ground_truth, 0, RewardConfig()) == RewardConfig().correct


def tool_use_report(trajectories: Sequence[Trajectory]) -> ToolUseReport:
    """The report over `trajectories` (a call counts when the code tool actually ran)."""
    n = len(trajectories)
    if n == 0:
        return ToolUseReport(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    ran = [[c for c in t.tool_calls if c.name == CODE_TOOL_NAME and c.status != "parse_error"] for t in trajectories]
    counts = {
        "tool_call_rate": sum(1 for calls in ran if calls),
        "code_ok_rate": sum(1 for calls in ran if calls and all(c.status == "ok" for c in calls)),
        "accuracy": sum(1 for t in trajectories if is_correct(t)),
    }
    rewards = [t.reward for t in trajectories]
    intervals = {name: wilson_interval(k, n) for name, k in counts.items()}
    intervals["mean_reward"] = bootstrap_interval(rewards)
    return ToolUseReport(
        trajectories=n,
        **{name: k / n for name, k in counts.items()},
        mean_tool_calls=sum(len(calls) for calls in ran) / n,
        mean_response_tokens=sum(len(t.response_ids) for t in trajectories) / n,
        mean_reward=sum(rewards) / n,
        intervals=intervals,
    )


def held_out_tasks(config: EnvConfig, n: int | None = None) -> list[Task]:
    """`n` (default ``cold_start.eval_tasks``) held-out tasks from the dataset's source: where it draws tasks
    (arithmetic, a reasoning-gym mix), fresh ones under ``cold_start.eval_seed`` that neither the RL dataset nor
    the cold start asks; a verl file, unseen arithmetic ones; a verifiers taskset, its own first `n`."""
    n = config.cold_start.eval_tasks if n is None else n
    return config.dataset.task_source().held_out_tasks(config, n)


def evaluate_policy(
    rollouts: PolicyRollouts,
    tasks: Sequence[Task],
    seed: int,
    *,
    n_samples: int = 1,
    drafter: str | None = None,
    phase: Phase = no_bar,
    label: str = "held-out tasks",
) -> tuple[ToolUseReport, RolloutRun]:
    """Roll out `tasks` (`n_samples` each, sampling seeded by `seed`) with the rollouts' current weights and
    report tool use, accuracy and reward with 95% intervals; `phase` shows the progress (a bar per run)."""
    drafter = drafter or rollouts.main
    with phase(f"{label} ({drafter})", len(tasks) * n_samples) as update:
        run = rollouts.run(drafter, tasks, n_samples, seed, on_done=lambda _: update(advance=1))
    return tool_use_report(run.trajectories), run


def reports_by_source(run: RolloutRun) -> dict[str, ToolUseReport]:
    """The run's report per task source (``data_source``: a reasoning-gym mix gives one per family)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in run.trajectories:
        groups[traj.data_source or "(none)"].append(traj)
    return {source: tool_use_report(trajs) for source, trajs in sorted(groups.items())}
