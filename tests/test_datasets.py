"""verl-layout datasets (JSONL, parquet) and the procedural arithmetic task set."""

from __future__ import annotations

import json
import re

import pytest

from srt_agent.agent.rewards import score_response
from srt_agent.config.tasks import Task, load_tasks, save_tasks
from srt_agent.sources.arithmetic import ARITHMETIC_KINDS, RETOOL_SYSTEM_PROMPT, arithmetic_tasks


def test_arithmetic_tasks_are_seeded_and_cover_every_kind():
    a, b = arithmetic_tasks(12, seed=3), arithmetic_tasks(12, seed=3)
    assert a == b
    assert a != arithmetic_tasks(12, seed=4)
    assert {t.extra_info["kind"] for t in a} == set(ARITHMETIC_KINDS)
    assert all(t.prompt[0] == {"role": "system", "content": RETOOL_SYSTEM_PROMPT} for t in a)
    assert "<code>" in RETOOL_SYSTEM_PROMPT and "\\boxed{" in RETOOL_SYSTEM_PROMPT


def primes_below(n: int) -> int:
    sieve = [True] * n
    for i in range(2, n):
        if sieve[i]:
            sieve[i * i :: i] = [False] * len(sieve[i * i :: i])
    return sum(sieve[2:])


# Each kind's answer recomputed from the numbers in its question, in question order, independently of the
# generator's own arithmetic.
RECOMPUTE = {
    "product_minus": lambda a, b, c: a * b - c,
    "power_mod": lambda a, k, m: pow(a, k, m),
    "range_sum": lambda lo, hi, step: sum(range(-(-lo // step) * step, hi + 1, step)),
    "prime_count": primes_below,
    "shopping": lambda apples, price_a, pears, price_p, paid: paid - apples * price_a - pears * price_p,
    "train_distance": lambda v1, v2, hours: (v1 + v2) * hours,
}


def test_every_kind_of_arithmetic_answer_is_right():
    tasks = arithmetic_tasks(120, seed=0) + arithmetic_tasks(30, seed=9)
    assert set(RECOMPUTE) == set(ARITHMETIC_KINDS)
    for task in tasks:
        numbers = [int(n) for n in re.findall(r"\d+", task.prompt[-1]["content"])]
        answer = RECOMPUTE[task.extra_info["kind"]](*numbers)
        assert task.ground_truth == str(answer), task.prompt[-1]["content"]
        if task.extra_info["kind"] == "shopping":
            assert answer >= 0  # she can pay
        assert score_response(f"\\boxed{{{task.ground_truth}}}", task.ground_truth, 0) == 1.0


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_in_verl_layout(tmp_path, suffix):
    tasks = arithmetic_tasks(5, seed=1)
    path = tmp_path / f"data{suffix}"
    save_tasks(tasks, path)
    assert load_tasks(path) == tasks
    assert load_tasks(path, limit=2) == tasks[:2]


def test_parquet_written_by_pyarrow_directly(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": 2}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (task,) = load_tasks(tmp_path / "d.parquet")
    assert task == Task([{"role": "user", "content": "1+1?"}], "2", "x", {})


def test_bad_rows_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(arithmetic_tasks(1)[0].to_row())
    path.write_text(good + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: invalid JSON"):
        load_tasks(path)
    path.write_text(good + "\n" + json.dumps({"prompt": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: missing 'reward_model.ground_truth'"):
        load_tasks(path)
    path.write_text(json.dumps({"prompt": [{"content": "q"}], "reward_model": {"ground_truth": 1}}) + "\n")
    with pytest.raises(ValueError, match="list of chat messages"):
        load_tasks(path)


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=".jsonl or .parquet"):
        load_tasks(tmp_path / "d.csv")


def test_few_shot_example_is_a_correct_retool_exchange():
    from srt_agent.agent.parsing import parse_tool_call
    from srt_agent.sources.arithmetic import RETOOL_EXAMPLE

    task = arithmetic_tasks(1, seed=0, few_shot=True)[0]
    assert [m["role"] for m in task.prompt] == ["system", "user", "assistant", "user"]
    assert task.prompt[1:3] == RETOOL_EXAMPLE
    answer = RETOOL_EXAMPLE[1]["content"]
    code = parse_tool_call(answer.split("<interpreter>")[0]).arguments["code"]
    assert code == "print(23 * 47 + 5)" and score_response(answer, str(eval(code[6:-1])), 1) == 1.0
