"""The rows, the task (its reward) and the taskset."""

import re

import verifiers.v1 as vf
from verifiers.v1.types import content_text

from vf_calculator.tool import CalculatorToolset

SYSTEM_PROMPT = (
    "You are a careful calculator user. Use the `calculate` tool for arithmetic, "
    "then give the final answer as \\boxed{number}."
)

# (question, answer): shipped with the module, nothing is downloaded
ROWS = [
    ("What is 37 * 12 + 5?", "449"),
    ("What is (81 - 19) * 3?", "186"),
    ("What is 1250 / 25 - 7?", "43"),
    ("What is 14 * 14 - 96?", "100"),
    ("What is 7 * (8 + 9) - 20?", "99"),
    ("What is 999 - 333 * 2?", "333"),
    ("What is (45 + 55) * (12 - 4)?", "800"),
    ("What is 3 * 3 * 3 * 3?", "81"),
]


class CalculatorData(vf.TaskData):
    answer: str


class CalculatorTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


def final_answer(text: str) -> str | None:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


class CalculatorTask(vf.Task[CalculatorData, vf.State, CalculatorTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalculatorTaskConfig) -> list[vf.Toolset]:
        return [CalculatorToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the last assistant message's \\boxed{} answer is the row's answer."""
        replies = [m for m in trace.messages if m.role == "assistant"]
        text = content_text(replies[-1].content) if replies else ""
        return 1.0 if final_answer(text or "") == self.data.answer else 0.0


class CalculatorConfig(vf.TasksetConfig):
    num_tasks: int = len(ROWS)
    task: CalculatorTaskConfig = CalculatorTaskConfig()


class CalculatorTaskset(vf.Taskset[CalculatorTask, CalculatorConfig]):
    def load(self) -> list[CalculatorTask]:
        return [
            CalculatorTask(
                CalculatorData(prompt=q, answer=a, system_prompt=SYSTEM_PROMPT, name=f"calc-{i}"),
                self.config.task,
            )
            for i, (q, a) in enumerate(ROWS[: self.config.num_tasks])
        ]
