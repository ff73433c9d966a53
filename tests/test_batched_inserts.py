"""A step's inserts for all rows in one call into the trees store what one call per row stores: the rollout cache
(both tree backends, node-cap rebuilds and evictions mid-batch included) and SRT's proposer inside vLLM (a
stand-in batch: rows joining, leaving, catching up on accepted drafts, next turns, tight byte budgets), whose
drafts stay the same token for token."""

from __future__ import annotations

import random

import numpy as np
import pytest

from srt_agent.backends.vllm.proposer import ProposerOptions, SRTProposer
from srt_agent.drafting import RequestKind, RolloutCache
from srt_agent.drafting.trees.tree import CompiledTokenTree, reference_extend_rows

# "stale": compiled trees with the row-by-row extend_rows (an extension built before it had one)
BACKENDS = ["python"] + (["compiled", "stale"] if CompiledTokenTree is not None else [])


def _state(cache: RolloutCache, requests: list[int]) -> tuple:
    drafts = [cache.draft_request(r, cache_context(cache, r), 6) for r in requests]
    trees = {key: cache.sequences(key) for key in cache.prompt_keys()}
    return trees, cache.stats(), [(d.token_ids, d.parents, d.scores, d.match_len) for d in drafts]


def cache_context(cache: RolloutCache, request: int) -> list[int]:
    req = cache._requests[request]
    if req.detached:
        return [1]
    return cache._prompts[req.prompt_key].tree.sequence(req.seq)[-cache.max_match :] or [1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(6))
