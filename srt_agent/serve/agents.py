"""Rollouts from agents written against the `openai` client: ``async def agent(base_url, task) -> float``.

:func:`run_agents` starts the rollout server in-process on a free port (or uses one already running), gives
every rollout its own session (base URL ``{url}/sessions/{sid}/v1``), runs the agent functions concurrently
and collects, per session, the trajectory the server recorded (prompt ids, response ids, response mask,
log-probs) with the reward the agent returned, as :class:`~srt_agent.agent.trajectory.Trajectory` objects
and a :class:`~srt_agent.agent.rollout.RolloutSummary`, the shapes the trainer's rollouts have.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..agent.controller import ToolWaitStats, trajectory_seed
from ..agent.rollout import RolloutSummary, summarize
from ..agent.trajectory import Trajectory
from ..config import import_dotted
from ..config.tasks import Task
from .sampling import TurnLimits
from .server import RolloutServer

AgentFunction = Callable[[str, Task], Awaitable[float]]


@dataclass
class AgentRun:
    """What :func:`run_agents` collected: one trajectory per rollout (ordered by task, then sample: its
    session's last branch, with the agent's reward and the session's earlier branches in ``branches``) and
    the summary."""

    trajectories: list[Trajectory]
    summary: RolloutSummary


def load_agent(spec: str) -> AgentFunction:
    """The agent function named ``module:function`` (or ``module.function``); ValueError when it is not
    an ``async def``."""
    path = spec.replace(":", ".") if ":" in spec else spec
    agent = import_dotted(path)
    if not inspect.iscoroutinefunction(agent):
        raise ValueError(f"agent {spec!r} must be an `async def agent(base_url, task) -> float`")
    return agent


async def run_agents_async(
    server: RolloutServer,
    url: str,
    agent: AgentFunction,
    tasks: Sequence[Task],
    n_samples: int = 1,
    max_concurrent: int | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
    timeout_s: float | None = None,
    seed: int | None = None,
) -> AgentRun:
    """Run `agent` `n_samples` times per task against `server` (serving at `url`), all at once up to
    `max_concurrent`. An agent that raises (or runs past `timeout_s`), or one of whose requests failed in the
    backend (even if the agent went on), gets reward 0 and finish_reason "error" with the reason: its rollout
    is recorded but not trained on; the others run on.

    Each session's tree key is the key of its first prompt's tokens (``cache.keys``: GRPO siblings share
    their trees, as the controller's episodes do); with `seed`, requests that give no seed of their own sample with a seed derived from it
    and the (task, sample) indices, as the controller's episodes do."""
    start = time.perf_counter()
    limit = asyncio.Semaphore(max_concurrent or len(tasks) * n_samples or 1)

    async def one(task_index: int, sample_index: int) -> Trajectory:
        task = tasks[task_index]
        async with limit:
            began = time.perf_counter()
            sid = server.open_session(seed=trajectory_seed(seed, task_index, sample_index))
            reward, error = 0.0, None
            try:
                reward = float(await asyncio.wait_for(agent(f"{url}/sessions/{sid}/v1", task), timeout_s))
            except Exception as exc:  # noqa: BLE001 - isolation: one broken agent never stops the batch
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            recorded = server.end_session(sid)
        if not recorded:
            recorded = [Trajectory(request_id=sid, task_index=0, sample_index=0, prompt_ids=[], finish_reason="error")]
            error = error or "the agent made no request"
        failed = next((b for b in recorded if b.finish_reason == "error" and b.error), None)
        if error is None and failed is not None:
            reward, error = 0.0, f"a request of the rollout failed: {failed.error}"
        traj = recorded[-1]
        traj.branches = recorded[:-1]  # every branch is this rollout's: its task, sample and reward
        for branch in recorded:
            branch.task_index, branch.sample_index, branch.reward = task_index, sample_index, reward
            branch.ground_truth, branch.data_source = task.ground_truth, task.data_source
        if not traj.prompt:
            traj.prompt = [dict(m) for m in task.prompt]
        if error is not None:
            traj.finish_reason, traj.error = "error", error
        traj.wall_s = time.perf_counter() - began
        if on_done is not None:
            on_done(traj)
        return traj

    pairs = [(t, s) for t in range(len(tasks)) for s in range(n_samples)]
    trajectories = list(await asyncio.gather(*(one(t, s) for t, s in pairs)))
    summary = summarize(trajectories, ToolWaitStats(), time.perf_counter() - start)
    return AgentRun(trajectories, summary)


def run_agents(
    agent: AgentFunction | str,
    tasks: Sequence[Task],
    config=None,
    server: RolloutServer | None = None,
    n_samples: int | None = None,
    max_concurrent: int | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
    timeout_s: float | None = None,
    host: str = "127.0.0.1",
    seed: int | None = None,
) -> AgentRun:
    """Blocking: serve `server` (else one built from env config `config`, closed afterwards) on a free port
    and run `agent` (a function or ``module:function``) on every task `n_samples` times (default: the
    config's ``n_samples``, else 1); see :func:`run_agents_async`."""
    if isinstance(agent, str):
        agent = load_agent(agent)
    if server is None and config is None:
        raise ValueError("give an env config or a running RolloutServer")
    n_samples = n_samples or (config.n_samples if config is not None else 1)
    if max_concurrent is None and config is not None:
        max_concurrent = config.max_concurrent
    own = server is None
    server = server or RolloutServer.from_config(config)
    try:
        with server.running(host) as url:
            return asyncio.run(
                run_agents_async(server, url, agent, tasks, n_samples, max_concurrent, on_done, timeout_s, seed)
            )
    finally:
        if own:
            server.close()


def agent_rollouts(
    backend,
    loaded,
    config,
    agent: AgentFunction,
    tasks: Sequence[Task],
    n_samples: int,
    seed: int | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
) -> tuple[list[Trajectory], RolloutSummary]:
    """The trainer's rollouts of a source whose episodes are agents (``agent: module:function``, a verifiers
    environment: :mod:`srt_agent.sources`): `agent` runs against a server over `backend` (an already started
    backend, left open) with the config's turn and response limits, seeded by `seed` per (task, sample);
    returns what `run_rollouts` returns."""
    limits = TurnLimits.of(loaded, config.engine.max_context, config.max_tokens_per_turn, config.max_response_tokens)
    server = RolloutServer(backend, loaded.tokenizer, model_name=config.model, limits=limits)
    try:
        run = run_agents(
            agent,
            tasks,
            server=server,
            n_samples=n_samples,
            max_concurrent=config.max_concurrent,
            on_done=on_done,
            seed=seed,
        )
    finally:
        server.close()
    return run.trajectories, run.summary
