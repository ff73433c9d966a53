"""Request handling: multi-turn continuation with forced tokens, stops, limits, batching, bad input,
weight updates, eviction and the async front."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from srt_agent.drafting import Draft, make_drafter
from srt_agent.drafting.tokens import check_tokens
from srt_agent.engine import AsyncEngine, Engine, EngineOptions, SamplingParams
from srt_agent.engine.params import check_prompt
from srt_agent.models import LoadedModel, tiny_random_model

PROMPT = [5, 17, 33, 2, 99, 140]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_text(smollm2_tokenizer):
    """A tiny random Llama over SmolLM2's tokenizer, for tests that need text."""
    return tiny_random_model("llama", seed=2, tokenizer=smollm2_tokenizer)


class RecordingDrafter:
    """Wraps a drafter and records the calls the engine makes."""

    def __init__(self, inner):
        self.inner, self.name, self.calls = inner, inner.name, []

    def start_request(self, request_id, prompt_key, prompt_ids):
        self.calls.append(("start", request_id, prompt_key, list(prompt_ids)))
        self.inner.start_request(request_id, prompt_key, prompt_ids)

    def add_tokens(self, request_id, token_ids):
        self.calls.append(("add", request_id, list(token_ids)))
        self.inner.add_tokens(request_id, token_ids)

    def draft(self, request_id, context, budget):
        return self.inner.draft(request_id, context, budget)

    def stop_request(self, request_id):
        self.calls.append(("stop", request_id))
        self.inner.stop_request(request_id)

    def end_step(self):
        self.calls.append(("end_step",))
        self.inner.end_step()


def one(engine, prompt, params, request_id=None, **kw):
    """Run a single request to completion with add_request/step."""
    rid = engine.add_request(prompt, params, request_id, **kw)
    while True:
        for out in engine.step():
            if out.request_id == rid:
                return out


def test_forced_tokens_continue_a_held_sequence(tiny_llama):
    drafter = RecordingDrafter(make_drafter("srt"))
    engine = Engine(tiny_llama, EngineOptions(drafter=drafter, max_context=128))
    turn1 = one(engine, PROMPT, SamplingParams(max_tokens=10, seed=1), "traj")
    tool = [200, 201, 202, 203]
    history = PROMPT + turn1.token_ids + tool
    turn2 = one(engine, history, SamplingParams(max_tokens=12, seed=1), "traj")
    # The KV of turn 1 was reused: only the last sampled token and the forced tokens were fed.
    assert turn2.metrics.forced_tokens == len(tool)
    assert turn2.metrics.prefill_tokens == len(tool)
    assert ("add", "traj", tool) in drafter.calls
    added = [t for c in drafter.calls if c[0] == "add" for t in c[2]]
    assert added == turn1.token_ids + tool + turn2.token_ids  # every emitted and forced token, in order
    # Identical to a fresh request over the full history with the same seed (positions are absolute).
    fresh = Engine(tiny_llama, EngineOptions(drafter=None, max_context=128))
    ref = one(fresh, history, SamplingParams(max_tokens=12, seed=1))
    assert turn2.token_ids == ref.token_ids
    assert turn2.logprobs == pytest.approx(ref.logprobs, abs=1e-9)
    assert ref.metrics.prefill_tokens == len(history) - 1
    # A different history under the same id starts over, with a new prompt key.
    other = one(engine, [9, 9, 9], SamplingParams(max_tokens=3, seed=1), "traj")
    assert len(other.token_ids) == 3 and ("stop", "traj") in drafter.calls
    engine.release("traj")
    assert drafter.calls[-1] == ("stop", "traj")


class Oracle(RecordingDrafter):
    """Drafts the true continuation (known from a plain run) as a chain: every draft is accepted."""

    def __init__(self, truth):
        super().__init__(make_drafter("none"))
        self.truth = truth

    def draft(self, request_id, context, budget):
        context = list(context)
        if self.truth[: len(context)] != context:
            return Draft()
        rest = self.truth[len(context) : len(context) + budget]
        return Draft(rest, list(range(-1, len(rest) - 1)), [1.0] * len(rest))


