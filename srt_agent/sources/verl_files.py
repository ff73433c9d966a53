"""The file source: ``dataset.source`` a ``.jsonl`` or ``.parquet`` path of verl-layout rows (verl's own
datasets, or tasks written with :func:`~srt_agent.config.tasks.save_tasks`).

A file has no held-out split of its own: held-out evaluation uses unseen arithmetic tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.tasks import Task, load_tasks
from . import arithmetic

if TYPE_CHECKING:
    from ..config import DatasetConfig, EnvConfig


def dataset_tasks(dataset: DatasetConfig, limit: int | None) -> list[Task]:
    """The file's rows as tasks (the first `limit`)."""
    return load_tasks(dataset.source, limit)


def held_out(config: EnvConfig, n: int) -> list[Task]:
    """`n` unseen arithmetic tasks (see :func:`srt_agent.sources.arithmetic.held_out`)."""
    return arithmetic.held_out(config, n)
