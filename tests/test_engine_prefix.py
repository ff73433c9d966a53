"""Prefix sharing: prompt KV computed once (GRPO siblings, shared system prompts, held and evicted
multi-turn sequences), exactly the tokens of an engine without it, never stale across weight updates."""

from __future__ import annotations

import pytest
import torch

from srt_agent.drafting import DRAFTERS, make_drafter
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.engine.prefix_cache import PrefixCache
from srt_agent.models import tiny_random_model

pytestmark = pytest.mark.usefixtures("one_thread")

SYSTEM = [(7 * i) % 250 + 3 for i in range(21)]  # a shared system prompt
QUESTIONS = [[201, 202, 203], [17, 18, 19, 20, 21, 22, 23, 24, 25], [99]]
GROUP = 3  # GRPO samples per question
BLOCK = 4


def prompts() -> list[list[int]]:
    return [SYSTEM + q for q in QUESTIONS for _ in range(GROUP)]


def params(max_tokens: int = 12, temperature: float = 1.0) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=max_tokens, seed=50 + i, temperature=temperature, top_p=0.9)
        for i in range(len(prompts()))
    ]


def engine(model, drafter=None, sharing=True, **kw) -> Engine:
    kw = {**dict(max_batch=8, max_context=96, max_draft_tokens=6, calibrate=False, adaptive_drafts=False), **kw}
    return Engine(model, EngineOptions(drafter=drafter, prefix_sharing=sharing, prefix_block_size=BLOCK, **kw))


def run(model, drafter=None, sharing=True, epochs=2, **kw):
    e = engine(model, make_drafter(drafter) if drafter else None, sharing, **kw)
    outs = []
    for _ in range(epochs):
        outs.append(e.generate(prompts(), params()))
        e.end_step()
    return outs, e


_without: dict = {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("drafter", sorted(n for n in DRAFTERS if n != "arctic") + ["arctic"])
def test_sharing_is_lossless_for_every_drafter(drafter, dtype):
    """Two epochs (the second also hits the block pool): the same tokens and log-probs as without sharing."""
    try:
        make_drafter(drafter)
    except ValueError as exc:  # arctic-inference is optional (built from source)
        pytest.skip(str(exc))
    model = tiny_random_model("qwen2", seed=5, dtype=dtype)
    if dtype not in _without:
        _without[dtype] = run(model, sharing=False)[0]
    shared, e = run(model, drafter)
    for plain_epoch, shared_epoch in zip(_without[dtype], shared):
        assert [o.token_ids for o in shared_epoch] == [o.token_ids for o in plain_epoch]
        for a, b in zip(plain_epoch, shared_epoch):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5 if dtype == torch.float32 else 1e-9)
    stats = e.stats()
    assert stats["prefill_reused_from_slots"] > 0 and stats["prefill_reused_from_pool"] > 0


def test_a_group_prefills_its_prompt_once(tiny_llama):
    """Siblings admitted together wait one step for the first one's prefill and copy it."""
    prompt = SYSTEM + QUESTIONS[1]
    e = engine(tiny_llama, prefix_cache_tokens=0)
    outs = e.generate([prompt] * 4, [SamplingParams(max_tokens=4, seed=i) for i in range(4)])
    stats = e.stats()
    assert stats["prefill_tokens"] == len(prompt) - 1  # one copy computed
    assert stats["prefill_reused"] == 3 * (len(prompt) - 1)  # three copied
    assert stats["prefix_waits"] == 3 and stats["prefill_hit_rate"] == pytest.approx(0.75)
    assert [o.metrics.prefill_reused for o in outs] == [0] + [len(prompt) - 1] * 3


def test_a_shared_system_prompt_is_computed_once(tiny_llama):
    e = engine(tiny_llama, prefix_cache_tokens=0)
    e.generate([SYSTEM + q for q in QUESTIONS], [SamplingParams(max_tokens=3, seed=i) for i in range(3)])
    assert e.stats()["prefill_tokens"] == len(SYSTEM) + sum(len(q) for q in QUESTIONS) - len(QUESTIONS)


def test_sharing_off_computes_every_prompt(tiny_llama):
    e = engine(tiny_llama, sharing=False)
    e.generate(prompts(), params())
    stats = e.stats()
    assert stats["prefill_tokens"] == sum(len(p) - 1 for p in prompts()) and stats["prefill_reused"] == 0
    assert "prefix_blocks_in_use" not in stats


def test_held_sequence_reuses_its_own_kv_and_an_evicted_one_the_pool(tiny_llama):
    prompt = SYSTEM + QUESTIONS[0]
    e = engine(tiny_llama, max_batch=1)
    first = e.generate([prompt], [SamplingParams(max_tokens=6, seed=1)])[0]  # warm the pool (released after)
    e.add_request(prompt, SamplingParams(max_tokens=6, seed=1), "a")
    out = step_until_done(e, "a")
    assert out.token_ids == first.token_ids
    tool = [5, 6, 7]
    e.add_request(prompt + out.token_ids + tool, SamplingParams(max_tokens=4, seed=2), "a")
    held = step_until_done(e, "a")
    assert (held.metrics.prefill_tokens, held.metrics.prefill_reused) == (len(tool), 0)  # its own slot
    e.add_request([9, 9, 9], SamplingParams(max_tokens=2, seed=3), "b")  # the only slot: "a" is evicted
    step_until_done(e, "b")
    history = prompt + out.token_ids + tool + held.token_ids
    from_pool = e.stats()["prefill_reused_from_pool"]
    e.add_request(history + tool, SamplingParams(max_tokens=4, seed=4), "a")
    again = step_until_done(e, "a")
    reused = again.metrics.prefill_reused
    assert reused == e.stats()["prefill_reused_from_pool"] - from_pool == len(history) // BLOCK * BLOCK
    fresh = engine(tiny_llama, sharing=False).generate([history + tool], [SamplingParams(max_tokens=4, seed=4)])[0]
    assert again.token_ids == fresh.token_ids