def test_stop_inside_an_accepted_draft_then_a_continuation(tiny_llama):
    """A stop token in the middle of an accepted multi-token draft, then a multi-turn continuation: the
    KV of the accepted nodes after the stop must not count as cached for the forced tokens."""
    free = one(
        Engine(tiny_llama, EngineOptions(drafter=None, max_context=128)), PROMPT, SamplingParams(max_tokens=20, seed=4)
    )
    stop = free.token_ids[5]
    first = free.token_ids.index(stop)
    engine = Engine(
        tiny_llama,
        EngineOptions(
            drafter=Oracle(PROMPT + free.token_ids), max_context=128, adaptive_drafts=False, max_draft_tokens=8
        ),
    )
    turn1 = one(engine, PROMPT, SamplingParams(max_tokens=20, seed=4, stop_token_ids=[stop]), "t")
    assert turn1.token_ids == free.token_ids[: first + 1] and turn1.finish_reason == "stop"
    assert turn1.metrics.forwards == 1 and turn1.metrics.draft_accepted == first + 1  # the stop came mid-draft
    tool = [200, 201, 202]
    history = PROMPT + turn1.token_ids + tool
    turn2 = one(engine, history, SamplingParams(max_tokens=6, seed=4), "t")
    ref = one(
        Engine(tiny_llama, EngineOptions(drafter=None, max_context=128)), history, SamplingParams(max_tokens=6, seed=4)
    )
    assert turn2.token_ids == ref.token_ids
    assert turn2.metrics.prefill_tokens == len(tool)


def test_evicted_sequence_is_prefilled_again(tiny_llama):
    engine = Engine(tiny_llama, EngineOptions(drafter=None, max_batch=2, max_context=64))
    a = one(engine, PROMPT, SamplingParams(max_tokens=5, seed=1), "a")
    one(engine, [1, 2], SamplingParams(max_tokens=5, seed=2), "b")
    assert engine.idle_capacity() == 2  # held sequences are evictable
    one(engine, [3, 4], SamplingParams(max_tokens=5, seed=3), "c")  # evicts "a", the least recent
    assert "a" not in engine.scheduler.held
    history = PROMPT + a.token_ids + [7, 8]
    cont = one(engine, history, SamplingParams(max_tokens=6, seed=4), "a")
    assert cont.metrics.prefill_tokens == len(history) - 1
    ref = one(
        Engine(tiny_llama, EngineOptions(drafter=None, max_context=64)), history, SamplingParams(max_tokens=6, seed=4)
    )
    assert cont.token_ids == ref.token_ids


def test_stop_strings_end_mid_token(tiny_text):
    tok = tiny_text.tokenizer
    base = SamplingParams(max_tokens=40, seed=11)
    free = Engine(tiny_text, EngineOptions(drafter=None, max_context=128)).generate([PROMPT], base)[0]
    pieces = [tok.decode([t]) for t in free.token_ids]

    def usable(i):  # a 3+ character token whose first two characters first appear in it
        text = "".join(pieces[: i + 1])
        clean = text == tok.decode(free.token_ids[: i + 1])
        return i >= 3 and clean and len(pieces[i]) >= 3 and pieces[i][:2] not in text[: -len(pieces[i]) + 1]

    at = next(i for i in range(len(pieces)) if usable(i))
    stop, prefix = pieces[at][:2], "".join(pieces[:at])
    for include in (True, False):
        engine = Engine(tiny_text, EngineOptions(drafter="srt", max_context=128))
        params = SamplingParams(
            max_tokens=40, seed=11, stop=["never-in-output-xyz", stop], include_stop_str_in_output=include
        )
        out = engine.generate([PROMPT], params)[0]
        assert out.finish_reason == "stop" and out.stop_reason == stop
        assert out.token_ids == free.token_ids[: at + 1]  # the token completing the stop string is kept
        assert out.text == (prefix + stop if include else prefix)


def test_stop_token_ids_eos_and_limits(tiny_llama):
    params = SamplingParams(max_tokens=30, seed=5)
    free = Engine(tiny_llama, EngineOptions(drafter=None, max_context=128)).generate([PROMPT], params)[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 30
    stop_token = free.token_ids[7]
    first = free.token_ids.index(stop_token)
    engine = Engine(tiny_llama, EngineOptions(drafter="ngram", max_context=128))
    out = engine.generate([PROMPT], SamplingParams(max_tokens=30, seed=5, stop_token_ids=[stop_token]))[0]
    assert (out.finish_reason, out.stop_reason, out.token_ids) == ("stop", stop_token, free.token_ids[: first + 1])
    with_eos = LoadedModel(tiny_llama.model, None, "tiny", "random", eos_token_ids=[stop_token])
    eng = Engine(with_eos, EngineOptions(drafter=None, max_context=128))
    out = eng.generate([PROMPT], params)[0]
    assert (out.finish_reason, out.stop_reason, len(out.token_ids)) == ("eos", stop_token, first + 1)
    out = eng.generate([PROMPT], SamplingParams(max_tokens=30, seed=5, ignore_eos=True))[0]
    assert out.token_ids == free.token_ids
    small = Engine(tiny_llama, EngineOptions(drafter=None, max_context=len(PROMPT) + 9))
    out = small.generate([PROMPT], params)[0]
    assert (out.finish_reason, out.token_ids) == ("context", free.token_ids[:9])


def test_batching_is_invisible(tiny_llama):
    """Mixed lengths, requests joining mid-flight and queueing behind a full batch: each request's
    output equals its output when run alone."""
    prompts = [PROMPT, [1], list(range(30, 70)), [8, 9, 10], [11, 12] * 10, [200]]
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=m, seed=i) for i, m in enumerate([12, 3, 20, 15, 7, 10])
    ]
    alone = [
        one(Engine(tiny_llama, EngineOptions(drafter=None, max_context=128)), p, sp) for p, sp in zip(prompts, params)
    ]
    engine = Engine(tiny_llama, EngineOptions(drafter="suffix", max_batch=3, max_context=128))
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts[:2], params[:2])]
    outputs = {}
    for step in range(200):
        if step == 2:  # join mid-flight; the batch is full, so some wait
            ids += [engine.add_request(p, sp) for p, sp in zip(prompts[2:], params[2:])]
        outputs.update({o.request_id: o for o in engine.step()})
        if len(outputs) == len(prompts):
            break
    for rid, ref in zip(ids, alone):
        assert outputs[rid].token_ids == ref.token_ids
        assert outputs[rid].logprobs == pytest.approx(ref.logprobs, abs=1e-9)