def test_the_cache_stores_a_batch_as_it_stores_its_rows_one_by_one(backend, seed):
    options = dict(max_depth=8, max_match=4, max_bytes=[1 << 30, 6000, 20000][seed % 3])
    options.update(max_nodes_per_prompt=[1 << 20, 60, 200][seed // 2 % 3], backend=backend.replace("stale", "compiled"))
    batched, per_row = RolloutCache(**options), RolloutCache(**options)
    if backend == "stale":
        batched._extend_rows = reference_extend_rows
    rng = random.Random(seed)
    running: list[int] = []
    for step in range(80):
        if len(running) < 12 and rng.random() < 0.4:
            rid, key = step, rng.randrange(5)
            prompt = [rng.randrange(6) for _ in range(rng.randrange(1, 9))]
            for cache in (batched, per_row):
                cache.start_request(rid, key, prompt)
            running.append(rid)
        if running and rng.random() < 0.08:
            rid = running.pop(rng.randrange(len(running)))
            for cache in (batched, per_row):
                cache.stop_request(rid)
        if running and rng.random() < 0.05:
            rid, count = rng.choice(running), rng.randrange(1, 4)
            for cache in (batched, per_row):
                cache.drop_last(rid, count)
        rows = rng.sample(running, len(running))
        parts = [[rng.randrange(6) for _ in range(rng.choice([1, 1, 1, 2, 5]))] for _ in rows]
        batched.add_tokens_rows(rows, [t for p in parts for t in p], np.cumsum([0] + [len(p) for p in parts]))
        for rid, part in zip(rows, parts):
            per_row.add_tokens(rid, part)
        assert _state(batched, running) == _state(per_row, running), step
    assert per_row.stats().evicted_prompts or per_row.stats().rebuilds or seed < 2


def test_a_batch_with_a_bad_token_or_an_unknown_request_changes_nothing():
    cache = RolloutCache(max_depth=8, max_match=4)
    for rid in (0, 1):
        cache.start_request(rid, "p", [1, 2])
    before = _state(cache, [0, 1])
    with pytest.raises(ValueError):
        cache.add_tokens_rows([0, 1], [3, -4], [0, 1, 2])
    with pytest.raises(ValueError, match="unknown request"):
        cache.add_tokens_rows([0, 7], [3, 4], [0, 1, 2])
    assert _state(cache, [0, 1]) == before


class _Batch:  # a test double of vLLM's InputBatch: what the proposer reads
    def __init__(self, ids: list[str], prompts: list[list[int]]):
        self.req_ids = ids
        self.num_prompt_tokens = np.array([len(p) for p in prompts])


class _PerRow(SRTProposer):
    """SRT's proposer storing every row on its own (the path before batching), as the reference."""

    @property
    def _plan(self):
        return None

    @_plan.setter
    def _plan(self, plan) -> None:
        pass

    def _store_run(self, run, req_ids, sampled, lengths, token_ids) -> None:
        for i in run:
            self._store(req_ids[i], i, RequestKind.ROLLOUT, sampled[i], lengths[i], token_ids)


def _script_token(rng: random.Random, script: list[int], position: int) -> int:
    return script[position % len(script)] if rng.random() < 0.85 else rng.randrange(40)


def _drive(proposers: list[SRTProposer], seed: int, steps: int = 120, batch: int = 12) -> int:
    """Decode requests through `proposers` in lockstep (each row verifies its draft against a noisy script of its
    prompt); every step's drafts must agree. Returns the drafted tokens."""
    rng = random.Random(seed)
    scripts = [[rng.randrange(40) for _ in range(rng.randrange(3, 12))] for _ in range(4)]
    prompts = [[rng.randrange(40) for _ in range(rng.randrange(2, 50))] for _ in range(4)]
    rows: dict[str, tuple[list[int], list[int], int, list[int]]] = {}  # id -> prompt, out, target, script
    drafts: dict[str, list[int]] = {}
    drafted, serial = 0, 0
    for step in range(steps):
        while len(rows) < batch and rng.random() < 0.3:
            k = rng.randrange(4)
            rows[f"r{serial}"] = (list(prompts[k]), [], rng.randrange(4, 60), scripts[k])
            serial += 1
        sampled = []
        for rid, (_, out, _, script) in rows.items():
            new = []
            for token in drafts.get(rid, []) + [None]:  # exact verification against the row's own next tokens
                new.append(_script_token(rng, script, len(out) + len(new)))
                if token != new[-1]:
                    break
            out += new
            sampled.append(new)
        ids = list(rows)
        contexts = [rows[r][0] + rows[r][1] for r in ids]
        token_ids = np.zeros((max(1, len(ids)), max([1] + [len(c) for c in contexts])), dtype=np.int64)
        for i, context in enumerate(contexts):
            token_ids[i, : len(context)] = context
        lengths = np.array([len(c) for c in contexts], dtype=np.int64)
        outs = []
        for p in proposers:
            p.bind_input_batch(_Batch(ids, [rows[r][0] for r in ids]))
            outs.append(p.propose([list(s) for s in sampled], lengths.copy(), token_ids))
        assert all(o == outs[0] for o in outs), step
        drafts = dict(zip(ids, outs[0]))
        drafted += sum(map(len, outs[0]))
        for rid in ids:
            prompt, out, target, script = rows[rid]
            if len(out) >= target:  # done; sometimes a next turn continues it with a tool's output
                del rows[rid]
                if rng.random() < 0.3:
                    tool = [rng.randrange(40) for _ in range(rng.randrange(1, 5))]
                    rows[f"r{serial}"] = (prompt + out + tool, [], rng.randrange(4, 40), script)
                    serial += 1
        if step % 50 == 49:
            for p in proposers:
                p.end_step()
    return drafted


@pytest.mark.parametrize("policy", ["always", "cost"])
@pytest.mark.parametrize("seed", range(4))
def test_the_proposer_drafts_the_same_with_a_steps_inserts_batched(policy, seed):
    options = ProposerOptions(policy=policy, calibrate=False, step_fixed_ms=30.0, step_row_ms=0.1, draft_token_ms=0.1)
    if seed % 2:
        options = ProposerOptions(**{**options.__dict__, "max_bytes": 1 << 16, "max_nodes_per_prompt": 300})
    batched, per_row = SRTProposer(options=options), _PerRow(options=options)
    assert _drive([batched, per_row], seed) > 0
    stats, reference = batched.stats(), per_row.stats()
    for key in ("host_ns", "host_cpu_ns", "host_us_per_row", "host_cpu_us_per_row"):
        del stats[key], reference[key]
    assert stats == reference
