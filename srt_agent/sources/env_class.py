"""The ``Env`` class source (``env: package.module.Class``, the default ReTool env): the multi-turn
controller runs each episode of the class against the rollout backend, tool calls as forced tokens."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..agent.controller import MultiTurnController
from ..agent.rollout import RolloutSummary, run_rollouts
from ..agent.trajectory import Trajectory
from ..config.tasks import Task


def rollout(
    controller: MultiTurnController,
    loaded,
    tasks: Sequence[Task],
    n_samples: int,
    seed: int | None,
    on_done: Callable[[Trajectory], None] | None,
) -> tuple[list[Trajectory], RolloutSummary]:
    """`n_samples` episodes of every task with the controller's Env class (`loaded` runs in its backend)."""
    return run_rollouts(controller, tasks, n_samples, on_done, seed)
