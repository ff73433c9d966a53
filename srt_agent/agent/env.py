"""The environment API: a task's opening messages, then per model turn an observation, a reward and `done`.

An :class:`Env` instance lives for one episode. Tools are registered by name (any callable taking a dict of
arguments); :meth:`Env.call_tool` runs one in a worker thread, so the engine keeps decoding other
trajectories meanwhile, and records every call. ``examples/guess_number.py`` is a complete environment
in a few lines; :class:`srt_agent.agent.retool.ReToolEnv` is the code-interpreter one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from ..config.tasks import Task

ObservationRole = Literal["inline", "user"]


@dataclass
class ToolResult:
    """What a tool returns: the text the model sees and how the call went."""

    text: str
    status: str = "ok"  # "ok", or a failure: "error", "timeout", "crash", "unknown_tool", "bad_arguments", "bad_result"
    truncated: bool = False
    fault: bool = False  # the tool itself failed (e.g. its sandbox), not the model: the rollout cannot be scored


@runtime_checkable
class Tool(Protocol):
    """A named tool; called with the parsed arguments of a tool call, possibly from a worker thread."""

    name: str
    schema: dict

    def __call__(self, arguments: dict) -> ToolResult: ...


@dataclass
class FunctionTool:
    """Wraps a plain function ``fn(**arguments) -> str`` as a :class:`Tool`."""

    name: str
    fn: Callable[..., str]
    schema: dict = field(default_factory=dict)

    def __call__(self, arguments: dict) -> ToolResult:
        return ToolResult(str(self.fn(**arguments)))


async def run_tool(tool: Tool, name: str, arguments: dict, timeout_s: float | None) -> ToolResult:
    """`tool(arguments)` in a thread of its own, never raising: a raise, a hang past `timeout_s` or a
    result that is not a ToolResult becomes a failed ToolResult.

    Each call gets its own thread rather than a shared pool's, so a hung tool holds only that thread
    (left to finish in the background) and never delays the calls of other trajectories.
    """
    loop = asyncio.get_running_loop()
    answer: asyncio.Future = loop.create_future()

    def settle(outcome: tuple[object, BaseException | None]) -> None:
        if not answer.done():
            answer.set_result(outcome)

    def work() -> None:
        try:
            outcome: tuple[object, BaseException | None] = (tool(arguments), None)
        except Exception as exc:  # noqa: BLE001 - reported as this call's result
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop closed while a hung call went on
            pass

    threading.Thread(target=work, name=f"tool-{name}", daemon=True).start()
    try:
        result, exc = await asyncio.wait_for(asyncio.shield(answer), timeout_s)
    except asyncio.TimeoutError:
        return ToolResult(f"Error: tool {name!r} did not answer within {timeout_s:g} s", "timeout")
    if exc is not None:
        return ToolResult(f"Error: tool {name!r} failed: {type(exc).__name__}: {exc}", "crash")
    if not isinstance(result, ToolResult) or not isinstance(result.text, str) or not isinstance(result.status, str):
        what = type(result).__name__ if not isinstance(result, ToolResult) else "a ToolResult with non-string fields"
        return ToolResult(f"Error: tool {name!r} returned {what}, not a ToolResult", "bad_result")
    return result


@dataclass
class ToolCallRecord:
    """One tool call of a trajectory, as recorded in its output."""

    name: str
    arguments: dict
    status: str
    output: str
    wall_s: float
    truncated: bool = False
    turn: int = 0
    fault: bool = False


@dataclass
class StepResult:
    """The environment's answer to one model turn.

    ``observation`` (when not None) is inserted as forced tokens before the next turn: ``role="inline"``
    appends it to the assistant's turn as raw text (ReTool's ``<interpreter>`` blocks), ``role="user"``
    closes the turn and adds it as a user message through the chat template.
    """

    observation: str | None = None
    reward: float = 0.0
    done: bool = False
    role: ObservationRole = "inline"


class Env(ABC):
    """One episode of an environment. Subclass it and implement :meth:`step`."""

    #: Stop strings for generation (kept in the output), e.g. the end of a tool-call block.
    stop: tuple[str, ...] = ()
    #: Seconds a tool call may take before it becomes a "timeout" record (None: no limit).
    tool_timeout_s: float | None = 120.0
    #: Whether the episode's final answer was right, once the env has scored it (None: not scored, or the
    #: env does not say). Evaluations count it as accuracy; None falls back to the ``\\boxed{}`` check.
    correct: bool | None = None

    def __init__(self, task: Task, tools: Mapping[str, Tool] | None = None):
        self.task = task
        self.tools: dict[str, Tool] = dict(tools or {})
        self.tool_calls: list[ToolCallRecord] = []
        self.turn = 0  # the current model turn (set by the controller)

    def initial_messages(self) -> list[dict]:
        """The chat messages that open the episode (the task's prompt by default)."""
        return [dict(m) for m in self.task.prompt]

    def response_prefix(self) -> str:
        """Text forced at the start of the model's response (``response_mask = 0``); the first turn's
        `response` passed to :meth:`step` starts with it. Empty by default."""
        return ""

    @abstractmethod
    async def step(self, response: str, final: bool) -> StepResult:
        """React to the model's turn `response`; `final` is True when no further turn is allowed."""

    async def call_tool(self, name: str, arguments: dict) -> ToolCallRecord:
        """Run a registered tool in a worker thread and record the call; failures become records, not raises.

        A tool that raises ("crash"), has not answered after `tool_timeout_s` ("timeout") or returns
        something other than a ToolResult ("bad_result") gives an error message as its output.
        """
        start = time.perf_counter()
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            result = ToolResult(f"Error: unknown tool {name!r} (available: {known})", "unknown_tool")
        else:
            result = await run_tool(tool, name, arguments, self.tool_timeout_s)
        record = ToolCallRecord(
            name=name,
            arguments=arguments,
            status=result.status,
            output=result.text,
            wall_s=time.perf_counter() - start,
            truncated=result.truncated,
            turn=self.turn,
            fault=result.fault,
        )
        self.tool_calls.append(record)
        return record

    def record_failed_call(self, name: str, status: str, message: str) -> ToolCallRecord:
        """Record a tool call that never ran (e.g. it could not be parsed)."""
        record = ToolCallRecord(name=name, arguments={}, status=status, output=message, wall_s=0.0, turn=self.turn)
        self.tool_calls.append(record)
        return record
