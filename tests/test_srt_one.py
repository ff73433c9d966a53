"""One SRT: our engine's drafter and vLLM's proposer, fed the same history, draft the same tokens.

Our engine keeps a trajectory under one request id and hands SRT each turn's tool output as forced tokens; vLLM
gives every turn a fresh request id and a batch row, and the proposer reads new tokens off the batch. Both
reach the same `SRTDrafter` rules (prompt trees, whole-prompt leading sequences, held turns, the global tree),
so at every decode step each request's draft is the same list of tokens. The proposer runs without vLLM here
(a stand-in input batch: request ids and prompt lengths, what vLLM's runner hands it); its real-vLLM tests
are in test_vllm_proposer.py.
"""

from __future__ import annotations

import numpy as np

from srt_agent.backends.vllm.proposer import SRTProposer
from srt_agent.backends.vllm.proposer_options import ProposerOptions
from srt_agent.drafting import make_drafter

K = 8  # vLLM's num_speculative_tokens: the budget of every draft


class _Batch:  # a stand-in for vLLM's InputBatch: what the proposer reads
    def __init__(self, req_ids: list[str], num_prompt_tokens: list[int]):
        self.req_ids = req_ids
        self.num_prompt_tokens = np.array(num_prompt_tokens)


class _Turn:
    def __init__(self, vllm_id: str, engine_id: str, prompt: list[int]):
        self.vllm_id, self.engine_id, self.prompt, self.out = vllm_id, engine_id, prompt, []


def _markov(rng: np.random.Generator, start: int, n: int) -> list[int]:
    """Tokens of a sparse chain over 40 symbols: repeated structure for the trees to find."""
    out, t = [], start
    for _ in range(n):
        t = int((t * 7 + rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1])) % 40)
        out.append(t)
    return out


def _decode_step(proposer, engine, turns: list[_Turn], rng) -> tuple[list[list[int]], list[list[int]]]:
    """Every turn samples 1-3 more tokens; both sides see them and draft: (proposer's drafts, engine's)."""
    for turn in turns:
        turn.out += _markov(rng, (turn.out or turn.prompt)[-1], int(rng.integers(1, 4)))
    contexts = [t.prompt + t.out for t in turns]
    token_ids = np.zeros((len(turns), max(map(len, contexts))), dtype=np.int64)
    for i, context in enumerate(contexts):
        token_ids[i, : len(context)] = context
    proposer.bind_input_batch(_Batch([t.vllm_id for t in turns], [len(t.prompt) for t in turns]))
    sampled = [t.out[-1:] for t in turns]
    vllm_drafts = proposer.propose(sampled, np.array([len(c) for c in contexts]), token_ids)
    for turn, context in zip(turns, contexts):  # as the engine's step does: every sequence's tokens, then drafts
        engine.drafter.add_tokens(turn.engine_id, context[engine.stored[turn.engine_id] :])
        engine.stored[turn.engine_id] = len(context)
    engine_drafts = [engine.drafter.draft(t.engine_id, c, K).token_ids for t, c in zip(turns, contexts)]
    return vllm_drafts, engine_drafts


class _EngineSide:
    """SRT driven as our engine drives it (Engine.add_request, _append, release, end_step)."""

    def __init__(self):
        self.drafter = make_drafter("srt", chain=True)
        self.stored: dict[str, int] = {}

    def start(self, turn: _Turn) -> None:
        if turn.engine_id in self.stored:  # a next turn of a held trajectory: the tool output goes in forced
            return
        self.drafter.start_request(turn.engine_id, None, turn.prompt)
        self.stored[turn.engine_id] = len(turn.prompt)


def test_both_engines_draft_the_same_tokens_from_the_same_history():
    rng = np.random.default_rng(0)
    proposer = SRTProposer(options=ProposerOptions(policy="always"))
    engine = _EngineSide()
    prompts = [_markov(rng, s, 40) for s in (1, 5, 9)]
    drafted = 0
    for step in range(2):  # two RL steps: trees persist across them
        turns = [_Turn(f"s{step}-p{p}-r{r}", f"s{step}-p{p}-r{r}", prompts[p]) for p in range(3) for r in range(3)]
        for t in turns:
            engine.start(t)
        for _ in range(12):
            vllm_drafts, engine_drafts = _decode_step(proposer, engine, turns, rng)
            assert vllm_drafts == engine_drafts
            drafted += sum(map(len, vllm_drafts))
        # each trajectory's next turn: the tool output appended; vLLM sees a fresh request id, our engine the same
        tool = [41, 42, 43]
        next_turns = []
        for t in turns[::2]:
            nt = _Turn(t.vllm_id + "-turn2", t.engine_id, t.prompt + t.out + tool)
            engine.drafter.add_tokens(t.engine_id, tool)
            engine.stored[t.engine_id] += len(tool)
            next_turns.append(nt)
        for t in turns[1::2]:  # the others finish: both sides let them go
            engine.drafter.stop_request(t.engine_id)
        for _ in range(8):
            vllm_drafts, engine_drafts = _decode_step(proposer, engine, next_turns, rng)
            assert vllm_drafts == engine_drafts
            drafted += sum(map(len, vllm_drafts))
        for t in next_turns:
            engine.drafter.stop_request(t.engine_id)
            del engine.stored[t.engine_id]
        for t in turns[1::2]:
            del engine.stored[t.engine_id]
        proposer.bind_input_batch(_Batch([], []))
        proposer.propose([], np.zeros(0, dtype=np.int64), np.zeros((0, 1), dtype=np.int64))
        proposer.end_step()
        engine.drafter.end_step()
        key = engine.drafter.cache.prompt_keys()
        assert key == proposer.cache.prompt_keys()
        assert all(engine.drafter.cache.sequences(k) == proposer.cache.sequences(k) for k in key)
    assert drafted > 100  # the history drafts: the equality is not between empty drafts
    assert proposer.stats()["continuations"] == 10 and proposer.stats()["whole_prompts"] == 3
