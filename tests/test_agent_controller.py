"""The multi-turn controller on the real engine (tiny float64 Llama) and the real bubblewrap sandbox.

A random model does not write code blocks, so the code block comes in as forced tokens: the env's
response prefix opens the first turn with one, exactly as if the model had written it.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import torch

from srt_agent.agent import (
    EnvConfig,
    MultiTurnController,
    ReToolEnv,
    StepResult,
    Task,
    load_tools,
)
from srt_agent.agent.chat import render_prompt
from srt_agent.agent.env import Env
from srt_agent.engine import AsyncEngine, Engine, EngineOptions
from srt_agent.models import load_model
from srt_agent.sources.arithmetic import arithmetic_tasks

ROOT = Path(__file__).resolve().parents[1]
CODE = "<code>\n```python\nprint(6 * 7)\n```\n</code>"


@pytest.fixture(scope="module")
def tiny():
    """A random Llama with SmolLM2's tokenizer and chat template, in float64 so runs are bit-reproducible."""
    return load_model("tiny-llama", dtype=torch.float64, device="cpu")


@pytest.fixture(scope="module")
def tools():
    from srt_agent.config import InterpreterConfig

    return load_tools(ROOT / "tools" / "code_interpreter.yaml", InterpreterConfig(max_output_chars=64, timeout_s=2))


class PrefilledReTool(ReToolEnv):
    """ReTool whose first turn opens with a complete code block (the task's extra_info may override it)."""

    def response_prefix(self) -> str:
        return self.task.extra_info.get("prefix", CODE)


class Hinting(Env):
    """Never done: answers every turn with a user message."""

    async def step(self, response: str, final: bool) -> StepResult:
        return StepResult(observation=f"hint {self.turn}", role="user")


class Crashing(PrefilledReTool):
    async def step(self, response: str, final: bool) -> StepResult:
        if self.task.extra_info.get("crash"):
            raise RuntimeError("env bug")
        return await super().step(response, final)


def controller(tiny, env_class, tools=None, drafter="srt", **config) -> MultiTurnController:
    options = {"max_turns": 3, "max_tokens_per_turn": 8, "max_response_tokens": 160, "n_samples": 2, **config}
    engine = Engine(tiny, EngineOptions(drafter=drafter, device="cpu", max_batch=8, max_context=1024, calibrate=False))
    return MultiTurnController(
        AsyncEngine(engine), tiny.tokenizer, EnvConfig(**options), env_class, tools or {}, tiny.eos_token_ids
    )


def run(ctrl: MultiTurnController, tasks, n=None):
    try:
        return asyncio.run(ctrl.run(tasks, n))
    finally:
        ctrl.engine.close()


def segments(traj):
    """(mask, decoded text) runs of the response."""
    out, start = [], 0
    for i in range(1, len(traj.response_mask) + 1):
        if i == len(traj.response_mask) or traj.response_mask[i] != traj.response_mask[start]:
            out.append((traj.response_mask[start], traj.response_ids[start:i]))
            start = i
    return out


