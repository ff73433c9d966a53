"""SRT inside vLLM with vLLM's own sampler (as verl's vLLM rollout runs it) changes speed, never outputs:
greedy outputs are token-identical to vLLM without speculation, and at temperatures 1 and 0.7, with top-p and
top-k, the joint distribution of the first three sampled tokens matches it (Pearson's chi-square), with a warm
tree so drafts are really accepted and rejected. Without the plugin's temperature fix (``SRT_VLLM_TEMPERATURE_FIX=0``) the sampling
test fails: vLLM's CPU rejection sampler then divides logits by uninitialised memory. (Our vLLM backend
samples exactly instead, token for token at any temperature: tests/test_vllm_backend.py.)"""

from __future__ import annotations

from collections import Counter

import pytest
from helpers.vllm_engines import engine, generate, srt_engine, tokens

from srt_agent.bench.gpu_exactness import chi_square_p

pytestmark = pytest.mark.slow  # starting a vLLM engine takes ~10 s here

SAMPLES = 1200


def test_greedy_outputs_match_vllm_without_speculation_and_drafts_are_accepted():
    llm, p = srt_engine()
    prompts = [tokens(t) for t in ("Greedy one:", "Greedy two, longer prompt here:", "3", "Four and more")]
    batch = [q for q in prompts for _ in range(4)]
    expected = generate(engine(), batch, max_tokens=32)
    assert generate(llm, batch, max_tokens=32) == expected
    p.end_step()
    accepted = p.stats()["accepted"]
    assert generate(llm, batch, max_tokens=32) == expected  # now drafting from a warm tree
    assert p.stats()["accepted"] > accepted
    p.end_step()


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 0.9, 0), (0.7, 1.0, 5)], ids=["T1", "T0.7-p0.9", "T0.7-k5"]
)
def test_sampling_matches_vllm_without_speculation(temperature, top_p, top_k):
    """Through vLLM's own rejection sampler (verl's path), at several temperatures and with top-p / top-k: the
    joint distribution of the first three tokens with SRT drafts equals vLLM's without speculation. A sampler
    that verified drafts at another temperature, or unfiltered, fails this (see the test after it)."""
    llm, p = srt_engine()
    prompt = tokens("Question: 2+2=")  # top outcome ~36 % of 38 at T = 1: concentrated, not degenerate
    params = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    generate(llm, [prompt] * 300, max_tokens=3, **params)  # warm the tree
    p.end_step()
    before = p.stats()
    spec = generate(llm, [prompt] * SAMPLES, max_tokens=3, **params)
    p.end_step()
    drafted = p.stats()["drafted"] - before["drafted"]
    accepted = p.stats()["accepted"] - before["accepted"]
    assert 0 < accepted < drafted  # drafts were accepted and rejected
    plain = generate(engine(), [prompt] * SAMPLES, max_tokens=3, **params)
    spec_counts, plain_counts = Counter(map(tuple, spec)), Counter(map(tuple, plain))
    assert plain_counts.most_common(1)[0][1] > SAMPLES / 10  # concentrated enough for the test to have power
    assert chi_square_p(spec_counts, plain_counts) > 1e-3


def test_the_test_tells_temperatures_and_filters_apart():
    """The same comparison has the power to see a sampler that ignores the temperature or the top-p filter:
    vLLM without speculation at T = 1 against T = 0.7, and unfiltered against top-p 0.9."""
    prompt = tokens("Question: 2+2=")
    at = {
        t: Counter(map(tuple, generate(engine(), [prompt] * SAMPLES, max_tokens=3, temperature=t))) for t in (1.0, 0.7)
    }
    assert chi_square_p(at[1.0], at[0.7]) < 1e-6
    filtered = generate(engine(), [prompt] * SAMPLES, max_tokens=3, temperature=1.0, top_p=0.9)
    assert chi_square_p(at[1.0], Counter(map(tuple, filtered))) < 1e-6


def test_the_chi_square_test_rejects_a_shifted_distribution():
    a = Counter({(1,): 600, (2,): 300, (3,): 300})
    assert chi_square_p(a, Counter({(1,): 600, (2,): 310, (3,): 290})) > 0.5
    assert chi_square_p(a, Counter({(1,): 700, (2,): 250, (3,): 250})) < 1e-3
