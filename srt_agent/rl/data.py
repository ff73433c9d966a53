"""The prompt stream of an RL run: seeded epochs over the dataset, a resumable cursor, look-ahead."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.tasks import Task


@dataclass
class PromptCursor:
    """Where the stream stands: the epoch and the position inside its shuffled order."""

    epoch: int = 0
    index: int = 0


class PromptSampler:
    """Yields batches of tasks, reshuffling (seeded by epoch) each time the dataset is used up.

    The order depends only on the seed and the epoch, so a run resumed from a cursor sees the same
    prompts as an uninterrupted one; :meth:`peek` shows the batches that come next without moving.
    """

    def __init__(self, tasks: Sequence[Task], seed: int = 0, cursor: PromptCursor | None = None):
        if not tasks:
            raise ValueError("the dataset has no tasks")
        self.tasks = list(tasks)
        self.seed = seed
        self.cursor = cursor or PromptCursor()

    def order(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def _take(self, count: int, cursor: PromptCursor) -> tuple[list[int], PromptCursor]:
        epoch, index, taken = cursor.epoch, cursor.index, []
        while len(taken) < count:
            order = self.order(epoch)
            take = order[index : index + count - len(taken)]
            taken += take
            index += len(take)
            if index >= len(order):
                epoch, index = epoch + 1, 0
        return taken, PromptCursor(epoch, index)

    def next_batch(self, count: int) -> list[Task]:
        """The next `count` tasks (dataset indices in ``task.extra_info`` are untouched)."""
        indices, self.cursor = self._take(count, self.cursor)
        return [self.tasks[i] for i in indices]

    def peek(self, count: int) -> list[Task]:
        """The next `count` tasks, without moving the cursor."""
        indices, _ = self._take(count, self.cursor)
        return [self.tasks[i] for i in indices]

    def state_dict(self) -> dict:
        return {"epoch": self.cursor.epoch, "index": self.cursor.index, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.cursor = PromptCursor(state["epoch"], state["index"])