def test_code_block_runs_in_the_sandbox_and_output_comes_back_as_forced_tokens(tiny, tools):
    tasks = arithmetic_tasks(2, seed=0)
    ctrl = controller(tiny, PrefilledReTool, tools)
    trajs = run(ctrl, tasks)
    assert [(t.task_index, t.sample_index) for t in trajs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    decode = tiny.tokenizer.decode
    for traj in trajs:
        assert traj.error is None and traj.finish_reason == "done", traj.error
        assert traj.prompt_ids == tiny.tokenizer.encode(render_prompt(tiny.tokenizer, tasks[traj.task_index].prompt))
        (call,) = traj.tool_calls
        assert (call.name, call.arguments, call.status, call.output.strip()) == (
            "code_interpreter",
            {"code": "print(6 * 7)"},
            "ok",
            "42",
        )
        runs = segments(traj)
        assert [mask for mask, _ in runs] == [0, 1, 0, 1]
        assert decode(runs[0][1]) == CODE
        assert decode(runs[2][1]) == "\n<interpreter>\n42\n</interpreter>\n"
        assert all(lp == 0.0 for lp, m in zip(traj.response_logprobs, traj.response_mask) if m == 0)
        assert all(lp <= 0.0 for lp, m in zip(traj.response_logprobs, traj.response_mask) if m == 1)
        assert traj.num_turns == 2 and traj.forwards >= 1 and traj.tool_time_s > 0
        assert (
            traj.messages[-1]["role"] == "assistant"
            and "<interpreter>\n42\n</interpreter>" in traj.messages[-1]["content"]
        )
    # 4 episodes on 8 slots: at least 4 slots sit idle through every tool wait
    assert ctrl.waits.waits == 4 and ctrl.waits.wait_s > 0
    assert ctrl.waits.idle_slot_s >= 4 * ctrl.waits.wait_s


def test_a_hermes_tool_call_runs_like_a_code_block(tiny, tools):
    call_text = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2 ** 10)"}}</tool_call>'
    task = arithmetic_tasks(1, seed=2)[0]
    task.extra_info["prefix"] = call_text
    (traj,) = run(controller(tiny, PrefilledReTool, tools, n_samples=1), [task])
    assert traj.error is None, traj.error
    (call,) = traj.tool_calls
    assert (call.name, call.arguments, call.status, call.output.strip()) == (
        "code_interpreter",
        {"code": "print(2 ** 10)"},
        "ok",
        "1024",
    )
    runs = segments(traj)
    assert [mask for mask, _ in runs][:3] == [0, 1, 0]
    assert tiny.tokenizer.decode(runs[0][1]) == call_text
    assert tiny.tokenizer.decode(runs[2][1]) == "\n<interpreter>\n1024\n</interpreter>\n"


def test_logprobs_match_a_teacher_forced_pass_over_the_whole_trajectory(tiny, tools):
    """The engine continued each turn from exactly the recorded tokens (prompt, model and forced)."""
    (traj,) = run(controller(tiny, PrefilledReTool, tools, n_samples=1), arithmetic_tasks(1, seed=3))
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(tiny.model(ids).logits[0].double(), dim=-1)
    start = len(traj.prompt_ids)
    for i, (token, mask, lp) in enumerate(zip(traj.response_ids, traj.response_mask, traj.response_logprobs)):
        if mask:
            assert lp == pytest.approx(logprobs[start + i - 1, token].item(), abs=1e-6)


def test_model_and_forced_tokens_enter_the_prompts_tree(tiny, tools):
    ctrl = controller(tiny, PrefilledReTool, tools, n_samples=1)
    task = arithmetic_tasks(1, seed=4)[0]
    (traj,) = run(ctrl, [task])
    (stored,) = ctrl.engine.engine.drafter.cache.sequences(traj.prompt_key)
    full = traj.prompt_ids + traj.response_ids
    assert full[-len(stored) :] == stored and len(stored) > len(traj.response_ids)


def test_rollouts_are_the_same_with_and_without_drafting(tiny, tools):
    """Lossless at the agent level: drafting (cold and warm cache) changes nothing in the trajectories."""
    tasks = arithmetic_tasks(2, seed=1)
    plain = run(controller(tiny, PrefilledReTool, tools, drafter=None), tasks)
    ctrl = controller(tiny, PrefilledReTool, tools)
    try:
        cold = asyncio.run(ctrl.run(tasks))
        warm = asyncio.run(ctrl.run(tasks))
    finally:
        ctrl.engine.close()
    for a, b, c in zip(plain, cold, warm):
        assert a.response_ids == b.response_ids == c.response_ids
        assert a.response_mask == b.response_mask == c.response_mask
        assert a.response_logprobs == pytest.approx(b.response_logprobs, abs=1e-9)
    assert sum(t.draft_accepted for t in warm) > 0


def test_failures_stay_inside_their_trajectory(tiny, tools):
    """A crashing env, a looping program and an over-long prompt end (or mark) their own trajectories only."""
    tasks = [
        Task([{"role": "user", "content": "fine"}], "1"),
        Task([{"role": "user", "content": "crash"}], "1", extra_info={"crash": True}),
        Task([{"role": "user", "content": "loop"}], "1", extra_info={"prefix": "<code>\nwhile True: pass\n</code>"}),
        Task([{"role": "user", "content": "long " * 1200}], "1"),
    ]
    fine, crash, loop, long = run(controller(tiny, Crashing, tools, n_samples=1, max_turns=2), tasks)
    assert fine.finish_reason in ("done", "max_turns") and fine.error is None
    assert crash.finish_reason == "error" and "RuntimeError: env bug" in crash.error
    assert loop.tool_calls[0].status == "timeout" and loop.error is None and loop.num_turns == 2
    assert long.finish_reason == "error" and "context" in long.error and long.model_tokens == 0


