"""Tasks in verl's row layout: :class:`Task` and reading and writing ``.jsonl``/``.parquet`` files of rows.

A row is ``{"data_source", "prompt": [chat messages], "reward_model": {"ground_truth"}, "extra_info"}``;
every environment source hands the trainer its tasks in this one shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Task:
    """One prompt with its verifiable answer (a verl dataset row)."""

    prompt: list[dict]
    ground_truth: str
    data_source: str = ""
    extra_info: dict = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict, where: str = "row") -> Task:
        """Build a task from a verl-layout row; `where` names the row in error messages."""
        prompt = row.get("prompt")
        if hasattr(prompt, "tolist"):  # parquet gives numpy arrays of dicts
            prompt = prompt.tolist()
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt
        ):
            raise ValueError(f"{where}: 'prompt' must be a list of chat messages with 'role' and 'content'")
        reward_model = row.get("reward_model") or {}
        if "ground_truth" not in reward_model:
            raise ValueError(f"{where}: missing 'reward_model.ground_truth'")
        return cls(
            prompt=[{"role": str(m["role"]), "content": str(m["content"])} for m in prompt],
            ground_truth=str(reward_model["ground_truth"]),
            data_source=str(row.get("data_source", "")),
            extra_info=dict(row.get("extra_info") or {}),
        )

    def to_row(self) -> dict:
        """The verl-layout row of this task."""
        return {
            "data_source": self.data_source,
            "prompt": self.prompt,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": self.extra_info,
        }

    @property
    def key(self) -> str:
        """A stable identity for the prompt (the engine's tree key)."""
        return json.dumps(self.prompt, sort_keys=True)


def read_rows(path: str | Path, what: str = "dataset") -> list[tuple[str, dict]]:
    """The rows of a ``.jsonl`` or ``.parquet`` file, each with where it stands (``file:line`` / ``file row i``)
    for error messages; `what` names the file's role in them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if path.suffix == ".jsonl":
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"{path} row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    raise ValueError(f"{what} {path}: expected a .jsonl or .parquet file")


def load_tasks(path: str | Path, limit: int | None = None) -> list[Task]:
    """Read tasks from a ``.jsonl`` or ``.parquet`` file in verl's layout."""
    rows = read_rows(path)
    rows = rows[:limit] if limit is not None else rows
    return [Task.from_row(row, where) for where, row in rows]


def save_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    """Write tasks as verl-layout rows (``.jsonl`` or ``.parquet``)."""
    path = Path(path)
    rows = [t.to_row() for t in tasks]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(f"dataset {path}: expected a .jsonl or .parquet file")
