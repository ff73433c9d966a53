"""verifiers (>= 0.4, ``verifiers.v1``) tasksets as srt-agent tasks: ``env: verifiers:<taskset id>``.

:func:`load_verifiers_env` loads the environment (with srt-agent's harness, :mod:`srt_agent.sources.verifiers.harness`,
on the local subprocess runtime unless ``env_options`` pins another); :func:`verifiers_tasks` maps its tasks to
:class:`~srt_agent.config.tasks.Task` (the prompt messages, the task's index and key in ``extra_info``). The
episodes themselves run as agents against the rollout server: :mod:`srt_agent.sources.verifiers.episodes`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

from ...config.tasks import Task

PREFIX = "verifiers:"
DATA_SOURCE = "verifiers"


def verifiers_id(env: str) -> str | None:
    """The taskset id of an ``env: verifiers:<id>`` value, else None."""
    return env[len(PREFIX) :] if env.startswith(PREFIX) else None


def import_verifiers():
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
    from .harness import HARNESS_ID

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
    vf = import_verifiers()
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
