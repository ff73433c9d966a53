"""Score calibration: observed acceptance per conditional-score bin, path products, tree order kept."""

from __future__ import annotations

import random

import pytest

from srt_agent.drafting import Draft
from srt_agent.drafting.choice.acceptance import AcceptanceModel, conditionals


def chain(scores: list[float]) -> Draft:
    return Draft(list(range(len(scores))), list(range(-1, len(scores) - 1)), scores)


def test_conditionals_divide_by_the_parent():
    draft = Draft([1, 2, 3, 4], [-1, 0, 0, -1], [0.8, 0.4, 0.2, 0.1])
    assert conditionals(draft) == pytest.approx([0.8, 0.5, 0.25, 0.1])
    assert conditionals(Draft([1, 2], [-1, 0], [0.0, 0.0])) == [0.0, 0.0]


def test_without_observations_the_raw_scores_stand():
    draft = Draft([1, 2, 3], [-1, 0, 0], [0.9, 0.45, 0.3])
    assert AcceptanceModel().calibrate(draft).scores == pytest.approx(draft.scores)


def test_overconfident_scores_are_pulled_to_the_observed_rate():
    """A drafter that says 1.0 for every node, right 30% of the time, given a right parent."""
    model, rng = AcceptanceModel(decay=1.0), random.Random(0)
    for _ in range(2000):
        draft = chain([1.0] * 4)
        accepted = []
        for node in range(4):
            if rng.random() >= 0.3:
                break
            accepted.append(node)
        model.observe([draft], [accepted])
    calibrated = model.calibrate(chain([1.0] * 3)).scores
    assert calibrated == pytest.approx([0.3, 0.09, 0.027], rel=0.1)


def test_only_nodes_whose_parent_was_accepted_are_counted():
    model = AcceptanceModel(decay=1.0)
    model.observe([chain([0.95, 0.95 * 0.55])], [[]])  # the child was never tested
    assert model.tested[9] == 1 and model.accepted[9] == 0 and sum(model.tested) == 1
    model.observe([chain([0.95, 0.95 * 0.55])], [[0, 1]])
    assert model.tested[9] == 2 and model.accepted[9] == 1 and (model.tested[5], model.accepted[5]) == (1, 1)


@pytest.mark.parametrize("seed", range(10))
def test_a_child_never_outscores_its_parent(seed):
    rng = random.Random(seed)
    model = AcceptanceModel()
    for _ in range(50):
        size = rng.randint(1, 8)
        parents = [rng.randint(-1, i - 1) for i in range(size)]
        scores: list[float] = []
        for p in parents:
            scores.append((scores[p] if p >= 0 else 1.0) * rng.random())
        draft = Draft(list(range(size)), parents, scores)
        model.observe([draft], [[i for i in range(size) if rng.random() < 0.5]])
        calibrated = model.calibrate(draft).scores
        assert all(0.0 <= c <= 1.0 for c in calibrated)
        assert all(p < 0 or calibrated[i] <= calibrated[p] + 1e-12 for i, p in enumerate(parents))


def test_long_matches_and_short_matches_are_calibrated_apart():
    """The same raw score means more after a long context match: each match bucket learns its own rate."""
    model, rng = AcceptanceModel(decay=1.0), random.Random(1)
    for _ in range(3000):
        for match_len, rate in ((1, 0.1), (12, 0.8)):
            draft = Draft([7], [-1], [1.0], match_len)
            model.observe([draft], [[0] if rng.random() < rate else []])
    assert model.calibrate(Draft([7], [-1], [1.0], 1)).scores[0] == pytest.approx(0.1, abs=0.03)
    assert model.calibrate(Draft([7], [-1], [1.0], 12)).scores[0] == pytest.approx(0.8, abs=0.03)


def test_steps_without_drafts_leave_the_calibration_alone():
    model = AcceptanceModel()
    model.observe([chain([1.0])], [[]])
    before = list(model.tested)
    for _ in range(1000):
        model.observe([Draft(), Draft()], [[], []])
    assert model.tested == before


def test_an_overconfident_drafter_is_discounted_in_cells_it_has_not_tried():
    model = AcceptanceModel(decay=1.0)
    for _ in range(200):  # always 1.0, never right, after short matches
        model.observe([Draft([1], [-1], [1.0], 1)], [[]])
    unseen = model.calibrate(Draft([1], [-1], [1.0], 12)).scores[0]  # a long match: another cell
    assert unseen < 0.05
