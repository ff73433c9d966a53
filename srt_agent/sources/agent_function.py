"""The ``agent:`` source: an ``async def agent(base_url, task) -> float`` written against the ``openai``
client (``agent: package.module:function``); each rollout is one session of srt-agent's OpenAI-compatible
server over the run's backend, so its tokens, masks and log-probs are the server's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..agent.controller import MultiTurnController
from ..agent.rollout import RolloutSummary
from ..agent.trajectory import Trajectory
from ..config.tasks import Task
from ..serve.agents import agent_rollouts, load_agent


def rollout(
    controller: MultiTurnController,
    loaded,
    tasks: Sequence[Task],
    n_samples: int,
    seed: int | None,
    on_done: Callable[[Trajectory], None] | None,
) -> tuple[list[Trajectory], RolloutSummary]:
    """`n_samples` runs of the config's agent function per task against a server over the controller's
    backend."""
    agent = load_agent(controller.config.agent)
    return agent_rollouts(controller.engine, loaded, controller.config, agent, tasks, n_samples, seed, on_done)
