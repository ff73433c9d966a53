"""The lossless sampler: exact target distribution through draft trees, filters, log-probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from srt_agent.drafting import Draft
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.runner.sampler import (
    RowSampling,
    draw,
    filter_logits,
    perturbed_logits,
    position_key,
    sample_rows,
    uniforms,
)

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
        filter_logits((logits / temperature).unsqueeze(0), [0], [top_p])[0],
        -1,
    )
    order = torch.argsort(target, descending=True)
    drafted = [int(order[0]), int(order[1]), int(order[40]), int(order[200])]  # likely … very unlikely
    n = 2000
    engine = Engine(
        tiny_llama,
        EngineOptions(
            drafter=FixedTreeDrafter(drafted), max_batch=64, max_context=32, max_draft_tokens=8, adaptive_drafts=False
        ),
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
    got = filter_logits(scaled, [top_k] * 4, [top_p] * 4, candidates=32)
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


# ----- the noise: a pure function of (seed, position, token) ------------------------------------------------

M32, M64 = (1 << 32) - 1, (1 << 64) - 1


def reference_key(seed: int, position: int) -> int:
    """splitmix64 of (seed, position), written out independently of the sampler."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def reference_hash32(x: int) -> int:
    """Chris Wellons' lowbias32."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & M32
    x ^= x >> 15
    x = (x * 0x735A2D97) & M32
    return x ^ (x >> 15)


def reference_uniform(seed: int, position: int, token: int, dtype: torch.dtype) -> float:
    """The sampler's uniform for (seed, position, token), in plain Python integers."""
    key, words = reference_key(seed, position), []
    for _ in range(2 if dtype == torch.float64 else 1):
        words.append(reference_hash32((token * ((key >> 32) | 1) + (key & M32)) & M32))
        key = reference_key(key, 1)
    if dtype == torch.float64:
        return (((words[0] << 20) | (words[1] >> 12)) + 0.5) / 2**52
    return ((words[0] >> 9) + 0.5) / 2**23


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_uniforms_match_the_reference_bit_for_bit(dtype):
    rows = [(0, 0), (7, 10), (7, 11), (2**63 - 1, 2**20), (123456789, 3)]
    got = uniforms(rows, 3000, dtype)
    assert got.dtype == dtype
    tokens = list(range(40)) + list(range(2960, 3000)) + list(range(1000, 3000, 97))
    for r, (seed, position) in enumerate(rows):
        for t in tokens:
            assert float(got[r, t]) == reference_uniform(seed, position, t, dtype), (seed, position, t)
    assert float(got.min()) > 0 and float(got.max()) < 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_uniforms_are_uniform_and_independent(dtype):
    """Marginals, and the pairs a sampler leans on: adjacent tokens, adjacent positions, adjacent seeds."""
    u = uniforms([(s, p) for s in range(40) for p in range(50)], 500, dtype).double()  # 1e6 draws
    assert abs(float(u.mean()) - 0.5) < 1e-3 and abs(float(u.var()) - 1 / 12) < 1e-3
    counts = torch.histc(u, bins=100, min=0, max=1)
    stat, df = chi_square(counts, torch.full((100,), 0.01, dtype=torch.float64))
    assert stat < chi_square_threshold(df)
    grid = u.view(40, 50, 500)
    pairs = {
        "tokens": (grid[..., :-1], grid[..., 1:]),
        "positions": (grid[:, :-1], grid[:, 1:]),
        "seeds": (grid[:-1], grid[1:]),
    }
    for name, (a, b) in pairs.items():
        joint = torch.histc((a * 10).floor() * 10 + (b * 10).floor(), bins=100, min=0, max=100)
        stat, df = chi_square(joint, torch.full((100,), 0.01, dtype=torch.float64))
        assert stat < chi_square_threshold(df), name
        assert abs(float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])) < 0.005, name


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.5, 0, 1.0), (1.0, 12, 1.0), (0.8, 0, 0.8), (1.2, 20, 0.9)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_sampled_tokens_follow_the_filtered_softmax(temperature, top_k, top_p, dtype):
    """Over many (seed, position) rows of the same logits, tokens follow the filtered softmax."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(64, generator=gen, dtype=torch.float64) * 2).to(dtype)
    n = 6000
    rows = [RowSampling(temperature, top_p, top_k, seed=i % 60, position=i // 60) for i in range(n)]
    tokens, _ = sample_rows(logits.expand(n, -1), rows)
    scaled = (logits.double() / temperature).unsqueeze(0)
    target = torch.softmax(filter_logits(scaled, [top_k], [top_p])[0], -1)
    counts = torch.bincount(torch.tensor(tokens), minlength=64).double()
    stat, df = chi_square(counts, target)
    assert stat < chi_square_threshold(df), (stat, df)
    assert counts[target == 0].sum() == 0


def test_tokens_at_adjacent_positions_and_seeds_are_independent():
    """A contingency table of the tokens drawn at positions p and p + 1 (and seeds s, s + 1) of the same
    logits shows no dependence."""
    logits = torch.linspace(0, 1.5, 6, dtype=torch.float64)
    n = 4000
    probs = torch.softmax(logits, -1)
    for first, second in (lambda i: (i, 5), lambda i: (i, 6)), (lambda i: (i, 9), lambda i: (i + 1, 9)):
        a, _ = sample_rows(logits.expand(n, -1), [RowSampling(1.0, 1.0, 0, *first(i)) for i in range(n)])
        b, _ = sample_rows(logits.expand(n, -1), [RowSampling(1.0, 1.0, 0, *second(i)) for i in range(n)])
        joint = torch.bincount(torch.tensor(a) * 6 + torch.tensor(b), minlength=36).double()
        stat, df = chi_square(joint, torch.outer(probs, probs).flatten())
        assert stat < chi_square_threshold(df), (stat, df)


def test_a_nucleus_past_the_sorted_candidates_is_drawn_exactly():
    """A flat row whose top-p nucleus needs more than the tokens sorted at first: `draw` says so, and
    `sample_rows` draws again over every token (the tokens plain Gumbel-max over the exact nucleus gives)."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 3000, generator=gen) * 0.1
    rows = [RowSampling(1.0, 0.95, 0, seed=s, position=4) for s in range(5)] + [RowSampling(1.0, 1.0, 0, 9, 9)]
    draws = draw(logits, rows)
    assert draws.covered is not None and draws.covered.tolist() == [False] * 5 + [True]
    tokens, logprobs = sample_rows(logits, rows)
    scaled, perturbed = perturbed_logits(logits, rows)
    assert tokens == perturbed.argmax(-1).tolist()
    assert torch.isfinite(filter_logits(scaled, [0] * 6, [0.95] * 6)).sum(-1).min() > 1024
    assert logprobs == pytest.approx(
        torch.log_softmax(scaled, -1).gather(1, torch.tensor([tokens]).T).squeeze(1).tolist()
    )
    assert draw(logits[5:], rows[5:]).covered is None  # no row can reach past: nothing to check


