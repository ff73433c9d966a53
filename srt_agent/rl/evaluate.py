"""How a policy uses the interpreter: tool-call rate, clean-run rate and accuracy over trajectories."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..agent.parsing import CODE_TOOL_NAME
from ..agent.rewards import RewardConfig, score_response
from ..agent.trajectory import Trajectory


@dataclass
class ToolUseReport:
    """Shares of trajectories that call the code tool, whose code all ran cleanly, that answered right."""

    trajectories: int
    tool_call_rate: float
    code_ok_rate: float
    accuracy: float
    mean_tool_calls: float
    mean_response_tokens: float

    def as_dict(self) -> dict:
        return asdict(self)


def _assistant_text(traj: Trajectory) -> str:
    return "".join(m.get("content", "") for m in traj.messages[len(traj.prompt) :] if m.get("role") == "assistant")


def is_correct(traj: Trajectory) -> bool:
    """Whether the trajectory's last ``\\boxed{}`` equals its ground truth (no shaping, no penalties)."""
    return score_response(_assistant_text(traj), traj.ground_truth, 0, RewardConfig()) == RewardConfig().correct


def tool_use_report(trajectories: Sequence[Trajectory]) -> ToolUseReport:
    """The report over `trajectories` (a call counts when the code tool actually ran)."""
    n = len(trajectories)
    if n == 0:
        return ToolUseReport(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    ran = [[c for c in t.tool_calls if c.name == CODE_TOOL_NAME and c.status != "parse_error"] for t in trajectories]
    return ToolUseReport(
        trajectories=n,
        tool_call_rate=sum(1 for calls in ran if calls) / n,
        code_ok_rate=sum(1 for calls in ran if calls and all(c.status == "ok" for c in calls)) / n,
        accuracy=sum(1 for t in trajectories if is_correct(t)) / n,
        mean_tool_calls=sum(len(calls) for calls in ran) / n,
        mean_response_tokens=sum(len(t.response_ids) for t in trajectories) / n,
    )
