"""The ``reasoning_gym`` source: weighted mixes of reasoning-gym's procedural task families
(``pip install 'srt-agent[envs]'``), seeded, each task scored by its family's own scorer; held-out tasks
come from the same mix under another seed.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..config.tasks import Task
from .arithmetic import RETOOL_EXAMPLE, unseen_tasks

if TYPE_CHECKING:
    from ..config import DatasetConfig, EnvConfig

REASONING_GYM_SOURCE = "reasoning_gym"  # a task's data_source is "reasoning_gym/<family>"
REASONING_GYM_SYSTEM_PROMPT = (
    "You are a careful problem solver with a Python interpreter. To run code, write it as\n"
    "<code>\n```python\n# your code here, print() what you need\n```\n</code>\n"
    "and stop; the output will come back inside <interpreter>...</interpreter>. When you know the answer, "
    "give exactly the answer the question asks for as \\boxed{answer}."
)


def reasoning_gym_missing() -> str | None:
    """Why reasoning-gym cannot be used here (one line), or None when it is installed."""
    try:
        import reasoning_gym  # noqa: F401
    except ImportError as exc:
        return f"reasoning-gym is not installed ({exc}): pip install 'srt-agent[envs]'"
    return None


def check_reasoning_gym_family(name: str, config: dict) -> None:
    """ValueError naming the family when it is unknown or `config` does not make a valid config for it."""
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = [f for f in DATASETS if name.lower() in f or f in name.lower()][:5]
        hint = f"; did you mean {', '.join(close)}?" if close else " (reasoning_gym.factory.DATASETS lists them)"
        raise ValueError(f"unknown reasoning-gym task family {name!r}{hint}")
    config_cls = DATASETS[name][1]
    try:
        cfg = config_cls(**config)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(
            f"reasoning-gym task family {name!r}: bad config {config}: {exc or type(exc).__name__}"
        ) from None


def reasoning_gym_tasks(
    families: Sequence[tuple[str, float, dict]],
    n: int,
    seed: int = 0,
    system_prompt: str = REASONING_GYM_SYSTEM_PROMPT,
    few_shot: bool = False,
) -> list[Task]:
    """`n` tasks drawn from reasoning-gym's task `families` (``(name, weight, config)``), each family chosen
    with probability proportional to its weight (reasoning-gym's composite dataset: the same seed gives the
    same tasks).

    A task's ``ground_truth`` is reasoning-gym's answer and ``extra_info["reasoning_gym"]`` holds the family,
    its config and the whole entry, which :func:`reasoning_gym_score` scores with the family's own scorer.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not families:
        raise ValueError("reasoning_gym: name at least one task family")
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec

    for name, _, config in families:
        check_reasoning_gym_family(name, config)
    specs = [DatasetSpec(name=name, weight=float(weight), config=dict(config)) for name, weight, config in families]
    # reasoning-gym draws item i from seed + i, so seeds 1 and 2 would share all but one task: spread the
    # seed over 31 bits first (a held-out seed then draws tasks the training seed never reaches).
    spread = random.Random(f"srt_agent/reasoning_gym/{seed}").getrandbits(31)
    composite = reasoning_gym.create_dataset("composite", size=max(n, 1), seed=spread, datasets=specs)
    configs = {name: dict(config) for name, _, config in families}
    tasks = []
    for i in range(n):
        entry = composite[i]
        family = entry["metadata"]["source_dataset"]
        tasks.append(
            Task(
                prompt=[
                    {"role": "system", "content": system_prompt},
                    *(RETOOL_EXAMPLE if few_shot else []),
                    {"role": "user", "content": str(entry["question"])},
                ],
                ground_truth=str(entry["answer"]),
                data_source=f"{REASONING_GYM_SOURCE}/{family}",
                extra_info={
                    "index": i,
                    "seed": seed,
                    "reasoning_gym": {"family": family, "config": configs[family], "entry": entry},
                },
            )
        )
    return tasks


_SCORERS: dict[str, Callable[[str | None, dict], float]] = {}
_SCORERS_LOCK = threading.Lock()


def reasoning_gym_score(answer: str | None, task: Task) -> float:
    """reasoning-gym's score of `answer` for `task` (in [0, 1]: 1 right, partial credit in between), by the
    scorer of the task's family built with the task's config (``dataset.score_answer(answer, entry)``)."""
    info = task.extra_info.get("reasoning_gym")
    if not isinstance(info, dict) or "entry" not in info:
        raise ValueError(
            f"task from {task.data_source or 'an unnamed source'} has no reasoning-gym entry "
            "(extra_info.reasoning_gym): reward.kind reasoning_gym needs dataset.source reasoning_gym"
        )
    family, config = info["family"], dict(info.get("config") or {})
    key = json.dumps([family, config], sort_keys=True, default=str)
    with _SCORERS_LOCK:  # episodes score from worker threads
        scorer = _SCORERS.get(key)
        if scorer is None:
            import reasoning_gym

            scorer = _SCORERS[key] = reasoning_gym.create_dataset(family, **config).score_answer
    return float(scorer(answer, info["entry"]))


def check(dataset: DatasetConfig) -> None:
    """ValueError when the ``dataset:`` section's families do not make a mix reasoning-gym can draw."""
    if not dataset.reasoning_gym:
        raise ValueError("source reasoning_gym needs a 'reasoning_gym:' list of task families")
    names = [f.name for f in dataset.reasoning_gym]
    if len(set(names)) != len(names):
        raise ValueError(f"reasoning_gym: a task family is listed twice: {names}")
    missing = reasoning_gym_missing()
    if missing:
        raise ValueError(missing)
    for family in dataset.reasoning_gym:
        check_reasoning_gym_family(family.name, family.config)


def mix_tasks(dataset: DatasetConfig, n: int, seed: int) -> list[Task]:
    """`n` tasks of the section's mix drawn with `seed`."""
    prompt = {"system_prompt": dataset.system_prompt} if dataset.system_prompt is not None else {}
    families = [(f.name, f.weight, f.config) for f in dataset.reasoning_gym]
    return reasoning_gym_tasks(families, n, seed, few_shot=dataset.few_shot, **prompt)


def dataset_tasks(dataset: DatasetConfig, limit: int | None) -> list[Task]:
    """The ``dataset:`` section's `n` tasks (at most `limit`) drawn from its mix with its seed."""
    return mix_tasks(dataset, dataset.n if limit is None else min(dataset.n, limit), dataset.seed)


def held_out(config: EnvConfig, n: int) -> list[Task]:
    """`n` tasks of the same mix drawn with ``cold_start.eval_seed`` that training never sees."""
    return unseen_tasks(config, mix_tasks(config.dataset, n * 2, config.cold_start.eval_seed), n)
