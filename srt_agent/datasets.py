"""Tasks: verl-layout rows from JSONL/parquet, a seeded, verifiable arithmetic task set for offline use, and
weighted mixes of reasoning-gym's procedural task families (``pip install 'srt-agent[envs]'``).

A row in verl's layout is ``{"data_source", "prompt": [chat messages], "reward_model": {"ground_truth"},
"extra_info"}``; :class:`Task` is its typed form.
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

RETOOL_SYSTEM_PROMPT = (
    "You are a careful math assistant with a Python interpreter. To run code, write it as\n"
    "<code>\n```python\n# your code here, print() what you need\n```\n</code>\n"
    "and stop; the output will come back inside <interpreter>...</interpreter>. Use the interpreter for "
    "any calculation. When you know the answer, give it as \\boxed{answer}."
)
ARITHMETIC_SOURCE = "srt_agent/arithmetic"
REASONING_GYM_SOURCE = "reasoning_gym"  # a task's data_source is "reasoning_gym/<family>"
REASONING_GYM_SYSTEM_PROMPT = (
    "You are a careful problem solver with a Python interpreter. To run code, write it as\n"
    "<code>\n```python\n# your code here, print() what you need\n```\n</code>\n"
    "and stop; the output will come back inside <interpreter>...</interpreter>. When you know the answer, "
    "give exactly the answer the question asks for as \\boxed{answer}."
)
# A worked exchange in ReTool's format; small models follow the format far more often after one.
RETOOL_EXAMPLE = [
    {"role": "user", "content": "Compute 23 * 47 + 5."},
    {
        "role": "assistant",
        "content": "I will use Python.\n<code>\n```python\nprint(23 * 47 + 5)\n```\n</code>\n"
        "<interpreter>\n1086\n</interpreter>\nThe answer is \\boxed{1086}.",
    },
]


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


def _product_minus(rng: random.Random) -> tuple[str, int, str]:
    a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(1, 500)
    return f"Compute {a} * {b} - {c}.", a * b - c, f"print({a} * {b} - {c})"


def _power_mod(rng: random.Random) -> tuple[str, int, str]:
    a, k, m = rng.randint(2, 30), rng.randint(5, 40), rng.randint(7, 97)
    return f"What is the remainder when {a}^{k} is divided by {m}?", pow(a, k, m), f"print(pow({a}, {k}, {m}))"


def _range_sum(rng: random.Random) -> tuple[str, int, str]:
    lo = rng.randint(1, 50)
    hi = lo + rng.randint(10, 200)
    step = rng.randint(2, 7)
    return (
        f"What is the sum of all integers from {lo} to {hi} inclusive that are divisible by {step}?",
        sum(x for x in range(lo, hi + 1) if x % step == 0),
        f"print(sum(x for x in range({lo}, {hi} + 1) if x % {step} == 0))",
    )


def _prime_count(rng: random.Random) -> tuple[str, int, str]:
    n = rng.randint(20, 400)
    code = (
        "def is_prime(x):\n"
        "    return x > 1 and all(x % d for d in range(2, int(x ** 0.5) + 1))\n\n"
        f"print(sum(1 for x in range({n}) if is_prime(x)))"
    )
    return (
        f"How many prime numbers are less than {n}?",
        sum(1 for x in range(2, n) if all(x % d for d in range(2, math.isqrt(x) + 1))),
        code,
    )


def _shopping(rng: random.Random) -> tuple[str, int, str]:
    apples, pa_ = rng.randint(3, 20), rng.randint(2, 9)
    pears, pp = rng.randint(2, 15), rng.randint(3, 12)
    paid = 50 * math.ceil((apples * pa_ + pears * pp + 1) / 50)
    question = (
        f"Mia buys {apples} apples at {pa_} dollars each and {pears} pears at {pp} dollars each. "
        f"She pays with {paid} dollars. How many dollars of change does she get?"
    )
    code = f"cost = {apples} * {pa_} + {pears} * {pp}\nprint({paid} - cost)"
    return question, paid - apples * pa_ - pears * pp, code


def _train_distance(rng: random.Random) -> tuple[str, int, str]:
    v1, v2, hours = rng.randint(40, 90), rng.randint(40, 90), rng.randint(2, 9)
    question = (
        f"Two trains leave the same station in opposite directions at {v1} km/h and {v2} km/h. "
        f"How many kilometres apart are they after {hours} hours?"
    )
    return question, (v1 + v2) * hours, f"print(({v1} + {v2}) * {hours})"


# Each kind returns (question, exact answer, a Python program that prints the answer).
ARITHMETIC_KINDS: dict[str, Callable[[random.Random], tuple[str, int, str]]] = {
    "product_minus": _product_minus,
    "power_mod": _power_mod,
    "range_sum": _range_sum,
    "prime_count": _prime_count,
    "shopping": _shopping,
    "train_distance": _train_distance,
}


def arithmetic_tasks(
    n: int, seed: int = 0, system_prompt: str = RETOOL_SYSTEM_PROMPT, few_shot: bool = False
) -> list[Task]:
    """`n` seeded arithmetic and word problems with exact integer answers, cycling through the kinds.

    `few_shot` puts :data:`RETOOL_EXAMPLE` between the system prompt and the question. Each task's
    ``extra_info["solution"]`` is a program that prints its answer (the cold start's traces run it).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    kinds = list(ARITHMETIC_KINDS)
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        question, answer, solution = ARITHMETIC_KINDS[kind](rng)
        tasks.append(
            Task(
                prompt=[
                    {"role": "system", "content": system_prompt},
                    *(RETOOL_EXAMPLE if few_shot else []),
                    {"role": "user", "content": question},
                ],
                ground_truth=str(answer),
                data_source=ARITHMETIC_SOURCE,
                extra_info={"index": i, "kind": kind, "seed": seed, "solution": solution},
            )
        )
    return tasks


def reasoning_gym_missing() -> str | None:
    """Why reasoning-gym cannot be used here (one line), or None when it is installed."""
    try:
        import reasoning_gym  # noqa: F401
    except ImportError as exc:
        return f"reasoning-gym is not installed ({exc}): pip install 'srt-agent[envs]'"
    return None


def reasoning_gym_families() -> list[str]:
    """The task families reasoning-gym registers (``basic_arithmetic``, ``leg_counting``, …)."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


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
