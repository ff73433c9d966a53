"""The cost model: a linear forward-time fit and the throughput-optimal choice of draft nodes."""

from __future__ import annotations

import itertools
import random

import pytest

from srt_agent.drafting import Draft
from srt_agent.drafting.choice.cost_model import (
    ForwardCostModel,
    best_prefix,
    choose_drafts,
    choose_nodes,
    joint_rate_bound,
)


def rate(drafts: list[Draft], kept: list[list[int]], base: int, model: ForwardCostModel) -> float:
    expected = len(drafts) + sum(d.scores[i] for d, k in zip(drafts, kept) for i in k)
    return expected / model.predict(base + sum(len(k) for k in kept))


def closed_subsets(draft: Draft):
    """Every subset of nodes that contains each member's parent."""
    for mask in itertools.product([0, 1], repeat=len(draft)):
        nodes = [i for i, m in enumerate(mask) if m]
        if all(draft.parents[i] < 0 or mask[draft.parents[i]] for i in nodes):
            yield nodes


def random_draft(rng: random.Random, size: int) -> Draft:
    parents, scores = [], []
    for i in range(size):
        parent = rng.randint(-1, i - 1)
        top = 1.0 if parent < 0 else scores[parent]
        parents.append(parent)
        scores.append(top * rng.random())
    return Draft([rng.randrange(100) for _ in range(size)], parents, scores)


def test_fit_recovers_a_line_and_tracks_changes():
    model = ForwardCostModel()
    model.calibrate([(1, 0.06), (8, 0.08), (32, 0.15)])
    assert model.predict(1) == pytest.approx(0.0593, abs=2e-3)
    assert model.per_token_s == pytest.approx(0.0029, rel=0.05)
    for _ in range(300):  # the machine got twice as slow
        for n in (1, 16, 40):
            model.observe(n, 2 * (0.057 + 0.0029 * n))
    assert model.predict(16) == pytest.approx(2 * (0.057 + 0.0029 * 16), rel=0.05)


def test_one_sequence_verifies_a_long_chain_a_full_batch_verifies_little():
    model = ForwardCostModel()
    model.calibrate([(1, 0.060), (16, 0.117), (512, 1.37)])  # SmolLM2 f32 on 2 CPU cores
    chain = Draft(list(range(16)), list(range(-1, 15)), [0.9**i for i in range(1, 17)])
    (solo,) = choose_drafts([chain], 1, model)
    assert len(solo) >= 10
    weak = Draft(list(range(16)), list(range(-1, 15)), [0.5**i for i in range(1, 17)])
    batch = choose_drafts([weak] * 32, 32, model)
    assert sum(len(d) for d in batch) <= 32 and all(len(d) <= 1 for d in batch)


@pytest.mark.parametrize("seed", range(20))
def test_choice_is_optimal_and_a_tree(seed):
    """Against brute force over all parent-closed subsets of small random trees."""
    rng = random.Random(seed)
    drafts = [random_draft(rng, rng.randint(0, 5)) for _ in range(rng.randint(1, 3))]
    model = ForwardCostModel()
    model.calibrate([(1, rng.uniform(0.01, 0.1)), (64, rng.uniform(0.1, 1.0))])
    base = len(drafts) + rng.randint(0, 3)
    chosen = choose_drafts(drafts, base, model)
    for c in chosen:  # each chosen sub-draft is a tree: parents precede children
        assert all(-1 <= p < i for i, p in enumerate(c.parents))
    best = max(
        rate(drafts, list(combo), base, model)
        for combo in itertools.product(*(list(closed_subsets(d)) for d in drafts))
    )
    got = (len(drafts) + sum(sum(c.scores) for c in chosen)) / model.predict(base + sum(len(c) for c in chosen))
    assert got == pytest.approx(best, rel=1e-9)


def test_measured_shapes_override_the_line():
    """A CPU whose kernels jump in cost at 4 rows: the choice stops before the jump unless it pays."""
    model = ForwardCostModel()
    model.calibrate([(1, 0.030), (2, 0.031), (3, 0.032), (4, 0.045), (5, 0.046), (8, 0.050)])
    assert model.predict(4, sequences=1) == pytest.approx(0.045) and model.predict(4) < 0.045
    weak = Draft([1, 2, 3, 4], [-1, 0, 1, 2], [0.4, 0.2, 0.1, 0.05])
    (chosen,) = choose_drafts([weak], 1, model)
    assert len(chosen) == 2  # 1.6 tokens in 32 ms beats 1.75 in 45 ms
    strong = Draft(list(range(7)), list(range(-1, 6)), [0.95**i for i in range(1, 8)])
    (chosen,) = choose_drafts([strong], 1, model)
    assert len(chosen) == 7  # the jump pays for itself
    for _ in range(20):  # the machine now runs 3-row steps slowly
        model.observe(3, 0.060, sequences=1)
    assert model.predict(3, sequences=1) == pytest.approx(0.060, rel=0.01)
    assert model.predict(3, sequences=2) == pytest.approx(model.predict(3))  # another shape: the line


def test_a_marginal_gain_is_not_worth_the_risk():
    model = ForwardCostModel()
    model.calibrate([(32, 0.120), (64, 0.152)])  # 1 ms per extra token on a batch of 32
    drafts = [Draft([1], [-1], [0.3])] * 32  # each node barely pays for itself
    assert sum(len(d) for d in choose_drafts(drafts, 32, model)) == 32
    assert sum(len(d) for d in choose_drafts(drafts, 32, model, min_gain=0.1)) == 0
    strong = [Draft([1], [-1], [0.9])] * 32
    assert sum(len(d) for d in choose_drafts(strong, 32, model, min_gain=0.1)) == 32


