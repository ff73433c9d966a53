"""The lossless sampler: exact target distribution through draft trees, filters, log-probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from srt_agent.cache import Draft
from srt_agent.engine import Engine, SamplingParams
from srt_agent.engine.sampler import RowSampling, filter_logits, position_key, sample_rows

CONTEXT = [3, 1, 4, 1, 5, 9, 2, 6]


pytestmark = pytest.mark.usefixtures("one_thread")


def chi_square_threshold(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (z = 3.09), Wilson–Hilferty approximation."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic, pooling bins with small expected counts; returns (statistic, df)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().unsqueeze(0)])
    exp = torch.cat([expected[big], expected[~big].sum().unsqueeze(0)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


class FixedTreeDrafter:
    """Drafts the same tree after CONTEXT: likely and unlikely first tokens, each with a child."""

    name = "fixed-tree"

    def __init__(self, first_tokens: list[int]):
        self.first_tokens = first_tokens

    def start_request(self, request_id, prompt_key, prompt_ids):
        pass

    def add_tokens(self, request_id, token_ids):
        pass

    def draft(self, request_id, context, budget):
        if list(context) != CONTEXT:
            return Draft()
        tokens = self.first_tokens + [7] * len(self.first_tokens)
        parents = [-1] * len(self.first_tokens) + list(range(len(self.first_tokens)))
        return Draft(tokens, parents, [0.5] * len(tokens)).truncated(budget)

    def stop_request(self, request_id):
        pass

    def end_step(self):
        pass


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.7)])
def test_next_token_distribution_through_a_draft_tree(tiny_llama, temperature, top_p):
    """Over many seeds, the first emitted token follows the (filtered) target softmax, drafts or not."""
    model = tiny_llama.model
    with torch.no_grad():
        logits = model(torch.tensor([CONTEXT])).logits[0, -1].double()
    target = torch.softmax(
        filter_logits(
            (logits / temperature).unsqueeze(0), torch.tensor([0]), torch.tensor([top_p], dtype=torch.float64)
        )[0],
        -1,
    )
    order = torch.argsort(target, descending=True)
    drafted = [int(order[0]), int(order[1]), int(order[40]), int(order[200])]  # likely … very unlikely
    n = 2000
    engine = Engine(
        tiny_llama,
        drafter=FixedTreeDrafter(drafted),
        max_batch=64,
        max_context=32,
        max_draft_tokens=8,
        adaptive_drafts=False,
    )
    # max_tokens leaves room for the whole tree (the engine drafts no deeper than it can emit).
    params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=9, seed=s) for s in range(n)]
    outs = engine.generate([CONTEXT] * n, params)
    first = torch.tensor([o.token_ids[0] for o in outs])
    counts = torch.bincount(first, minlength=target.numel()).double()
    stat, df = chi_square(counts, target)
    assert stat < chi_square_threshold(df), (stat, df)
    # Every drafted first token that was sampled was accepted, and so was its child when it came next.
    hits = sum(int(counts[t]) for t in drafted)
    hits += sum(1 for o in outs if o.token_ids[0] in drafted and o.token_ids[1] == 7)
    assert engine.stats()["draft_accepted"] == hits
    assert hits >= 0.5 * n * float(target[drafted].sum())


def test_chi_square_detects_a_wrong_distribution():
    """At the sample size used above, the test rejects a sampler that over-accepts an unlikely draft."""
    probs = torch.softmax(torch.linspace(0, 6, 40, dtype=torch.float64), -1)
    wrong = 0.97 * probs
    wrong[0] += 0.03
    gen = torch.Generator().manual_seed(0)
    samples = torch.multinomial(wrong, 2000, replacement=True, generator=gen)
    counts = torch.bincount(samples, minlength=40).double()
    stat, df = chi_square(counts, probs)
    assert stat > chi_square_threshold(df)
    samples = torch.multinomial(probs, 2000, replacement=True, generator=gen)
    stat, df = chi_square(torch.bincount(samples, minlength=40).double(), probs)
    assert stat < chi_square_threshold(df)


def brute_force_filter(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    values, order = torch.sort(scaled, descending=True, stable=True)
    k = top_k or len(values)
    probs = torch.softmax(values[:k], -1)
    keep = 1
    while keep < k and float(probs[:keep].sum()) < top_p:
        keep += 1
    out = torch.full_like(scaled, float("-inf"))
    out[order[:keep]] = scaled[order[:keep]]
    return out


@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (5, 1.0), (40, 0.6), (0, 0.999), (1, 0.5), (300, 0.95)])
def test_filter_matches_brute_force(top_k, top_p):
    gen = torch.Generator().manual_seed(top_k)
    scaled = torch.randn(4, 500, generator=gen, dtype=torch.float64) * 3
    got = filter_logits(
        scaled, torch.tensor([top_k] * 4), torch.tensor([top_p] * 4, dtype=torch.float64), candidates=32
    )
    for row in range(4):
        assert torch.equal(got[row], brute_force_filter(scaled[row], top_k, top_p))


def test_samples_depend_only_on_seed_and_position():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 1000, generator=gen)
    rows = [RowSampling(1.0, 0.9, 0, seed=7, position=p) for p in (10, 11, 12)]
    tokens, logprobs = sample_rows(logits, rows)
    # Same rows in another order, amid other rows: same tokens.
    shuffled, _ = sample_rows(
        torch.cat([logits[2:], torch.randn(1, 1000), logits[:2]]),
        [rows[2], RowSampling(1.0, 1.0, 0, 3, 0), rows[0], rows[1]],
    )
    assert [shuffled[2], shuffled[3], shuffled[0]] == tokens
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
    assert logprobs == pytest.approx(expected.tolist(), abs=1e-5)
    assert position_key(7, 10) != position_key(7, 11) != position_key(8, 10)


def test_greedy_and_temperature_logprobs():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]], dtype=torch.float64)
    tokens, logprobs = sample_rows(logits, [RowSampling(0.0, 1.0, 0, 0, 0)])
    assert tokens == [1] and logprobs[0] == pytest.approx(float(torch.log_softmax(logits, -1)[0, 1]))
    tokens, logprobs = sample_rows(logits, [RowSampling(0.5, 1.0, 2, 5, 3)])
    assert tokens[0] in (1, 2)  # top-k 2
    assert logprobs[0] == pytest.approx(float(torch.log_softmax(logits / 0.5, -1)[0, tokens[0]]))
