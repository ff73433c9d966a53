"""verifiers (>= 0.4, ``verifiers.v1``) environments as rollout agents: ``env: verifiers:<taskset id>``.

A verifiers environment is a taskset package (``load()`` yields its tasks, each with ``@vf.reward``
methods and optional ``vf.Toolset`` MCP tool servers), run by an ``Env`` (``SingleAgentEnv`` for a plain
taskset) whose harness program talks to the model through verifiers' interception server, which relays
each request to an OpenAI-compatible endpoint. Here that endpoint is an srt-agent server session, so
every rollout is one session (exact token ids, inserted tool/user tokens masked, log-probs) and its reward
is the episode's rubric sum (``Trace.reward`` over the task's ``@vf.reward`` functions).

- :func:`srt_agent.sources.verifiers.tasksets.verifiers_tasks` maps the taskset's tasks to
  :class:`~srt_agent.config.tasks.Task` (the prompt messages, the task's index and key in ``extra_info``);
- :func:`verifiers_agent` is an ``async def agent(base_url, task) -> float`` (what ``run_agents`` and the
  trainer's agent path run): it rebuilds the verifiers task from its index and runs
  ``Env.run_episode`` with the model client pointed at ``base_url``.

The harness is :mod:`srt_agent.sources.verifiers.harness` (verifiers' ``null`` chat loop under this Python,
no ``uv``) unless ``env_options`` pins another (``agent: {harness: {id: ...}}``).
"""

from __future__ import annotations

from typing import Any

from ...config.tasks import Task
from .tasksets import import_verifiers, load_verifiers_env, verifiers_id


def verifiers_agent(
    taskset_id: str,
    options: dict[str, Any] | None = None,
    *,
    model: str,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_tokens: int | None = None,
):
    """An ``async def agent(base_url, task) -> float`` that runs the verifiers environment's episode for
    `task` (one of :func:`verifiers_tasks`) against `base_url` and returns its reward. A failed episode
    raises (``run_agents`` records it as an error trajectory with reward 0)."""
    vf = import_verifiers()
    from verifiers.v1.configs.client import EvalClientConfig

    env, tasks = load_verifiers_env(taskset_id, options)
    knobs = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
    if top_k:
        knobs["top_k"] = top_k
    sampling = vf.Sampling(**{k: v for k, v in knobs.items() if v is not None})

    async def agent(base_url: str, task: Task) -> float:
        vt = tasks[int(task.extra_info["vf_idx"])]
        client = EvalClientConfig(base_url=base_url, api_key_var="SRT_AGENT_VERIFIERS_API_KEY")
        ctx = vf.ModelContext(model=model, client=client, sampling=sampling)
        try:
            async with env.serving():
                episode = await env.run_episode(vt, ctx)
        except SystemExit as exc:  # verifiers exits where a hosted service (Prime) is not logged in
            raise RuntimeError(f"verifiers exited: {exc}") from None
        if not episode.ok:
            errors = [e.message for e in episode.errors]
            errors += [t.last_error.message for t in episode.traces if t.last_error is not None]
            raise RuntimeError(f"verifiers episode failed: {'; '.join(errors) or 'not ok'}")
        return float(sum(t.reward for t in episode.traces))

    return agent


def config_agent(config):
    """The agent of env config `config` with ``env: verifiers:<id>``, sampled as the config says."""
    s = config.sampling
    return verifiers_agent(
        verifiers_id(config.env),
        config.env_options,
        model=config.model,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_tokens=config.max_tokens_per_turn,
    )
