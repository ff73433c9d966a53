"""Environment sources: where tasks come from and how episodes run, behind one registry
(:mod:`.registry`), one module per source: an ``Env`` class (:mod:`.env_class`), an ``agent:`` function
(:mod:`.agent_function`), a verifiers environment (:mod:`.verifiers`), arithmetic (:mod:`.arithmetic`),
reasoning-gym (:mod:`.reasoning_gym`) and verl files (:mod:`.verl_files`); :mod:`.tasks` is the task
shape they all hand over.

Importing this package stays light (the config imports it): a source's module loads on first use.
"""

from .registry import SOURCES, EnvSource, episode_source, register, task_source
from .tasks import Task, load_tasks, read_rows, save_tasks

__all__ = [
    "SOURCES",
    "EnvSource",
    "Task",
    "episode_source",
    "load_tasks",
    "read_rows",
    "register",
    "save_tasks",
    "task_source",
]
