"""The verifiers source: ``env: verifiers:<taskset id>`` (verifiers >= 0.4, ``pip install
'srt-agent[verifiers]'``). The taskset's tasks are the dataset (:mod:`.tasksets`), its episodes run as
agents against srt-agent's server, one session each (:mod:`.episodes`), under verifiers' chat loop run
with this Python (:mod:`.harness`). A taskset has no held-out split: evaluation uses its own tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...config.tasks import Task
from .tasksets import verifiers_id, verifiers_tasks

if TYPE_CHECKING:
    from ...agent.controller import MultiTurnController
    from ...agent.rollout import RolloutSummary
    from ...agent.trajectory import Trajectory
    from ...config import DatasetConfig, EnvConfig


def check(config: EnvConfig) -> None:
    """ValueError when ``env:`` names no taskset."""
    if not (verifiers_id(config.env) or "").strip():
        raise ValueError("expected verifiers:<taskset id>, e.g. verifiers:vf_calculator")


def dataset_tasks(dataset: DatasetConfig, limit: int | None) -> list[Task]:
    """The taskset's tasks (the first `limit`), built with the config's ``env_options``."""
    return verifiers_tasks(verifiers_id(dataset.source), dataset.source_options, limit)


def held_out(config: EnvConfig, n: int) -> list[Task]:
    """The taskset's own first `n` tasks, as listed."""
    return config.dataset.tasks(limit=n)


def rollout(
    controller: MultiTurnController,
    loaded,
    tasks: Sequence[Task],
    n_samples: int,
    seed: int | None,
    on_done: Callable[[Trajectory], None] | None,
) -> tuple[list[Trajectory], RolloutSummary]:
    """`n_samples` episodes per task, each run by verifiers against a server session over the controller's
    backend and sampled as the config says."""
    from ...serve.agents import agent_rollouts
    from .episodes import config_agent

    agent = config_agent(controller.config)
    return agent_rollouts(controller.engine, loaded, controller.config, agent, tasks, n_samples, seed, on_done)
