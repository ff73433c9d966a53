"""`compute_score`: verl's reward-function signature over srt-agent's answer checking.

Select it with ``reward.custom_reward_function.path=pkg://srt_agent.integrations.verl.reward``,
``reward.custom_reward_function.name=compute_score``; options go in ``reward_kwargs``. verl's reward loop
passes ``extra_info["num_turns"]`` (the agent loop's turn count: prompt + model turns + observations),
which ReTool's turn-aware shaping uses.
"""

from __future__ import annotations

from typing import Any

from ...agent.rewards import final_answer_score


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    correct: float = 1.0,
    incorrect: float = -1.0,
    turn_shaping: bool = True,
    use_math_verify: bool = True,
    **_: Any,
) -> dict[str, Any]:
    """Score the last ``\\boxed{}`` of `solution_str` against `ground_truth` (math-verify, then exact match).

    Returns ``score``, ``acc`` and ``pred``. With `turn_shaping` a wrong answer's score follows ReTool's
    recipe, ``min(-0.6, score + (num_turns - 2) / 2 * 0.1)``, when ``extra_info["num_turns"]`` is known.
    Works for any `data_source` whose ground truth is a final answer (srt-agent's arithmetic tasks,
    DAPO/AIME-style math).
    """
    return final_answer_score(
        solution_str,
        ground_truth,
        (extra_info or {}).get("num_turns"),
        correct=correct,
        incorrect=incorrect,
        turn_shaping=turn_shaping,
        use_math_verify=use_math_verify,
    )
