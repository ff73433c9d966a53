"""Every bound on SRT's trees driven far past its limit: the work per stored token stays bounded (counted in
tokens put through a tree, not seconds), the bound holds, and drafts stay right."""

from __future__ import annotations

import random

import pytest

from srt_agent.drafting import RolloutCache, SRTDrafter
from srt_agent.drafting.drafters.srt import GLOBAL_FEEDERS
from srt_agent.drafting.trees.held_turns import BLOCK, HeldTurns
from srt_agent.drafting.trees.tree import CompiledTokenTree

BACKENDS = ["python"] + (["compiled"] if CompiledTokenTree is not None else [])
MAX_WORK = 4.0  # tokens put through a tree per token stored, bounds included


def occurrences(seqs: list[list[int]], path: list[int]) -> int:
    n = len(path)
    return sum(1 for s in seqs for i in range(len(s) - n + 1) if s[i : i + n] == path)


def assert_counts_match_the_stored_sequences(cache: RolloutCache, key, rng: random.Random) -> None:
    seqs = cache.sequences(key)
    for _ in range(40):
        s = rng.choice([s for s in seqs if len(s) > 3])
        i = rng.randrange(len(s) - 3)
        path = s[i : i + rng.randint(1, 3)]
        assert cache.count(key, path) == occurrences(seqs, path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_running_sequences_cannot_pin_a_tree_above_its_node_cap(backend):
    """More running content than the node cap allows: rebuilds trim running sequences to their last max_depth
    tokens, so the tree comes back under its cap, each rebuild waits for half as many new tokens as it kept, and
    every running request keeps drafting its own continuation."""
    cap, rounds = 600, 150
    cache = RolloutCache(max_depth=8, max_match=4, max_nodes_per_prompt=cap, backend=backend)
    rng = random.Random(0)
    running = {f"r{i}": [1, 2, 3, i] for i in range(24)}
    for rid, prompt in running.items():
        cache.start_request(rid, "p", prompt)
    most = calls = 0
    for _ in range(rounds):
        for rid, tokens in running.items():
            new = [rng.randrange(30) for _ in range(rng.randint(1, 3))]
            cache.add_tokens(rid, new)
            tokens += new
            calls += 1
            most = max(most, cache.stats().nodes)
    stats = cache.stats()
    assert stats.rebuilds >= 3 and stats.trimmed_sequences > 0  # running content was trimmed, again and again
    assert stats.work_per_token <= MAX_WORK
    assert stats.rebuilds <= stats.inserted_tokens / (cap // 8)  # no rebuild per token
    assert most <= 3 * cap and stats.nodes <= 3 * cap
    assert_counts_match_the_stored_sequences(cache, "p", rng)
    for rid, tokens in running.items():
        own = cache.draft_request(rid, tokens, budget=4)
        assert own == cache.draft("p", tokens, budget=4)  # the request's shortcut finds the same match
        stored = next(s for s in cache.sequences("p") if s == tokens[-len(s) :])  # its tail is stored, in order
        assert len(stored) >= cache.max_depth


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_byte_budget_evicts_in_batches_not_per_token(backend):
    """Hundreds of prompts through a budget that holds a few: it always holds, and evictions come in passes down
    to seven eighths of it, so a pass follows an eighth of the budget's worth of new tokens, not each token."""
    cache = RolloutCache(max_depth=8, max_match=4, max_bytes=60_000, backend=backend)
    rng = random.Random(1)
    passes = calls = 0
    for p in range(300):
        cache.start_request(p, f"p{p}", [p, p + 1])
        for _ in range(8):
            before = cache.stats().evicted_prompts
            cache.add_tokens(p, [rng.randrange(40) for _ in range(6)])
            calls += 1
            passes += cache.stats().evicted_prompts > before
            assert cache.stats().bytes <= cache.max_bytes
        cache.stop_request(p)
    stats = cache.stats()
    assert stats.evicted_prompts > 100 and passes < calls / 8
    assert stats.work_per_token <= MAX_WORK and len(cache) < 300


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_ahead_content_past_the_budget_goes_first_at_bounded_cost(backend):
    """Run-ahead floods a budget twice what the real rollouts need while they run: run-ahead content is dropped
    in passes, no real rollout is evicted, and the work stays bounded."""
    rng = random.Random(2)
    real = [[rng.randrange(30) for _ in range(120)] for _ in range(4)]
    ahead = [[rng.randrange(30) for _ in range(20)] for _ in range(120)]

    def run(max_bytes: int, with_run_ahead: bool) -> RolloutCache:
        cache = RolloutCache(max_depth=8, max_match=4, max_bytes=max_bytes, backend=backend)
        for i in range(4):
            cache.start_request(f"real{i}", f"p{i}", [i])
        for r in range(120):
            if with_run_ahead:
                cache.start_request(f"ahead{r}", f"p{r % 4}", [r % 4], run_ahead=True)
            for i in range(4):
                cache.add_tokens(f"real{i}", [real[i][r]])
            if with_run_ahead:
                cache.add_tokens(f"ahead{r}", ahead[r])
                cache.stop_request(f"ahead{r}")
            assert cache.stats().bytes <= cache.max_bytes
        return cache

    needed = run(1 << 30, with_run_ahead=False).stats().bytes
    cache = run(2 * needed, with_run_ahead=True)
    stats = cache.stats()
    assert stats.evicted_run_ahead > 0 and stats.evicted_prompts == 0
    assert stats.work_per_token <= MAX_WORK
    for i in range(4):
        assert cache.sequences(f"p{i}", run_ahead=False) == [[i] + real[i]]  # every real token kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_rewinding_a_running_request_costs_its_lead_not_the_tree(backend):
    """A turn rewound to a stop after every few tokens (a serving engine sampling past stops), in a tree of
    thousands of tokens: no rebuild, each rewind re-inserts at most max_match tokens."""
    cache = RolloutCache(max_depth=8, max_match=4, backend=backend)
    rng = random.Random(3)
    for _ in range(20):
        cache.add_sequence("p", [rng.randrange(30) for _ in range(200)])
    cache.start_request("r", "p", [1, 2, 3])
    for _ in range(300):
        cache.add_tokens("r", [rng.randrange(30) for _ in range(5)])
        cache.drop_last("r", 2)
    stats = cache.stats()
    assert stats.rebuilds == 0 and stats.rebuilt_tokens <= 300 * cache.max_match
    assert_counts_match_the_stored_sequences(cache, "p", rng)


def test_srt_at_batch_keeps_its_global_tree_bounded_and_fed_by_a_bounded_share_of_the_batch():
    """128 rollouts of 16 prompts in lockstep through SRT with a small budget: GLOBAL_FEEDERS running turns feed
    the global tree, every turn may draft from it, and its node cap holds at bounded work."""
    srt = SRTDrafter(max_bytes=1 << 20)  # the global tree gets 32 KiB: a node cap of 341
    cap = srt.responses.max_nodes_per_prompt
    rng = random.Random(4)
    common = [[rng.randrange(50) for _ in range(6)] for _ in range(8)]  # what responses share across prompts
    for step in range(2):
        rids = [f"{step}/{p}/{i}" for p in range(16) for i in range(8)]
        for rid in rids:
            p = int(rid.split("/")[1])
            srt.start_request(rid, f"prompt{p}", [900 + p, 901, 902])
        assert len(srt._feeders) == GLOBAL_FEEDERS < len(rids)
        for _ in range(60):
            for rid in rids:
                srt.draft(rid, srt._active[rid].tokens, 8)
                srt.add_tokens(rid, rng.choice(common) if rng.random() < 0.5 else [rng.randrange(200)])
            assert srt.responses.stats().nodes <= 3 * cap
        for rid in rids:
            srt.stop_request(rid)
        srt.end_step()
    glob = srt.responses.stats()
    assert glob.rebuilds > 0 and glob.work_per_token <= MAX_WORK
    assert srt.counters["global_drafts"] > 0 and not srt._feeders
    assert srt.cache.stats().work_per_token <= MAX_WORK


def test_held_turns_past_their_bounds_compare_only_the_turns_a_prompt_may_continue():
    """Thousands of turns held past max_held and the byte budget: both bounds hold, expiry and release are by
    age, and a claim compares only the turns whose context starts like the prompt, not every held turn."""
    now = [0.0]
    turns = HeldTurns(max_held=500, max_bytes=400_000, ttl_s=100.0, clock=lambda: now[0])
    rng = random.Random(5)
    system = [7] * 40  # every prompt starts alike (a chat template's system prompt)
    held = {}
    for t in range(3000):
        now[0] = t * 0.05
        context = system + [rng.randrange(1000) for _ in range(2 * BLOCK)]
        held[t] = context + [rng.randrange(1000) for _ in range(20)]
        turns.hold(t, held[t], floor=len(context))
        assert len(turns) <= 500 and turns.nbytes <= 400_000
    live = [t for t in held if t in turns]
    assert len(live) == 500 and live == list(range(2500, 3000))  # the newest held
    before = turns.compared
    for t in live[:100]:
        assert turns.claim(held[t] + [1, 2, 3]) == (t, len(held[t]), len(held[t]))
    assert turns.compared - before <= 2 * 100  # each claim compared its own turn (and a rare hash twin)
    now[0] += 1000
    assert len(turns.expire()) == 400 and len(turns) == 0
