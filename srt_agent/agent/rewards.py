"""Rule rewards: ``\\boxed{}`` answers checked with math-verify (exact match as fallback) or by the scorer of
the source that made the task (reasoning-gym's, found in the source registry), ReTool turn penalty."""

from __future__ import annotations

import re
import threading

from ..config import RewardConfig
from ..config.source_registry import SOURCES
from ..config.tasks import Task
from .parsing import extract_boxed

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(answer: str) -> str:
    """Canonical text for exact matching: no spaces, ``$``, ``\\text{}``, thousands commas or trailing ``.0``."""
    s = answer.strip().strip("$").strip()
    s = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[,;! ]", "", s)
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s.lower()


def _math_verify_equal(prediction: str, ground_truth: str) -> bool | None:
    """math-verify's verdict, or None when it cannot parse one side."""
    from math_verify import parse, verify

    # math-verify's timeouts use signals, which only work on the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${ground_truth}$", parsing_timeout=timeout)
    pred = parse(f"${prediction}$", parsing_timeout=timeout)
    if not gold or not pred:
        return None
    return bool(verify(gold, pred, timeout_seconds=timeout))


def answers_match(prediction: str, ground_truth: str, use_math_verify: bool = True) -> bool:
    """Whether a predicted answer equals the ground truth (math-verify first, then exact normalized match)."""
    if normalize_answer(prediction) == normalize_answer(ground_truth):
        return True
    if use_math_verify:
        return bool(_math_verify_equal(prediction, ground_truth))
    return False


def final_answer(response: str) -> str | None:
    """The model's final answer: its last ``\\boxed{}``, else its last ``<answer>…</answer>``; None when neither."""
    boxed = extract_boxed(response)
    if boxed is not None:
        return boxed
    tags = _ANSWER_TAG.findall(response)
    return tags[-1].strip() if tags else None


def reward_kind(task: Task | None, config: RewardConfig) -> str:
    """The scorer ``reward.kind`` resolves to for `task`: ``boxed`` stays; ``auto`` and ``reasoning_gym`` score
    a reasoning-gym task with its family's scorer and any other task (the cold start's arithmetic traces)
    by ``\\boxed{}``."""
    if config.kind == "boxed":
        return "boxed"
    return "reasoning_gym" if task is not None and "reasoning_gym" in task.extra_info else "boxed"


def answer_score(response: str, ground_truth: str, config: RewardConfig, task: Task | None = None) -> float:
    """How right a whole response's final answer is, in [0, 1] (1: right), by the scorer ``config.kind`` picks."""
    kind = reward_kind(task, config)
    if task is not None and kind != "boxed":  # a source that scores its own tasks (reasoning-gym)
        answer = final_answer(response)
        return min(max(SOURCES[kind].score_answer(answer, task), 0.0), 1.0) if answer is not None else 0.0
    answer = extract_boxed(response)
    return float(answer is not None and answers_match(answer, str(ground_truth), config.use_math_verify))


def score_response(
    response: str, ground_truth: str, tool_turns: int, config: RewardConfig | None = None, task: Task | None = None
) -> float:
    """The reward of a whole response: its final answer scored against `task` (the ground truth), minus the
    turn penalty; a partial score (reasoning-gym) gives ``incorrect + (correct - incorrect) * score``."""
    config = config or RewardConfig()
    return reward_of(answer_score(response, ground_truth, config, task), tool_turns, config)


def reward_of(score: float, tool_turns: int, config: RewardConfig) -> float:
    """The reward of an answer scored `score` in [0, 1] after `tool_turns` tool turns (penalty, shaping, floor)."""
    base = config.correct if score >= 1 else config.incorrect + (config.correct - config.incorrect) * max(score, 0.0)
    reward = base - config.turn_penalty * tool_turns
    if config.turn_shaping:
        reward = retool_turn_shaped_reward(reward, 2 + 2 * tool_turns)  # verl's count: prompt, answer, 2 per call
    if config.min_reward is not None:
        reward = max(reward, config.min_reward)
    return reward


def retool_turn_shaped_reward(score: float, num_turns: int, floor: float = -0.6, per_tool_call: float = 0.1) -> float:
    """verl's ReTool recipe: a wrong answer (``score < 0``) earns ``per_tool_call`` back for every tool call
    (``(num_turns - 2) / 2`` of them, with ``num_turns`` counted as verl does: prompt + model turns +
    observations), but never more than `floor`; a right answer's score stands.

    ``min(floor, score + (num_turns - 2) / 2 * per_tool_call)`` for ``score < 0``, else ``score``.
    """
    if score >= 0:
        return score
    return min(floor, score + (num_turns - 2) / 2 * per_tool_call)


def final_answer_score(
    solution: str,
    ground_truth: object,
    num_turns: int | None = None,
    correct: float = 1.0,
    incorrect: float = -1.0,
    turn_shaping: bool = True,
    use_math_verify: bool = True,
) -> dict[str, float | str]:
    """Score a whole solution text by its last ``\\boxed{}``, in verl's dict form: ``score`` (the reward),
    ``acc`` (1.0 right, 0.0 wrong), ``pred`` (the boxed answer, "" when none). With `turn_shaping` and a
    known `num_turns` a wrong answer is shaped by :func:`retool_turn_shaped_reward`."""
    pred = extract_boxed(solution or "")
    right = pred is not None and answers_match(pred, str(ground_truth), use_math_verify)
    score = correct if right else incorrect
    if turn_shaping and num_turns is not None:
        score = retool_turn_shaped_reward(score, int(num_turns))
    return {"score": float(score), "acc": 1.0 if right else 0.0, "pred": pred or ""}
