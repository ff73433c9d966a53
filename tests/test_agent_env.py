"""The Env API (tool registry, worker-thread calls, failure records) and ReTool's environment on the real
code interpreter (bubblewrap sandbox)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from srt_agent.agent.env import Env, FunctionTool, StepResult, ToolResult
from srt_agent.agent.retool import ReToolEnv, interpreter_block
from srt_agent.agent.toolconfig import load_tools
from srt_agent.config import InterpreterConfig, RewardConfig
from srt_agent.config.tasks import Task
from srt_agent.sources.arithmetic import arithmetic_tasks
from srt_agent.tools.local import bwrap_path


@pytest.fixture(scope="module")
def interpreter():
    """The real code interpreter of tools/code_interpreter.yaml (bubblewrap sandbox)."""
    if bwrap_path() is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    path = Path(__file__).resolve().parents[1] / "tools" / "code_interpreter.yaml"
    return load_tools(path, InterpreterConfig(max_output_chars=256, timeout_s=10))["code_interpreter"]


class Echo(Env):
    async def step(self, response: str, final: bool) -> StepResult:
        record = await self.call_tool("echo", {"text": response})
        return StepResult(observation=record.output, done=final)


def task(answer: str = "4") -> Task:
    return Task([{"role": "user", "content": "2+2?"}], answer)


def test_tool_runs_in_a_worker_thread_and_is_recorded():
    threads = []

    def echo(text: str) -> str:
        threads.append(threading.get_ident())
        return text.upper()

    env = Echo(task(), {"echo": FunctionTool("echo", echo)})
    env.turn = 3
    result = asyncio.run(env.step("hi", final=False))
    assert result.observation == "HI" and not result.done
    assert threads and threads[0] != threading.get_ident()
    (call,) = env.tool_calls
    assert (call.name, call.arguments, call.status, call.output, call.turn) == ("echo", {"text": "hi"}, "ok", "HI", 3)
    assert call.wall_s >= 0


def test_crashing_and_unknown_tools_become_records():
    def boom(text: str) -> str:
        raise RuntimeError("disk on fire")

    env = Echo(task(), {"echo": FunctionTool("echo", boom)})
    asyncio.run(env.step("x", final=False))
    assert env.tool_calls[0].status == "crash" and "RuntimeError: disk on fire" in env.tool_calls[0].output
    env = Echo(task(), {"other": FunctionTool("other", str)})
    asyncio.run(env.step("x", final=False))
    assert env.tool_calls[0].status == "unknown_tool" and "available: other" in env.tool_calls[0].output


def test_tool_result_status_passes_through():
    class Failing:
        name, schema = "echo", {}

        def __call__(self, arguments):
            return ToolResult("Timed out", "timeout", truncated=True)

    env = Echo(task(), {"echo": Failing()})
    asyncio.run(env.step("x", final=False))
    assert (env.tool_calls[0].status, env.tool_calls[0].truncated) == ("timeout", True)


def test_retool_env_runs_code_then_scores_the_answer(interpreter):
    t = arithmetic_tasks(1, seed=0)[0]
    env = ReToolEnv(t, {"code_interpreter": interpreter})
    expr = t.prompt[-1]["content"].removeprefix("Compute ").rstrip(".")
    result = asyncio.run(env.step(f"Let me compute.\n<code>\n```python\nprint({expr})\n```\n</code>", final=False))
    assert result.observation == interpreter_block(t.ground_truth) and not result.done
    assert env.tool_calls[0].arguments == {"code": f"print({expr})"}
    result = asyncio.run(env.step(f"So the answer is \\boxed{{{t.ground_truth}}}.", final=False))
    assert result.done and result.reward == 1.0


def test_retool_env_turn_penalty_and_wrong_answer(interpreter):
    env = ReToolEnv(task("4"), {"code_interpreter": interpreter}, reward={"turn_penalty": 0.25, "incorrect": -1.0})
    asyncio.run(env.step("<code>\n```python\nprint(2+2)\n```\n</code>", final=False))
    assert asyncio.run(env.step("\\boxed{4}", final=False)).reward == pytest.approx(0.75)
    env = ReToolEnv(task("4"), {}, reward=RewardConfig(incorrect=-1.0))
    assert asyncio.run(env.step("\\boxed{5}", final=False)).reward == -1.0


def test_retool_env_reports_errors_to_the_model_and_goes_on(interpreter):
    env = ReToolEnv(task(), {"code_interpreter": interpreter})
    bad_json = asyncio.run(env.step("<tool_call>{nope}</tool_call>", final=False))
    assert "not valid JSON" in bad_json.observation and not bad_json.done
    unknown = asyncio.run(env.step('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', final=False))
    assert "unknown tool 'shell'" in unknown.observation
    crash = asyncio.run(env.step("<code>\n```python\n1/0\n```\n</code>", final=False))
    assert "ZeroDivisionError: division by zero" in crash.observation
    assert [c.status for c in env.tool_calls] == ["parse_error", "unknown_tool", "error"]


def test_retool_env_unterminated_block_ends_the_episode(interpreter):
    env = ReToolEnv(task(), {"code_interpreter": interpreter})
    result = asyncio.run(env.step("<code>\n```python\nprint(1)", final=False))
    assert result.done and result.reward == 0.0
    assert env.tool_calls[0].status == "parse_error" and "unterminated" in env.tool_calls[0].output


def test_retool_env_final_turn_does_not_call_tools(interpreter):
    env = ReToolEnv(task(), {"code_interpreter": interpreter})
    result = asyncio.run(env.step("\\boxed{4} <code>\n```python\nprint(1)\n```\n</code>", final=True))
    assert result.done and result.reward == 1.0 and env.tool_calls == []
