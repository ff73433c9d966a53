"""`retool_reward`: a TRL reward function scoring the final ``\\boxed{}`` answer, with ReTool's turn shaping.

TRL calls reward functions with the completions and every dataset column (here ``ground_truth``) plus
the extra fields of the rollout function (``num_turns`` from :class:`SRTRolloutFunc`).
"""

from __future__ import annotations

from typing import Any

from ...agent.rewards import final_answer_score


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes strings, or assistant messages for conversational prompts."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion)


def retool_reward(
    completions: list, ground_truth: list, num_turns: list[int] | None = None, turn_shaping: bool = True, **_: Any
) -> list[float]:
    """1.0 for a right final answer, -1.0 (shaped by tool use when `num_turns` is known) for a wrong one."""
    turns = num_turns if num_turns is not None else [None] * len(completions)
    return [
        float(final_answer_score(completion_text(c), truth, n, turn_shaping=turn_shaping)["score"])
        for c, truth, n in zip(completions, ground_truth, turns, strict=True)
    ]
