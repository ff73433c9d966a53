"""Run-ahead: idle capacity fills the trees of coming prompts, invisibly and always after real work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from srt_agent.drafting import make_drafter
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.engine.options import RunAheadOptions
from srt_agent.engine.run_ahead import WindowPrompt, branch_points, common_prefix

PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12]]
UPCOMING = [[20, 21, 22, 23], [30, 31]]


pytestmark = pytest.mark.usefixtures("one_thread")


def window(params: SamplingParams) -> list[WindowPrompt]:
    current = [WindowPrompt(f"p{i}", p, params, upcoming=False) for i, p in enumerate(PROMPTS)]
    return current + [WindowPrompt(f"u{i}", p, params) for i, p in enumerate(UPCOMING)]


def engine(model, run_ahead: RunAheadOptions | None, **kw) -> Engine:
    # A fixed cost table: every row costs the same, so the slack decides how many rows ride along.
    e = Engine(
        model,
        EngineOptions(
            drafter=kw.pop("drafter", "srt"),
            max_batch=kw.pop("max_batch", 8),
            max_context=128,
            calibrate=False,
            run_ahead=run_ahead,
            **kw,
        ),
    )
    e.cost_model.calibrate([(1, 0.010, 1), (2, 0.011, 2), (8, 0.018, 8)])
    e.cost_model.observe = lambda *args, **kwargs: None  # measured steps of a loaded machine would move the table
    return e


def rollouts(e: Engine, steps: int = 2) -> list[list]:
    """Two "RL steps" of GRPO groups (3 prompts x 2 samples, lengths differ so the batch thins out)."""
    outs = []
    params = SamplingParams(temperature=0.8, max_tokens=24, seed=0)
    for step in range(steps):
        if e.run_ahead is not None:
            e.run_ahead.open(window(params))
        ps = [SamplingParams(temperature=0.8, max_tokens=6 + 5 * i, seed=100 * step + i) for i in range(6)]
        got = e.generate([PROMPTS[i % 3] for i in range(6)], ps, prompt_keys=[f"p{i % 3}" for i in range(6)])
        outs.append([(o.token_ids, o.logprobs, o.finish_reason) for o in got])
        if e.run_ahead is not None:
            e.run_ahead.close()
        e.end_step()
    return outs


def test_run_ahead_changes_no_token_and_no_figure_of_real_work(tiny_llama):
    plain = engine(tiny_llama, None, adaptive_drafts=False)
    ahead = engine(tiny_llama, RunAheadOptions(slack=0.5, tokens_per_sequence=6), adaptive_drafts=False)
    with_ahead, without = rollouts(ahead), rollouts(plain)
    assert [[(t, f) for t, _, f in step] for step in with_ahead] == [[(t, f) for t, _, f in step] for step in without]
    for step_a, step_b in zip(with_ahead, without):  # log-probs too (batch shapes differ: float64 rounding only)
        for (_, a, _), (_, b, _) in zip(step_a, step_b):
            assert a == pytest.approx(b, abs=1e-9)
    # Real requests draft from run-ahead content too: more drafts, never fewer tokens or more steps.
    assert ahead.stats()["tokens"] == plain.stats()["tokens"]
    assert ahead.stats()["draft_proposed"] > plain.stats()["draft_proposed"]
    assert ahead.stats()["steps"] <= plain.stats()["steps"]
    st = ahead.run_ahead.stats
    assert st.tokens > 0 and st.tokens_by_bubble["tail"] == st.tokens and st.shared_rows > 0
    assert st.copied_tokens > 0  # current prompts start from a live sibling's KV
    assert st.tokens_upcoming > 0 and st.prefill_tokens > 0  # look-ahead prompts are prefilled
    cache = ahead.drafter.cache.stats()
    assert cache.run_ahead_tokens > 0 and cache.run_ahead_sequences == st.sequences
    # Run-ahead content is in the look-ahead prompts' trees, never under a request id of real work.
    assert "u0" in ahead.drafter.cache and not any(k.startswith("run-ahead") for k in ahead.sequences)


def test_run_ahead_feeds_the_hybrid_drafter_s_trees(tiny_llama):
    plain = engine(tiny_llama, None, adaptive_drafts=False)
    ahead = engine(
        tiny_llama, RunAheadOptions(slack=0.5, tokens_per_sequence=6), adaptive_drafts=False, drafter="srt+self"
    )
    with_ahead, without = rollouts(ahead), rollouts(plain)
    assert [[(t, f) for t, _, f in step] for step in with_ahead] == [[(t, f) for t, _, f in step] for step in without]
    assert ahead.run_ahead.stats.tokens > 0 and ahead.drafter.cache.stats().run_ahead_tokens > 0
    assert ahead.stats()["model_drafted"] > 0 and ahead.stats()["drafter_errors"] == 0


class DraftLog:
    """Every draft a real request gets, with the nodes only run-ahead content supports (no real sequence
    in the trees holds the matched context followed by the node's path), and what each request emitted."""

    def __init__(self, e: Engine):
        cache, draft, generate = e.drafter.cache, e.drafter.draft, e.generate
        self.drafts: list = []
        self.emitted: dict = {}  # request id -> prompt + output tokens

        def recording_draft(request_id, context, budget):
            d = draft(request_id, context, budget)
            real = [s for key in cache.prompt_keys() for s in cache.sequences(key, run_ahead=False)]
            head = list(context[len(context) - d.match_len :])
            only_run_ahead = [not any(contains(s, head + d.path_to(i)) for s in real) for i in range(len(d))]
            self.drafts.append((request_id, len(context), d, only_run_ahead))
            return d

        def recording_generate(prompts, params=None, prompt_keys=None, progress=False):
            outputs = generate(prompts, params, prompt_keys, progress)
            self.emitted.update({o.request_id: p + o.token_ids for p, o in zip(prompts, outputs)})
            return outputs

        e.drafter.draft, e.generate = recording_draft, recording_generate

    def accepted_from_run_ahead(self) -> int:
        """Run-ahead-only draft nodes whose path the request went on to emit: accepted by real work."""
        count = 0
        for request_id, at, d, only_run_ahead in self.drafts:
            tokens = self.emitted[request_id]
            for i, flag in enumerate(only_run_ahead):
                path = d.path_to(i)
                count += flag and tokens[at : at + len(path)] == path
        return count


def contains(sequence: list[int], part: list[int]) -> bool:
    return any(sequence[i : i + len(part)] == part for i in range(len(sequence) - len(part) + 1))


def look_ahead_then_serve(e: Engine, temperature: float) -> list:
    """Step 1: the current prompts' groups, with the next step's prompts in the run-ahead window.
    Step 2: the next step's prompts are served (two samples each). Every request's output, in order."""
    params = SamplingParams(temperature=temperature, max_tokens=24, seed=0)
    e.run_ahead.open(window(params))
    ps = [SamplingParams(temperature=temperature, max_tokens=6 + 5 * i, seed=i) for i in range(6)]
    first = e.generate([PROMPTS[i % 3] for i in range(6)], ps, prompt_keys=[f"p{i % 3}" for i in range(6)])
    e.run_ahead.close()
    e.end_step()
    ps = [SamplingParams(temperature=temperature, max_tokens=16, seed=10 + i) for i in range(4)]
    second = e.generate([UPCOMING[i % 2] for i in range(4)], ps, prompt_keys=[f"u{i % 2}" for i in range(4)])
    return [(o.token_ids, o.logprobs, o.finish_reason) for o in first + second]


def _prompt_trees_only():
    return make_drafter("srt", global_fallback=False)


def test_slack_bounds_the_rows_that_ride_along_and_real_requests_accept_their_tokens(tiny_llama):
    """Slack 0 runs nothing ahead. With slack, step 1's idle rows fill the next prompts' trees; in step 2
    their real requests accept draft tokens that only run-ahead content put there, while what the
    requests emit (the training data) is token for token what they emit without run-ahead."""
    # Drafts are all verified (no adaptive pruning), so a logged draft node is accepted iff emitted. SRT runs
    # without its global tree, which would draft other prompts' responses for both engines alike and blur what
    # run-ahead content adds to the prompts' own trees.
    none = engine(tiny_llama, RunAheadOptions(slack=0.0), adaptive_drafts=False, drafter=_prompt_trees_only())
    plain = look_ahead_then_serve(none, temperature=0.3)
    assert none.run_ahead.stats.tokens == 0
    # 10 ms per sequence-step, 1 ms per extra row: 5% of a 1-sequence step is half a row, 30% is three.
    few = engine(tiny_llama, RunAheadOptions(slack=0.3), adaptive_drafts=False, drafter=_prompt_trees_only())
    log = DraftLog(few)
    served = look_ahead_then_serve(few, temperature=0.3)
    assert few.run_ahead.stats.tokens_upcoming > 0
    assert log.accepted_from_run_ahead() > 0
    assert few.stats()["draft_accepted"] > none.stats()["draft_accepted"]
    # Run-ahead tokens never become output: the same tokens, ends, log-probs and token counts.
    assert [(t, f) for t, _, f in served] == [(t, f) for t, _, f in plain]
    for (_, a, _), (_, b, _) in zip(served, plain):
        assert a == pytest.approx(b, abs=1e-9)
    assert few.stats()["tokens"] == none.stats()["tokens"] == sum(len(t) for t, _, _ in served)


def test_a_real_request_takes_the_slot_at_the_next_step(tiny_llama):
    e = engine(tiny_llama, RunAheadOptions(slack=5.0, tokens_per_sequence=50), max_batch=2)
    params = SamplingParams(temperature=0.8, max_tokens=30, seed=1)
    e.run_ahead.open(window(params))
    e.add_request(PROMPTS[0], params, "a", prompt_key="p0")
    e.step()
    e.step()
    assert len(e.run_ahead.active) == 1 and not e.scheduler.free_slots  # run-ahead holds the second slot
    e.add_request(PROMPTS[1], params, "b", prompt_key="p1")
    e.step()
    assert {s.request_id for s in e.scheduler.running} == {"a", "b"}
    assert not e.run_ahead.active and e.run_ahead.stats.preempted == 1


def test_tool_waits_are_filled_and_the_parked_sequence_keeps_its_kv(tiny_llama):
    e = engine(tiny_llama, RunAheadOptions(slack=0.2, tokens_per_sequence=4), max_batch=4)
    params = SamplingParams(temperature=0.8, max_tokens=5, seed=2)
    e.add_request(PROMPTS[0], params, "a", prompt_key="p0")
    while not e.scheduler.held:
        e.step()
    assert not e.has_work()  # no window: an idle engine stays idle
    e.run_ahead.open(window(params))
    assert e.has_work()  # "a" is parked on its tool: a bubble
    while e.has_work():
        e.step()
    st = e.run_ahead.stats
    assert st.alone_steps > 0 and st.tokens_by_bubble["tools"] == st.tokens > 0
    assert e.stats()["steps"] == 5  # run-ahead passes alone are not steps of real work
    held = e.scheduler.held["a"]
    assert held.slot is not None and held.num_cached > 0
    e.run_ahead.close()
    assert not e.has_work()


def test_budget_weight_updates_and_drafters_without_trees(tiny_llama):
    e = engine(tiny_llama, RunAheadOptions(slack=5.0, tokens_per_sequence=50, budget_tokens=7))
    rollouts(e, steps=1)
    assert e.run_ahead.stats.tokens == 7
    e.run_ahead.open(window(SamplingParams(seed=0)))
    e.add_request(PROMPTS[0], SamplingParams(max_tokens=3, seed=1), "a", prompt_key="p0")
    e.step()
    assert e.run_ahead.active
    e.update_weights(tiny_llama.model)  # new weights: run-ahead KV is stale
    assert not e.run_ahead.active and e.run_ahead.stats.dropped > 0
    with pytest.raises(ValueError, match="keeps per-prompt trees"):
        Engine(tiny_llama, EngineOptions(drafter="ngram", max_context=64, calibrate=False, run_ahead=RunAheadOptions()))
    with pytest.raises(ValueError, match="unknown run-ahead bubble"):
        RunAheadOptions(bubbles=("tail", "lunch"))
    with pytest.raises(ValueError, match="unknown run-ahead phase"):
        e.run_ahead.open([], phase="later")


def test_branch_start_continues_where_rollouts_disagreed(tiny_llama):
    assert branch_points([[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3, 9]]) == [(0, 1), (0, 2)]
    assert branch_points([[1, 2], [1, 2]]) == [] and common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix(list(range(100)), list(range(100)), limit=40) == 40
    e = engine(tiny_llama, RunAheadOptions(slack=5.0, tokens_per_sequence=3, start="branch"))
    # Earlier rollouts of u0 agreed on 40, 41 and split there (a random model's siblings split at once).
    tail = e.drafter.cache.prompt_tail(UPCOMING[0])
    for response in ([40, 41, 42, 43], [40, 41, 50], [40, 41, 42, 60]):
        e.drafter.cache.add_sequence("u0", tail + response)
    params = SamplingParams(temperature=0.8, seed=0)
    e.run_ahead.open([WindowPrompt("u0", UPCOMING[0], params)])
    e.add_request(PROMPTS[0], SamplingParams(max_tokens=12, seed=1), "a", prompt_key="p0")
    while e.has_unfinished():
        e.step()
    contexts = [c for k, c, _ in e.run_ahead.written if k == "u0"]
    assert contexts and e.run_ahead.stats.starts_from_branch >= len(contexts)
    assert {tuple(c[len(UPCOMING[0]) :]) for c in contexts} <= {(40, 41), (40, 41, 42)}


def test_drafter_protocol_and_cache_marks(tiny_llama):
    drafter = make_drafter("srt", max_depth=16, max_match=4)
    drafter.start_run_ahead("r", "k", [1, 2, 3])
    drafter.add_tokens("r", [4, 5])
    drafter.stop_request("r")
    assert drafter.cache.sequences("k") == [[1, 2, 3, 4, 5]] and drafter.cache.sequences("k", run_ahead=False) == []


@pytest.mark.parametrize("kind", ["forward raises", "NaN logits"])
def test_a_model_fault_in_a_run_ahead_row_costs_real_work_nothing(tiny_llama, kind):
    """A look-ahead prompt whose tokens break the forward pass (raise) or its logits (NaN): the real
    requests' tokens are those of an engine without run-ahead, and the prompt is not run ahead again."""
    poison = 99
    embeddings = tiny_llama.model.get_input_embeddings()

    def raise_on_poison(module, args):
        if bool((args[0] == poison).any()):
            raise RuntimeError("injected: the pass met the poison token")

    def nan_on_poison(module, args, output):
        return output.masked_fill((args[0] == poison).unsqueeze(-1), float("nan"))

    hook = (
        embeddings.register_forward_pre_hook(raise_on_poison)
        if kind == "forward raises"
        else embeddings.register_forward_hook(nan_on_poison)
    )
    try:
        params = SamplingParams(temperature=0.8, max_tokens=12, seed=3)
        outs = {}
        for options in (None, RunAheadOptions(slack=5.0, tokens_per_sequence=4)):
            e = engine(tiny_llama, options, adaptive_drafts=False)
            if e.run_ahead is not None:
                e.run_ahead.open([WindowPrompt("bad", [poison, 5, 6], params)])
            got = e.generate(
                [PROMPTS[0], PROMPTS[1]], [replace(params, seed=s) for s in (1, 2)], prompt_keys=["p0", "p1"]
            )
            outs[options is None] = [(o.token_ids, o.finish_reason) for o in got]
        assert outs[True] == outs[False] and all(f != "error" for _, f in outs[False])
        st = e.run_ahead.stats
        assert st.sequences >= 1 and st.tokens == 0 and e.stats()["model_errors"] == 0
        if kind == "forward raises":
            assert e.run_ahead.window == [] and st.steps == 1  # left out of the window after one failed pass
    finally:
        hook.remove()