def test_greedy_and_random_rows_mix():
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 100, generator=gen, dtype=torch.float64)
    rows = [RowSampling(0.0, 1.0, 0, 1, 1), RowSampling(1.0, 1.0, 0, 1, 1), RowSampling(0.0, 0.5, 3, 2, 2)]
    rows.append(RowSampling(0.7, 0.9, 5, 3, 3))
    tokens, _ = sample_rows(logits, rows)
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())
    alone = [sample_rows(logits[i : i + 1], [r])[0][0] for i, r in enumerate(rows)]
    assert tokens == alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_filtered_rows_draw_the_same_tokens_alone_and_beside_an_unfiltered_row(dtype):
    """A batch whose rows all filter draws noise for their candidates only; beside an unfiltered row the
    whole vocabulary gets noise. Same tokens either way, ties going to the smallest token id."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(6, 400, generator=gen, dtype=dtype)
    logits[:, 250] = logits[:, 3]  # exact ties
    logits[0, 9] = logits[0, 301] = logits[0].max() + 1
    rows = [
        RowSampling(0.0, 1.0, 5, 1, 1),  # greedy, a tie at the top: token 9
        RowSampling(1.0, 0.9, 0, 2, 2),
        RowSampling(0.7, 1.0, 40, 3, 3),
        RowSampling(1.3, 0.5, 10, 4, 4),
        RowSampling(1.0, 0.99, 0, 5, 5),
        RowSampling(0.0, 0.8, 0, 6, 6),
    ]
    alone = draw(logits, rows)
    beside = draw(torch.cat([logits, logits[:1]]), rows + [RowSampling(1.0, 1.0, 0, 7, 7)])
    assert alone.tokens.tolist() == beside.tokens[:-1].tolist() == perturbed_logits(logits, rows)[1].argmax(-1).tolist()
    assert alone.tokens[0] == 9
    assert torch.equal(alone.logprobs, beside.logprobs[:-1])
