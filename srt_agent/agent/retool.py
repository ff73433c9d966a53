"""ReTool's environment: the model writes code blocks, the interpreter answers, ``\\boxed{}`` is scored."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import RewardConfig
from ..config.tasks import Task
from .env import Env, StepResult, Tool
from .parsing import CODE_TOOL_NAME, RETOOL_STOP, ParseError, parse_tool_call
from .rewards import answer_score, reward_of


def interpreter_block(text: str) -> str:
    """How a tool's output is shown to the model (forced tokens, ``response_mask = 0``)."""
    return f"\n<interpreter>\n{text.rstrip()}\n</interpreter>\n"


class ReToolEnv(Env):
    """Code blocks (ReTool ``<code>`` or hermes ``<tool_call>``) run as tool calls; a turn without one ends
    the episode and is scored on its last ``\\boxed{}``. Malformed calls are recorded and answered with an
    error so the model can retry; an unterminated block ends the episode (the model stopped mid-block)."""

    stop = tuple(RETOOL_STOP)

    def __init__(self, task: Task, tools: Mapping[str, Tool] | None = None, reward: RewardConfig | dict | None = None):
        super().__init__(task, tools)
        self.reward_config = RewardConfig.model_validate(reward or {})
        self.model_text = ""

    def score(self) -> float:
        """The episode's reward (``reward:`` section); sets :attr:`correct`."""
        tool_turns = len({call.turn for call in self.tool_calls})
        score = answer_score(self.model_text, self.task.ground_truth, self.reward_config, self.task)
        self.correct = score >= 1.0
        return reward_of(score, tool_turns, self.reward_config)

    async def step(self, response: str, final: bool) -> StepResult:
        self.model_text += response
        call = parse_tool_call(response)
        if isinstance(call, ParseError) and call.reason.startswith("unterminated"):
            self.record_failed_call(CODE_TOOL_NAME if call.syntax == "retool" else "", "parse_error", call.reason)
            call = None
        if call is None or final:
            return StepResult(reward=self.score(), done=True)
        if isinstance(call, ParseError):
            record = self.record_failed_call("", "parse_error", call.reason)
        else:
            record = await self.call_tool(call.name, call.arguments)
        return StepResult(observation=interpreter_block(record.output))
