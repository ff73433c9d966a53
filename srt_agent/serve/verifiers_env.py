"""verifiers (>= 0.4, ``verifiers.v1``) environments as rollout agents: ``env: verifiers:<taskset id>``.

A verifiers environment is a taskset package (``load()`` yields its tasks, each with ``@vf.reward``
methods and optional ``vf.Toolset`` MCP tool servers), run by an ``Env`` (``SingleAgentEnv`` for a plain
taskset) whose harness program talks to the model through verifiers' interception server, which relays
each request to an OpenAI-compatible endpoint. Here that endpoint is an srt-agent server session, so
every rollout is one session (exact token ids, inserted tool/user tokens masked, log-probs) and its reward
is the episode's rubric sum (``Trace.reward`` over the task's ``@vf.reward`` functions).

- :func:`verifiers_tasks` maps the taskset's tasks to :class:`~srt_agent.datasets.Task` (the prompt
  messages, the task's index and key in ``extra_info``);
- :func:`verifiers_agent` is an ``async def agent(base_url, task) -> float`` (what ``run_agents`` and the
  trainer's agent path run): it rebuilds the verifiers task from its index and runs
  ``Env.run_episode`` with the model client pointed at ``base_url``.

The harness is :mod:`srt_agent.serve.verifiers_harness` (verifiers' ``null`` chat loop under this Python,
no ``uv``) unless ``env_options`` pins another (``agent: {harness: {id: ...}}``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

from ..datasets import Task

PREFIX = "verifiers:"
DATA_SOURCE = "verifiers"


def verifiers_id(env: str) -> str | None:
    """The taskset id of an ``env: verifiers:<id>`` value, else None."""
    return env[len(PREFIX) :] if env.startswith(PREFIX) else None


def _import_verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as exc:  # pragma: no cover - depends on the venv
        raise ImportError(
            "env: verifiers:... needs verifiers>=0.4 (pip install 'srt-agent[verifiers]'): " + str(exc)
        ) from exc
    return vf


def _config_data(taskset_id: str, options: dict[str, Any]) -> dict:
    """verifiers' EnvConfig data: ``env_options`` (its own keys: ``taskset``, ``agent``, ``timeout``, ...;
    any other key is a taskset config field), the taskset id, and, unless pinned, our harness on the local
    subprocess runtime."""
    from .verifiers_harness import HARNESS_ID

    env_keys = {"id", "taskset", "agent", "timeout", "retries", "max_concurrent_agents", "interception"}
    data = {k: v for k, v in options.items() if k in env_keys}
    taskset = {**{k: v for k, v in options.items() if k not in env_keys}, **dict(data.get("taskset") or {})}
    data["taskset"] = {**taskset, "id": taskset_id}
    agent = dict(data.get("agent") or {})
    agent.setdefault("harness", {"id": HARNESS_ID})
    agent.setdefault("runtime", {"type": "subprocess"})  # verifiers' default is Prime's hosted sandboxes
    data["agent"] = agent
    return data


@functools.cache
def _load(taskset_id: str, options_json: str):
    vf = _import_verifiers()
    config = vf.resolve_env_config(_config_data(taskset_id, json.loads(options_json)))
    env = vf.load_environment(config)
    return env, list(env.taskset)


def load_verifiers_env(taskset_id: str, options: dict[str, Any] | None = None):
    """The verifiers ``Env`` for `taskset_id` (a module or installed environment id) with ``env_options``,
    and its tasks (loaded once per process)."""
    _export_path()
    return _load(taskset_id, json.dumps(options or {}, sort_keys=True))


def _export_path() -> None:
    """Tool servers and the chat program run as ``sys.executable`` subprocesses: give them our sys.path, so a
    taskset imported from a local folder (examples/) is importable there too."""
    paths = [p for p in sys.path if p]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(current + paths))


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def task_messages(data) -> list[dict]:
    """A verifiers task's opening messages (its system prompt, then its prompt) as chat messages."""
    messages: list[dict] = []
    if data.system_prompt:
        messages.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        for m in data.prompt or []:
            wire = m.model_dump(mode="json", exclude_none=True) if hasattr(m, "model_dump") else dict(m)
            messages.append({"role": str(wire.get("role")), "content": _text(wire.get("content"))})
    return messages


def verifiers_tasks(taskset_id: str, options: dict[str, Any] | None = None, limit: int | None = None) -> list[Task]:
    """The environment's tasks as :class:`Task`: its prompt messages, ``ground_truth`` from the task data's
    ``answer`` field where it has one, ``data_source`` ``verifiers/<id>``, and ``extra_info`` holding
    ``vf_idx`` (its position in the taskset, how the agent finds it again) and ``vf_key``."""
    _, tasks = load_verifiers_env(taskset_id, options)
    out = []
    for vt in tasks[:limit] if limit is not None else tasks:
        data = vt.data
        answer = getattr(data, "answer", None)
        out.append(
            Task(
                prompt=task_messages(data),
                ground_truth="" if answer is None else str(answer),
                data_source=f"{DATA_SOURCE}/{taskset_id}",
                extra_info={"vf_idx": data.idx, "vf_key": vt.key},
            )
        )
    return out


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
    vf = _import_verifiers()
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