def test_token_budget_and_turn_limit(tiny, tools):
    (short,) = run(controller(tiny, PrefilledReTool, tools, n_samples=1, max_response_tokens=30), arithmetic_tasks(1))
    assert short.finish_reason == "length" and len(short.response_ids) <= 30
    assert short.tool_calls[0].status == "ok"  # ran, but its output did not fit
    (last,) = run(controller(tiny, PrefilledReTool, tools, n_samples=1, max_turns=1), arithmetic_tasks(1))
    assert last.finish_reason == "done" and last.tool_calls == [] and last.num_turns == 1
    (hints,) = run(controller(tiny, Hinting, n_samples=1, max_turns=3), arithmetic_tasks(1))
    assert hints.finish_reason == "max_turns" and hints.num_turns == 3


def test_user_observations_go_through_the_chat_template(tiny):
    (traj,) = run(controller(tiny, Hinting, n_samples=1, max_turns=3), arithmetic_tasks(1))
    assert [m["role"] for m in traj.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert [m["content"] for m in traj.messages if m["role"] == "user"][1:] == ["hint 0", "hint 1"]
    forced_ids = [ids for mask, ids in segments(traj) if mask == 0]
    forced = [tiny.tokenizer.decode(ids) for ids in forced_ids]
    assert len(forced) == 2
    im_start = tiny.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert all(ids.count(im_start) == 2 for ids in forced_ids)  # special tokens, not their spelling
    for i, text in enumerate(forced):
        assert text.endswith(f"<|im_start|>user\nhint {i}<|im_end|>\n<|im_start|>assistant\n")
        closed = traj.response_ids[traj.response_ids.index(tiny.tokenizer.encode(text)[0]) - 1] in tiny.eos_token_ids
        assert text.startswith("\n<|im_start|>" if closed else "<|im_end|>\n")


def test_guess_number_example_runs(tiny):
    spec = importlib.util.spec_from_file_location("guess_number", ROOT / "examples" / "guess_number.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tasks = module.guess_tasks(2, seed=0)
    assert tasks == module.guess_tasks(2, seed=0) and all(1 <= int(t.ground_truth) <= 100 for t in tasks)
    env = module.GuessNumber(tasks[0])
    secret = int(tasks[0].ground_truth)
    assert asyncio.run(env.step(f"It is {secret}", False)).done
    assert asyncio.run(env.step(f"{secret - 1}", False)).observation == "Higher."
    trajs = run(controller(tiny, module.GuessNumber, n_samples=1, max_turns=2), tasks)
    assert all(t.error is None and t.num_turns >= 1 for t in trajs)


def test_retool_rollout_example_runs(capsys):
    spec = importlib.util.spec_from_file_location("retool_rollout", ROOT / "examples" / "retool_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--model", "tiny-llama", "--limit", "1", "--n", "2"])
    out = capsys.readouterr().out
    assert "task 0 sample 0: reward" in out and "task 0 sample 1: reward" in out and "mean reward" in out


def test_other_episodes_finish_while_one_waits_on_its_tool(tiny):
    """Tool calls run off the event loop: a quick episode completes during a slow tool call of another."""
    import time

    from srt_agent.agent import FunctionTool

    tool_ended: list[float] = []

    def slow_tool(code: str) -> str:
        time.sleep(1.5)
        tool_ended.append(time.perf_counter())
        return "done"

    finished: dict[int, float] = {}
    tasks = [
        Task([{"role": "user", "content": "slow"}], "1"),
        Task([{"role": "user", "content": "quick"}], "1", extra_info={"prefix": "no code here"}),
    ]
    ctrl = controller(
        tiny, PrefilledReTool, {"code_interpreter": FunctionTool("code_interpreter", slow_tool)}, n_samples=1
    )
    try:
        asyncio.run(ctrl.run(tasks, on_done=lambda t: finished.setdefault(t.task_index, time.perf_counter())))
    finally:
        ctrl.engine.close()
    assert len(tool_ended) == 1 and finished[1] < tool_ended[0] < finished[0]
