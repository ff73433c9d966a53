"""Cold-start traces: real sandbox runs, right answers for every task kind, rollout-identical tokenization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srt_agent.agent import EnvConfig, ReToolEnv, load_tools
from srt_agent.agent.env import ToolCallRecord
from srt_agent.agent.retool import interpreter_block
from srt_agent.agent.trajectory import Trajectory
from srt_agent.config import InterpreterConfig
from srt_agent.models import end_token_ids, load_tokenizer
from srt_agent.rl.batch import trajectory_sample
from srt_agent.rl.coldstart import cold_start_failure
from srt_agent.rl.evaluate import tool_use_report
from srt_agent.rl.traces import (
    load_message_traces,
    messages_sample,
    procedural_traces,
    turn_end_token,
)
from srt_agent.sources.arithmetic import ARITHMETIC_KINDS, arithmetic_tasks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def controller_args(tokenizer):
    tools = load_tools(ROOT / "tools" / "code_interpreter.yaml", InterpreterConfig(max_output_chars=256))
    config = EnvConfig(name="cold", max_turns=3, max_tokens_per_turn=200, max_response_tokens=400)
    return dict(
        tokenizer=tokenizer, config=config, env_class=ReToolEnv, tools=tools, eos_token_ids=end_token_ids(tokenizer)
    )


def test_procedural_traces_run_their_code_and_answer_right(tokenizer, controller_args):
    tasks = arithmetic_tasks(12, seed=7)
    assert {t.extra_info["kind"] for t in tasks} == set(ARITHMETIC_KINDS)
    end = turn_end_token(tokenizer, controller_args["eos_token_ids"])
    trajectories = procedural_traces(controller_args, tasks, end, seed=7)
    assert len(trajectories) == 12
    for task, traj in zip(tasks, trajectories):
        (call,) = traj.tool_calls
        assert call.status == "ok" and call.output.strip() == task.ground_truth  # really executed, right output
        assert traj.reward == 1.0 and traj.finish_reason == "done" and traj.num_turns == 2
        # Tokens: model turn (trained) | interpreter block (forced, exactly as the controller encodes it) | answer.
        forced = [t for t, m in zip(traj.response_ids, traj.response_mask) if m == 0]
        assert forced == tokenizer.encode(interpreter_block(call.output), add_special_tokens=False)
        assert traj.response_ids[-1] == end and traj.response_mask[-1] == 1
        text = tokenizer.decode(traj.response_ids)
        assert f"\\boxed{{{task.ground_truth}}}" in text and "<interpreter>" in text
        sample = trajectory_sample(traj)
        assert sample.trained_tokens == sum(traj.response_mask) > 0
    report = tool_use_report(trajectories)
    assert (report.tool_call_rate, report.code_ok_rate, report.accuracy) == (1.0, 1.0, 1.0)


def test_procedural_traces_with_a_few_shot_prompt_run_their_own_code(tokenizer, controller_args):
    """The few-shot example's own <interpreter> output is in the prompt: the scripted solution still runs
    (it used to box the example's answer at once, without a tool call, so no trace came out right)."""
    tasks = arithmetic_tasks(4, seed=7, few_shot=True)
    end = turn_end_token(tokenizer, controller_args["eos_token_ids"])
    trajectories = procedural_traces(controller_args, tasks, end, seed=7)
    for task, traj in zip(tasks, trajectories):
        (call,) = traj.tool_calls
        assert (call.status, call.output.strip(), traj.reward) == ("ok", task.ground_truth, 1.0)


def test_a_cold_start_with_no_usable_trace_says_what_went_wrong():
    def traj(reward=0.0, calls=(), finish="done", error=None):
        records = [ToolCallRecord("code_interpreter", {}, status, output, 0.1) for status, output in calls]
        return Trajectory("r", 0, 0, [1], reward=reward, tool_calls=records, finish_reason=finish, error=error)

    message = cold_start_failure(
        [
            traj(),
            traj(),
            traj(calls=[("sandbox_error", "could not run the sandbox: bwrap: No permissions")]),
            traj(calls=[("ok", "41")]),
            traj(finish="length"),
        ],
        correct=1.0,
    )
    assert message.startswith("no cold-start trace came out right: of 5 traces, 2 answered without a tool call")
    assert "1 had tool calls that failed ({'sandbox_error': 1}; e.g. 'could not run the sandbox: bwrap" in message
    assert "is the sandbox working?" in message and "1 ended before answering ({'length': 1})" in message
    assert "1 ran their code but the boxed answer scored below reward.correct=1.0" in message
    only_wrong = cold_start_failure([traj(calls=[("ok", "41")])], correct=1.0)
    assert "sandbox" not in only_wrong and "1 ran their code" in only_wrong


def test_tasks_without_a_solution_are_refused(tokenizer, controller_args):
    task = arithmetic_tasks(1)[0]
    del task.extra_info["solution"]
    with pytest.raises(ValueError, match="no extra_info\\['solution'\\]"):
        procedural_traces(controller_args, [task], 2)


def test_verl_multi_turn_sft_rows_tokenize_like_rollouts(tmp_path, tokenizer):
    end = turn_end_token(tokenizer, end_token_ids(tokenizer))
    messages = [
        {"role": "system", "content": "Use Python."},
        {"role": "user", "content": "What is 6 * 7?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "code_interpreter", "arguments": json.dumps({"code": "print(6 * 7)"})},
                }
            ],
        },
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "The answer is \\boxed{42}."},
    ]
    sample = messages_sample(messages, tokenizer, end)
    tool = tokenizer.encode(interpreter_block("42"), add_special_tokens=False)
    forced = [t for t, m in zip(sample.response_ids, sample.response_mask) if m == 0]
    assert forced == tool
    text = tokenizer.decode(sample.response_ids)
    assert "<code>\n```python\nprint(6 * 7)\n```\n</code>" in text and text.endswith("\\boxed{42}.<|im_end|>")
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    (loaded,) = load_message_traces(path, tokenizer, end)
    assert loaded.response_ids == sample.response_ids and loaded.response_mask == sample.response_mask


