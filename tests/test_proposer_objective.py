"""SRT's vLLM proposer under its two objectives (no vLLM engine needed: `choose` is the cost policy alone)."""

from __future__ import annotations

import pytest

from srt_agent.backends.vllm.proposer import ProposerOptions, SRTProposer
from srt_agent.drafting.draft import Draft


def _chain(scores):
    return Draft(list(range(len(scores))), list(range(-1, len(scores) - 1)), list(scores), 4)


def _lengths(objective: str, drafts: list[Draft]) -> list[int]:
    p = SRTProposer(options=ProposerOptions(objective=objective))  # 30 ms a step + 2.8 ms a row + 2.4 ms a token
    return [len(d) for d in p.choose(drafts)]


def test_a_full_batch_drafts_for_throughput_where_the_makespan_rule_drafts_nothing():
    good = [_chain([0.9, 0.8, 0.7])] * 16
    assert _lengths("makespan", good) == [0] * 16  # the slowest of 16 rows likely gains nothing
    chosen = _lengths("throughput", good)
    assert all(n >= 1 for n in chosen)  # each first token expects 0.9 for 2.4 ms against 75 ms a step


def test_throughput_still_drafts_nothing_that_cannot_pay():
    poor = [_chain([0.05, 0.01])] * 16
    assert _lengths("throughput", poor) == [0] * 16
    mixed = [_chain([0.95, 0.9])] * 8 + [_chain([0.02])] * 8
    chosen = _lengths("throughput", mixed)
    assert chosen[:8] == [2] * 8 and chosen[8:] == [0] * 8  # per row: only the rows whose drafts pay


def test_an_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="objective"):
        ProposerOptions(objective="fastest")
