"""The ``arithmetic`` source: seeded, verifiable arithmetic and word problems for offline use, in ReTool's
prompt format, and the held-out tasks drawn the same way with another seed.

Each task's ``extra_info["solution"]`` is a program that prints its answer (the cold start's traces run it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..config.tasks import Task

if TYPE_CHECKING:
    from ..config import DatasetConfig, EnvConfig

RETOOL_SYSTEM_PROMPT = (
    "You are a careful math assistant with a Python interpreter. To run code, write it as\n"
    "<code>\n```python\n# your code here, print() what you need\n```\n</code>\n"
    "and stop; the output will come back inside <interpreter>...</interpreter>. Use the interpreter for "
    "any calculation. When you know the answer, give it as \\boxed{answer}."
)
ARITHMETIC_SOURCE = "srt_agent/arithmetic"
# A worked exchange in ReTool's format; small models follow the format far more often after one.
RETOOL_EXAMPLE = [
    {"role": "user", "content": "Compute 23 * 47 + 5."},
    {
        "role": "assistant",
        "content": "I will use Python.\n<code>\n```python\nprint(23 * 47 + 5)\n```\n</code>\n"
        "<interpreter>\n1086\n</interpreter>\nThe answer is \\boxed{1086}.",
    },
]


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


def dataset_tasks(dataset: DatasetConfig, limit: int | None) -> list[Task]:
    """The ``dataset:`` section's `n` tasks (at most `limit`) drawn with its seed."""
    prompt = {"system_prompt": dataset.system_prompt} if dataset.system_prompt is not None else {}
    n = dataset.n if limit is None else min(dataset.n, limit)
    return arithmetic_tasks(n, dataset.seed, few_shot=dataset.few_shot, **prompt)


def unseen_tasks(config: EnvConfig, candidates: Sequence[Task], n: int) -> list[Task]:
    """The first `n` of `candidates` whose question neither the RL dataset nor the cold start asks."""
    cs, dataset = config.cold_start, config.dataset
    seen = {t.prompt[-1]["content"] for t in dataset.tasks()}
    seen |= {t.prompt[-1]["content"] for t in arithmetic_tasks(cs.n, cs.seed, few_shot=dataset.few_shot)}
    return [t for t in candidates if t.prompt[-1]["content"] not in seen][:n]


def held_out(config: EnvConfig, n: int) -> list[Task]:
    """`n` arithmetic tasks drawn with ``cold_start.eval_seed`` that training never sees."""
    candidates = arithmetic_tasks(n * 2, config.cold_start.eval_seed, few_shot=config.dataset.few_shot)
    return unseen_tasks(config, candidates, n)