@pytest.mark.parametrize(
    "row, message",
    [
        ({"conversation": []}, "missing 'messages'"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "prompt messages followed by"),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                    {"role": "tool", "content": "x"},
                ]
            },
            "must end with an assistant message",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a", "tool_calls": [{"function": {"arguments": {}}}]},
                ]
            },
            "without a string 'code'",
        ),
    ],
)
def test_bad_trace_rows_name_the_row(tmp_path, tokenizer, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message) as info:
        load_message_traces(path, tokenizer, 2)
    assert "bad.jsonl:2" in str(info.value)


def test_the_cached_cold_start_is_keyed_by_what_its_held_out_reports_measured(tiny_llama):
    """The same traces and SFT over two datasets (arithmetic, a reasoning-gym mix) hold out different tasks,
    and a different reward scores them: the cached before/after reports of one must not stand for the other."""
    from srt_agent.rl.coldstart import cold_start_key

    root = Path(__file__).resolve().parents[1]
    arithmetic = EnvConfig(tools=str(root / "tools" / "code_interpreter.yaml"), cold_start={"eval_tasks": 4})
    mix = EnvConfig(
        tools=arithmetic.tools,
        cold_start={"eval_tasks": 4},
        dataset={"source": "reasoning_gym", "reasoning_gym": [{"name": "gcd", "weight": 1}]},
    )
    scored = EnvConfig(tools=arithmetic.tools, cold_start={"eval_tasks": 4}, reward={"incorrect": -1.0})
    keys = {cold_start_key(c, tiny_llama) for c in (arithmetic, mix, scored)}
    assert len(keys) == 3
    assert cold_start_key(arithmetic, tiny_llama) == cold_start_key(arithmetic.model_copy(), tiny_llama)
