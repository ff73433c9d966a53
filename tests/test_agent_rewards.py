"""Answer checking (math-verify + exact fallback) and the ReTool turn penalty."""

from __future__ import annotations

import threading

import pytest

from srt_agent.agent.rewards import (
    answers_match,
    normalize_answer,
    retool_turn_shaped_reward,
    score_response,
)
from srt_agent.config import RewardConfig


@pytest.mark.parametrize(
    "pred, gold",
    [("42", "42"), ("42.0", "42"), ("1,000", "1000"), ("\\frac{1}{2}", "0.5"), ("2^{3}", "8"), ("\\text{7}", "7")],
)
def test_equal_answers(pred, gold):
    assert answers_match(pred, gold)


@pytest.mark.parametrize("pred, gold", [("41", "42"), ("\\frac{1}{3}", "0.5"), ("", "1")])
def test_different_answers(pred, gold):
    assert not answers_match(pred, gold)


def test_exact_fallback_without_math_verify():
    assert answers_match(" 1,234 ", "1234", use_math_verify=False)
    assert not answers_match("\\frac{1}{2}", "0.5", use_math_verify=False)
    assert normalize_answer("$ 12.000 $") == "12"


def test_math_verify_works_off_the_main_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(answers_match("\\frac{2}{4}", "0.5")))
    worker.start()
    worker.join()
    assert results == [True]


def test_score_response_with_turn_penalty_and_floor():
    config = RewardConfig(correct=1.0, incorrect=-1.0, turn_penalty=0.1, min_reward=-1.0)
    assert score_response("... \\boxed{12}", "12", tool_turns=2, config=config) == pytest.approx(0.8)
    assert score_response("... \\boxed{13}", "12", tool_turns=3, config=config) == -1.0
    assert score_response("no box, 12", "12", tool_turns=0) == 0.0


def test_reward_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="turn_penalt"):
        RewardConfig.model_validate({"turn_penalt": 0.1})


@pytest.mark.parametrize(
    "score, num_turns, expected",
    [
        (1.0, 2, 1.0),  # a right answer is never shaped
        (1.0, 12, 1.0),
        (-1.0, 2, -1.0),  # wrong, no tool call: the full penalty
        (-1.0, 4, -0.9),  # one tool call earns 0.1 back
        (-1.0, 8, -0.7),
        (-1.0, 10, -0.6),  # capped at -0.6 ...
        (-1.0, 40, -0.6),  # ... however many calls
    ],
)
def test_retool_turn_shaping_matches_verls_recipe(score, num_turns, expected):
    # verl recipe/retool: if score < 0: score = min(-0.6, score + (num_turns - 2) / 2 * 0.1)
    assert retool_turn_shaped_reward(score, num_turns) == pytest.approx(expected)


def test_turn_shaping_in_the_env_reward_follows_verls_retool_recipe():
    from srt_agent.agent.rewards import score_response
    from srt_agent.config import RewardConfig

    shaped = RewardConfig(incorrect=-1.0, turn_shaping=True)
    assert score_response("\\boxed{7}", "7", 3, shaped) == 1.0
    assert score_response("\\boxed{8}", "7", 0, shaped) == -1.0
    assert score_response("\\boxed{8}", "7", 2, shaped) == pytest.approx(-0.8)
    assert score_response("\\boxed{8}", "7", 9, shaped) == pytest.approx(-0.6)
