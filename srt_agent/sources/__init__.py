"""Environment sources: where tasks come from and how episodes run, one module per source: an ``Env``
class (:mod:`.env_class`), an ``agent:`` function (:mod:`.agent_function`), a verifiers environment
(:mod:`.verifiers`), arithmetic (:mod:`.arithmetic`), reasoning-gym (:mod:`.reasoning_gym`) and verl files
(:mod:`.verl_files`).

Their one registry, and the ``Task`` they all hand over, live in the config
(:mod:`srt_agent.config.source_registry`, :mod:`srt_agent.config.tasks`), which checks a config's sources
without importing them; this package hands the registry's names on, so that a new source is
``from srt_agent.sources import EnvSource, register``. A source's module loads on first use.
"""

from ..config.source_registry import SOURCES, EnvSource, episode_source, register, task_source

__all__ = ["SOURCES", "EnvSource", "episode_source", "register", "task_source"]