def test_the_fit_separates_tokens_from_sequences():
    """Steps of 1 and of 32 sequences: one line in tokens alone would misprice a full batch's drafts."""
    model = ForwardCostModel()
    truth = lambda tokens, sequences: 0.027 + 0.002 * tokens + 0.0004 * (sequences - 1)  # noqa: E731
    for _ in range(50):
        for sequences, tokens in ((1, 1), (1, 3), (1, 9), (32, 32), (32, 40), (32, 64)):
            model.observe(tokens, truth(tokens, sequences), sequences)
    assert model.per_token_s == pytest.approx(0.002, rel=0.01)
    assert model.per_sequence_s == pytest.approx(0.0004, rel=0.05)
    assert model.predict(50, sequences=32) == pytest.approx(truth(50, 32), rel=0.01)
    assert model.predict(5) == pytest.approx(truth(5, 1), rel=0.01)


def test_makespan_mode_slows_a_step_only_when_every_sequence_gains():
    model = ForwardCostModel()
    model.calibrate([(1, 0.030), (64, 0.150)])
    strong = Draft(list(range(4)), [-1, 0, 1, 2], [0.9, 0.8, 0.7, 0.6])
    assert choose_drafts([strong], 1, model, makespan=True) == choose_drafts([strong], 1, model)
    mixed = [strong] * 7 + [Draft()]
    assert sum(len(d) for d in choose_drafts(mixed, 8, model)) > 0  # throughput: the seven gain
    assert all(len(d) == 0 for d in choose_drafts(mixed, 8, model, makespan=True))
    weak = Draft([9], [-1], [0.05])
    chosen = choose_drafts([strong, weak], 2, model, makespan=True)
    assert all(len(d) == 0 for d in chosen)  # the weak one bounds the gain: not worth slowing both


def test_choice_calibrates_scores_only_when_a_choice_remains():
    model = ForwardCostModel()
    model.calibrate([(1, 0.030), (64, 0.150)])
    strong = Draft(list(range(4)), [-1, 0, 1, 2], [0.9, 0.8, 0.7, 0.6])
    doubted = choose_nodes([strong], 1, model, calibrate=lambda d: Draft(d.token_ids, d.parents, [0.01] * len(d)))
    assert doubted == [[]] and choose_nodes([strong], 1, model) == [[0, 1, 2, 3]]

    def never(draft: Draft) -> Draft:
        raise AssertionError("calibrated a draft the makespan rule had already ruled out")

    assert choose_nodes([strong, Draft()], 2, model, makespan=True, calibrate=never) == [[], []]


def test_decoding_only_steps_give_a_fit_without_negative_terms():
    """Tokens equal sequences in decoding-only steps: the fit stays non-negative and on the data."""
    model = ForwardCostModel()
    model.calibrate([(n, 0.030 + 0.002 * (n - 1), 1) for n in (1, 4, 16)] + [(16, 0.070, 16), (32, 0.100, 16)])
    for _ in range(200):
        for s in (1, 3, 8, 16):
            model.observe(s, 0.030 + 0.0026 * (s - 1), s)
    assert min(model.fixed_s, model.per_token_s, model.per_sequence_s) >= 0
    assert model.fixed_s == pytest.approx(0.030, rel=0.2)
    for s in (2, 5, 12):  # unmeasured decoding shapes come out of the fit
        assert model.predict(s, s) == pytest.approx(0.030 + 0.0026 * (s - 1), rel=0.1)


def chain(rng: random.Random, depth: int, first: float) -> Draft:
    scores, score = [], 1.0
    for d in range(depth):
        score *= first if d == 0 else rng.uniform(0.5, 1.0)
        scores.append(score)
    return Draft(list(range(depth)), list(range(-1, depth - 1)), scores, 4)


@pytest.mark.parametrize("seed", range(40))
def test_the_joint_rate_bound_never_rules_out_a_choice_the_cost_model_would_make(seed):
    """The proposer stops drafting a batch once `joint_rate_bound` says no choice could pay: whenever the choice
    (makespan, joint) verifies anything, the bound for those drafts lies above the rate of verifying nothing, and
    a bound at or below it means an empty choice."""
    rng = random.Random(seed)
    model = ForwardCostModel(fixed_s=rng.uniform(0.001, 0.05), per_token_s=rng.uniform(1e-5, 3e-3))
    model.per_sequence_s = rng.uniform(0.0, 2e-3)
    if seed % 2:
        model.calibrate([(t, model.predict(t) * rng.uniform(0.7, 1.3)) for t in (2, 4, 8, 16, 32)])
    rows, depth = rng.randint(1, 12), rng.randint(1, 8)
    drafts = [chain(rng, depth, rng.uniform(0.6, 1.0) if seed % 3 else 1.0) for _ in range(rows)]
    reach = [1.0] * depth
    for d in drafts:
        reach = [r * s for r, s in zip(reach, d.scores)]
    bound = joint_rate_bound(model, rows, reach)
    verify_none = 1.0 / model.predict(rows, rows)
    chosen = choose_nodes(drafts, rows, model, makespan=True, joint=True)
    if any(chosen):
        assert bound > verify_none
        best = best_prefix(drafts, rows, model, makespan=True, joint=True)
        assert best.rate <= bound * (1 + 1e-9)
    if bound <= verify_none:
        assert not any(chosen)