def step_until_done(e: Engine, request_id: str):
    while True:
        for out in e.step():
            if out.request_id == request_id:
                return out


def test_stale_kv_is_never_reused_across_weight_updates(tiny_llama):
    """After update_weights the pool is empty and held sequences are no source: every output equals a
    fresh engine's under the new weights (reusing the old policy's KV would change them)."""
    e = engine(tiny_llama)
    e.generate(prompts(), params())
    held = SYSTEM + QUESTIONS[1]
    e.add_request(held, SamplingParams(max_tokens=3, seed=1), "held")
    step_until_done(e, "held")
    assert e.stats()["prefix_blocks_in_use"] > 0
    other = tiny_random_model("llama", seed=11)
    e.update_weights(other.model)
    assert e.stats()["prefix_blocks_in_use"] == 0
    after = e.generate(prompts(), params())
    fresh = engine(other, sharing=False).generate(prompts(), params())
    assert [o.token_ids for o in after] == [o.token_ids for o in fresh]
    for a, b in zip(after, fresh):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-9)
    assert e.stats()["prefill_reused"] > 0  # sharing goes on, within the new version


def test_pool_evicts_least_recently_used_blocks(tiny_llama):
    e = engine(tiny_llama, max_batch=2, prefix_cache_tokens=3 * BLOCK)
    a, b = [11] * 9, [12] * 9  # two full blocks each
    for prompt in (a, b, a):  # b evicts a's blocks; a comes back, evicting b's
        e.generate([prompt], [SamplingParams(max_tokens=1, seed=0)])
    stats = e.stats()
    assert stats["prefix_blocks_in_use"] <= 3 and stats["prefix_blocks_evicted"] > 0
    pool = e.prefix.pool
    assert len(pool.match(a + [1], 9)) == 2 and pool.match(b + [1], 9) == []


def test_prefix_cache_matches_exact_prefixes_only():
    pool = PrefixCache([(1, 2)], num_blocks=8, block_size=2, dtype=torch.float32, device=torch.device("cpu"))
    from srt_agent.runner.kv_cache import KVCache

    kv = KVCache([(1, 2)], num_slots=1, capacity=8, dtype=torch.float32, device=torch.device("cpu"))
    kv.keys[0][0, 0, :, 0] = torch.arange(8.0)
    pool.store([1, 2, 3, 4, 5, 6], 3, kv, 0)
    assert len(pool.match([1, 2, 3, 4, 5, 6, 7], 7)) == 3
    assert len(pool.match([1, 2, 3, 4, 5, 6], 5)) == 2  # never past the limit
    assert pool.match([9, 9, 3, 4], 4) == []  # the same block after another prefix is another block
    assert len(pool.match([1, 2, 9, 9, 5, 6], 6)) == 1
    into = KVCache([(1, 2)], num_slots=2, capacity=8, dtype=torch.float32, device=torch.device("cpu"))
    tokens = [1, 2, 3, 4, 0]
    pool.load(pool.match(tokens, 4), tokens, into, 1)
    assert into.keys[0][1, 0, :4, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    pool.clear()
    assert pool.match([1, 2, 3, 4], 4) == [] and pool.blocks_in_use == 0


def test_bad_prefix_options_are_refused(tiny_llama):
    with pytest.raises(ValueError, match="prefix_block_size"):
        Engine(tiny_llama, EngineOptions(drafter=None, prefix_block_size=0, calibrate=False))


@pytest.mark.slow
def test_smollm2_float32_sharing_emits_the_same_tokens(smollm2):
    """Real model in float32: a prefix computed in another pass (another batch shape) gives KV that may
    differ in the last bits; on this workload (a shared system prompt, groups of 4) no sample flips."""
    tok = smollm2.tokenizer
    system = "You are a careful assistant. Think step by step, then give the final answer in <answer></answer> tags."
    questions = ["What is 17 * 23?", "Name three colors.", "What is 2 ** 10 - 1?"]
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=False,
            )
        )
        for q in questions
        for _ in range(4)
    ]
    params = [SamplingParams(temperature=1.0, max_tokens=24, seed=i) for i in range(len(prompts))]
    runs = {}
    for sharing in (False, True):
        e = Engine(
            smollm2,
            EngineOptions(drafter="srt", max_batch=12, max_context=256, prefix_sharing=sharing, calibrate=False),
        )
        runs[sharing] = e.generate(prompts, params)
    assert [o.token_ids for o in runs[True]] == [o.token_ids for o in runs[False]]
    for a, b in zip(runs[False], runs[True]):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
    assert e.stats()["prefill_hit_rate"] > 0.5