def test_bad_requests_do_not_stop_good_ones(tiny_llama):
    engine = Engine(tiny_llama, EngineOptions(drafter="srt", max_context=32))
    good = SamplingParams(max_tokens=5, seed=1)
    prompts = [PROMPT, [], [1, 2, 10**6], list(range(40)), PROMPT, [1, -3]]
    params = [good, good, good, good, SamplingParams(max_tokens=5, seed=1, stop=["x"]), good]
    outs = engine.generate(prompts, params)
    assert [o.finish_reason for o in outs] == ["length", "error", "error", "error", "error", "error"]
    assert "empty prompt" in outs[1].error and "vocabulary" in outs[2].error and "no room" in outs[3].error
    assert "tokenizer" in outs[4].error and "vocabulary" in outs[5].error
    assert len(outs[0].token_ids) == 5
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request([], good)
    for bad in (
        dict(temperature=-1),
        dict(temperature=float("inf")),
        dict(top_p=0),
        dict(top_k=-2),
        dict(max_tokens=0),
        dict(seed="x"),
        dict(stop=[""]),
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(ValueError, match="params must be SamplingParams"):
        engine.add_request(PROMPT, {"max_tokens": 5})


def test_a_request_keeps_the_params_it_was_given(tiny_llama):
    """The engine copies and checks params at add_request: changing the caller's object later (even to
    something invalid) does not reach the running request."""
    params = SamplingParams(max_tokens=12, seed=3)
    ref = Engine(tiny_llama, EngineOptions(drafter=None, max_context=64)).generate(
        [PROMPT], SamplingParams(max_tokens=12, seed=3)
    )[0]
    engine = Engine(tiny_llama, EngineOptions(drafter="srt", max_context=64))
    rid = engine.add_request(PROMPT, params)
    engine.step()
    params.temperature, params.top_k, params.max_tokens = "hot", -1, 2
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    (out,) = outs
    assert out.request_id == rid and out.token_ids == ref.token_ids


def test_weight_update_changes_outputs_and_keeps_trees():
    model = tiny_random_model("llama", seed=0)
    srt = make_drafter("srt")
    engine = Engine(model, EngineOptions(drafter=srt, max_context=64))
    params = [SamplingParams(max_tokens=10, seed=s) for s in range(4)]
    before = engine.generate([PROMPT] * 4, params)
    held = one(engine, PROMPT, SamplingParams(max_tokens=4, seed=9), "held")
    tokens = srt.cache.stats().tokens
    original = {k: v.clone() for k, v in model.model.state_dict().items()}
    other = tiny_random_model("llama", seed=7).model
    engine.update_weights(other)
    engine.end_step()
    after = engine.generate([PROMPT] * 4, params)
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    ref = Engine(tiny_random_model("llama", seed=7), EngineOptions(drafter=None, max_context=64)).generate(
        [PROMPT] * 4, params
    )
    assert [o.token_ids for o in after] == [o.token_ids for o in ref]
    assert srt.cache.stats().tokens >= tokens > 0  # the trees survived the update
    # The held sequence re-prefills under the new policy.
    cont = one(engine, PROMPT + held.token_ids, SamplingParams(max_tokens=5, seed=9), "held")
    fresh = one(
        Engine(tiny_random_model("llama", seed=7), EngineOptions(drafter=None, max_context=64)),
        PROMPT + held.token_ids,
        SamplingParams(max_tokens=5, seed=9),
    )
    assert cont.token_ids == fresh.token_ids
    engine.update_weights(original)
    again = engine.generate([PROMPT] * 4, params)
    assert [o.token_ids for o in again] == [o.token_ids for o in before]
    assert engine.stats()["draft_accepted"] > 0  # the old trees still draft for the old policy


def test_async_engine_serves_many_coroutines(tiny_llama):
    params = [SamplingParams(max_tokens=6 + i % 5, seed=i) for i in range(12)]
    prompts = [PROMPT[: 1 + i % 6] for i in range(12)]
    ref = Engine(tiny_llama, EngineOptions(drafter=None, max_context=64)).generate(prompts, params)
    front = AsyncEngine(Engine(tiny_llama, EngineOptions(drafter="srt", max_batch=4, max_context=64)))

    async def trajectory(i):
        first = await front.generate(f"r{i}", prompts[i], params[i])
        second = await front.generate(
            f"r{i}", prompts[i] + first.token_ids + [1, 2], SamplingParams(max_tokens=3, seed=i)
        )
        front.release(f"r{i}")
        return first, second

    async def main():
        results = await asyncio.gather(*(trajectory(i) for i in range(12)))
        bad = await front.generate("bad", [], params[0])
        twice = await asyncio.gather(
            *(front.generate("dup", PROMPT, SamplingParams(max_tokens=20, seed=1)) for _ in range(2))
        )
        front.release("dup")
        return results, bad, twice

    try:
        results, bad, twice = asyncio.run(main())
    finally:
        front.close()
    assert sorted(o.finish_reason for o in twice) == ["error", "length"]  # one id, one running call
    assert [r[0].token_ids for r in results] == [o.token_ids for o in ref]
    assert all(len(r[1].token_ids) == 3 for r in results)
    assert bad.finish_reason == "error" and "empty prompt" in bad.error
    assert front.engine.sequences.keys() <= {"bad"} and not front.engine.has_unfinished()


def test_releasing_a_running_request_answers_its_caller(tiny_llama):
    """A request released while it runs is cancelled, and whoever awaits it gets an "error" output (not a wait
    forever); the engine serves the next request as usual."""
    front = AsyncEngine(Engine(tiny_llama, EngineOptions(drafter="srt", max_batch=4, max_context=64)))

    async def main():
        running = asyncio.ensure_future(front.generate("long", PROMPT, SamplingParams(max_tokens=50, seed=1)))
        await asyncio.sleep(0)  # submitted
        front.release("long")
        released = await asyncio.wait_for(running, 60)
        after = await front.generate("next", PROMPT, SamplingParams(max_tokens=4, seed=1))
        return released, after

    try:
        released, after = asyncio.run(main())
    finally:
        front.close()
    assert released.finish_reason in ("error", "length")  # released mid-run, or (on a fast machine) already done
    if released.finish_reason == "error":
        assert "released" in released.error
    assert after.finish_reason == "length" and len(after.token_ids) == 4


def test_the_tail_counts_the_steps_with_few_sequences_running(tiny_llama):
    """Six requests of 2 to 12 tokens: the steps with 5 or 6 running are not the tail, the rest are; every
    generated token is counted once, in the step that made it."""
    engine = Engine(tiny_llama, EngineOptions(drafter=None, max_context=128, max_batch=8))
    lengths = [2, 4, 6, 8, 10, 12]
    for i, n in enumerate(lengths):
        engine.add_request(PROMPT, SamplingParams(max_tokens=n, seed=i, ignore_eos=True), f"r{i}")
    while engine.has_work():
        engine.step()
    tail = engine.stats()["tail"]
    assert tail["steps"] == engine.stats()["steps"] == max(lengths)
    assert tail["step_tokens"] == sum(lengths)
    # steps 1-2 run six sequences, 3-4 five: the tail is steps 5-12 (4, 3, 2, 1 sequences)
    assert tail["tail_steps"] == max(lengths) - 4
    assert tail["tail_tokens"] == sum(lengths) - 6 * 2 - 5 * 2
    assert 0 < tail["tail_s"] < tail["step_s"]
    by_running = {r: load["tokens"] for r, load in tail["by_running"].items()}
    assert by_running == {"6": 12, "5": 10, "4": 8, "3": 6, "2": 4, "1": 2}  # two steps at each count


def test_a_prompt_takes_the_token_ids_the_trees_take():
    """check_prompt and the trees' check_tokens agree: numpy and torch integers are token ids, bools and
    floats are not."""
    integers = [np.int64(3), np.int32(4), torch.tensor(5), 6]
    assert check_prompt(integers, vocab_size=256, max_context=32) == check_tokens(integers) == [3, 4, 5, 6]
    assert all(type(t) is int for t in check_prompt(integers, vocab_size=256, max_context=32))
    for bad in ([1, True], [1, 2.0], [1, np.float32(2)]):
        with pytest.raises(ValueError, match="vocabulary"):
            check_prompt(bad, vocab_size=256, max_context=32)
        with pytest.raises(ValueError, match="bool|not an integer"):
            check_tokens(bad)
