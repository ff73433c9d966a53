"""Environment sources: where tasks come from and how episodes run, one module per source: an ``Env``
class (:mod:`.env_class`), an ``agent:`` function (:mod:`.agent_function`), a verifiers environment
(:mod:`.verifiers`), arithmetic (:mod:`.arithmetic`), reasoning-gym (:mod:`.reasoning_gym`) and verl files
(:mod:`.verl_files`).

Their one registry, and the ``Task`` they all hand over, live in the config
(:mod:`srt_agent.config.source_registry`, :mod:`srt_agent.config.tasks`), which checks a config's sources
without importing them. Each built-in registers itself here, by ``"module:function"``: a source's module
loads on first use, so registering costs nothing (``import srt_agent`` does it). A new source is
``from srt_agent.sources import EnvSource, register``.
"""

from collections.abc import Callable

from ..config.source_registry import SOURCES, EnvSource, episode_source, register, task_source

__all__ = ["SOURCES", "EnvSource", "episode_source", "register", "task_source"]


def _prefix(prefix: str) -> Callable[[str], bool]:
    return lambda value: value.startswith(prefix)


register(EnvSource("env_class", rollout=f"{__name__}.env_class:rollout"))
register(
    EnvSource(
        "agent_function",
        episodes=lambda env, agent: agent is not None,
        rollout=f"{__name__}.agent_function:rollout",
        run_ahead=False,
    )
)
register(
    EnvSource(
        "verifiers",
        dataset=_prefix("verifiers:"),
        episodes=lambda env, agent: env.startswith("verifiers:"),
        tasks=f"{__name__}.verifiers:dataset_tasks",
        held_out=f"{__name__}.verifiers:held_out",
        rollout=f"{__name__}.verifiers:rollout",
        check_config=f"{__name__}.verifiers:check",
        run_ahead=False,
    )
)
register(
    EnvSource(
        "arithmetic",
        dataset=lambda source: source == "arithmetic",
        tasks=f"{__name__}.arithmetic:dataset_tasks",
        held_out=f"{__name__}.arithmetic:held_out",
    )
)
register(
    EnvSource(
        "reasoning_gym",
        dataset=lambda source: source == "reasoning_gym",
        tasks=f"{__name__}.reasoning_gym:dataset_tasks",
        held_out=f"{__name__}.reasoning_gym:held_out",
        score=f"{__name__}.reasoning_gym:reasoning_gym_score",
        check_dataset=f"{__name__}.reasoning_gym:check",
    )
)
register(
    EnvSource(
        "verl_files",
        tasks=f"{__name__}.verl_files:dataset_tasks",
        held_out=f"{__name__}.verl_files:held_out",
        path=True,
    )
)
