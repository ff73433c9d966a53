"""One registry of environment sources: where a run's tasks come from, how its episodes run, which tasks
evaluate it.

A config selects two sources, possibly the same one: its *task source* by ``dataset.source`` (arithmetic,
reasoning-gym, a verl file) and its *episode source* by ``env:`` and ``agent:`` (an ``Env`` class, an
OpenAI-client agent function); a verifiers environment is both. The config, the trainer
(``rl/rollouts.py``) and the evaluator (``rl/evaluate.py``) ask the registry for these, never which source
it is. Adding a source is one :func:`register` call.

It imports nothing heavy, so reading a config stays fast. The built-in sources register themselves in
their own package (a floor above), naming their functions as ``"module:function"``, imported on first use
(their modules import the controller, the server, verifiers); ``import srt_agent`` registers them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..registry import Registry, load
from .tasks import Task

#: a function, or ``"module:function"`` to import on first use
Target = Callable[..., Any] | str

#: what a source without a selector of its own is the default of
DEFAULT_TASKS = "verl_files"
DEFAULT_EPISODES = "env_class"


def _call(target: Target | None, what: str, name: str, *args: Any) -> Any:
    if target is None:
        raise ValueError(f"environment source {name!r} has no {what}")
    return load(target)(*args)


@dataclass(frozen=True)
class EnvSource:
    """An environment source: which config values select it and the functions that do its part.

    - `dataset(source) -> bool`: it loads the tasks of this ``dataset.source`` value; then `tasks`
      (``(dataset section, limit) -> list[Task]``) and `held_out` (``(config, n) -> list[Task]``: tasks
      the policy is evaluated on, unseen in training where the source can draw more) are required.
    - `episodes(env, agent) -> bool`: it runs the episodes of a config with these ``env:`` and ``agent:``
      values; then `rollout` (``(controller, loaded, tasks, n_samples, seed, on_done) -> (trajectories,
      summary)``, what ``agent.rollout.run_rollouts`` returns) is required. A source selected by its
      ``env:`` value alone names no Env class there; when it also loads tasks, they are the dataset.
    - `score(answer, task) -> float` in [0, 1]: its tasks' answers scored by their own rule, for
      ``reward.kind`` naming the source (and ``auto`` on its tasks); the final answer may be None.
    - `check_dataset(dataset section)`, `check_config(config)`: raise ValueError on a config it cannot run.
    - `run_ahead`: its episodes open with the Env's prompts (``controller.opening``), which run-ahead drafts.
    - `path`: its ``dataset.source`` is a file path (resolved against the config's folder).

    A selector left None selects nothing: the defaults (:data:`DEFAULT_TASKS`, :data:`DEFAULT_EPISODES`)
    serve what no other source selects.
    """

    name: str
    dataset: Callable[[str], bool] | None = None
    episodes: Callable[[str, str | None], bool] | None = None
    tasks: Target | None = None
    held_out: Target | None = None
    rollout: Target | None = None
    score: Target | None = None
    check_dataset: Target | None = None
    check_config: Target | None = None
    run_ahead: bool = True
    path: bool = False

    def load_tasks(self, dataset: Any, limit: int | None) -> list[Task]:
        return _call(self.tasks, "tasks", self.name, dataset, limit)

    def held_out_tasks(self, config: Any, n: int) -> list[Task]:
        return _call(self.held_out, "held-out tasks", self.name, config, n)

    def run(
        self, controller: Any, loaded: Any, tasks: Sequence[Task], n_samples: int, seed: int | None, on_done: Any
    ) -> Any:
        return _call(self.rollout, "rollout", self.name, controller, loaded, tasks, n_samples, seed, on_done)

    def score_answer(self, answer: str | None, task: Task) -> float:
        return _call(self.score, "answer score", self.name, answer, task)

    def check(self, dataset: Any = None, config: Any = None) -> None:
        """Run the source's check of the ``dataset:`` section or of the whole config, where it has one."""
        if dataset is not None and self.check_dataset is not None:
            _call(self.check_dataset, "dataset check", self.name, dataset)
        if config is not None and self.check_config is not None:
            _call(self.check_config, "config check", self.name, config)


SOURCES: Registry[EnvSource] = Registry("environment source")


def register(source: EnvSource) -> EnvSource:
    """Add `source` (ValueError when another source has its name, or it lacks what its selectors need)."""
    if (source.dataset is not None or source.name == DEFAULT_TASKS) and None in (source.tasks, source.held_out):
        raise ValueError(f"environment source {source.name!r} loads tasks: give it tasks and held_out")
    if (source.episodes is not None or source.name == DEFAULT_EPISODES) and source.rollout is None:
        raise ValueError(f"environment source {source.name!r} runs episodes: give it a rollout")
    return SOURCES.add(source.name, source)


def _one(matches: list[EnvSource], default: str, what: str) -> EnvSource:
    if len(matches) > 1:
        names = ", ".join(s.name for s in matches)
        raise ValueError(f"the config selects {len(matches)} {what} sources ({names}): give one, not both")
    return matches[0] if matches else SOURCES[default]


def task_source(dataset: str) -> EnvSource:
    """The source that loads the tasks of ``dataset.source`` value `dataset`."""
    return _one([s for s in SOURCES.values() if s.dataset is not None and s.dataset(dataset)], DEFAULT_TASKS, "task")


def episode_source(env: str, agent: str | None) -> EnvSource:
    """The source that runs the episodes of a config with these ``env:`` and ``agent:`` values."""
    matches = [s for s in SOURCES.values() if s.episodes is not None and s.episodes(env, agent)]
    return _one(matches, DEFAULT_EPISODES, "episode")


def names_source(env: str) -> bool:
    """Whether ``env:`` value `env` names a source (``verifiers:<id>``) rather than an Env class."""
    return any(s.episodes is not None and s.episodes(env, None) for s in SOURCES.values())
