"""`compute_score`: verl's reward-function signature over srt-agent's answer checking.

Select it with ``reward.custom_reward_function.path=pkg://srt_agent.integrations.verl.reward``,
``reward.custom_reward_function.name=compute_score``; options go in ``reward_kwargs``. verl's reward loop
passes ``extra_info["num_turns"]`` (the agent loop's turn count: prompt + model turns + observations),
which ReTool's turn-aware shaping uses.
"""

from __future__ import annotations

from typing import Any

from ...agent.parsing import extract_boxed
from ...agent.rewards import answers_match, retool_turn_shaped_reward


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

    Returns verl's dict form: ``score`` (the reward), ``acc`` (1.0 right, 0.0 wrong) and ``pred`` (the boxed
    answer, "" when none). With `turn_shaping` a wrong answer's score follows ReTool's recipe:
    ``min(-0.6, score + (num_turns - 2) / 2 * 0.1)`` when ``extra_info["num_turns"]`` is known. Works for
    any `data_source` whose ground truth is a final answer (srt-agent's arithmetic tasks, DAPO/AIME math).
    """
    pred = extract_boxed(solution_str or "")
    right = pred is not None and answers_match(pred, str(ground_truth), use_math_verify)
    score = correct if right else incorrect
    num_turns = (extra_info or {}).get("num_turns")
    if turn_shaping and num_turns is not None:
        score = retool_turn_shaped_reward(score, int(num_turns))
    return {"score": float(score), "acc": 1.0 if right else 0.0, "pred": pred or ""}
