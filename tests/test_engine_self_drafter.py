"""The self-drafter: a quantized copy of the policy that follows every weight update, drafts only
where the plan says it pays, and never changes what the engine emits."""

from __future__ import annotations

import pytest
import torch

from srt_agent.drafting import make_drafter
from srt_agent.drafting.choice.cost_model import ForwardCostModel
from srt_agent.drafting.draft import Draft
from srt_agent.drafting.drafters.model_drafting import chain_gain, plan_model_drafts
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.models import tiny_random_model
from srt_agent.runner.quantize import keeps_float, quantized_copy

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_quantized_copy_keeps_the_policy_and_the_mlp_output_in_float(tiny_llama):
    before = {k: v.clone() for k, v in tiny_llama.model.state_dict().items()}
    copy = quantized_copy(tiny_llama.model, "int8")
    assert all(torch.equal(before[k], v) for k, v in tiny_llama.model.state_dict().items())
    kinds = {name: type(m).__name__ for name, m in copy.named_modules() if "proj" in name or name == "lm_head"}
    assert all(
        kind == "Linear" and type(copy.get_submodule(n)) is torch.nn.Linear
        for n, kind in kinds.items()
        if keeps_float(n)
    )
    quantized = [n for n in kinds if not keeps_float(n)]
    assert quantized and all("quantized" in type(copy.get_submodule(n)).__module__ for n in quantized)
    assert keeps_float("model.layers.0.mlp.down_proj") and not keeps_float("model.layers.0.self_attn.o_proj")


def test_bad_quantization_is_refused():
    with pytest.raises(ValueError, match="unknown quantization"):
        make_drafter("self", quantization="int3")
    with pytest.raises(ValueError, match="tree_width"):
        make_drafter("self", tree_width=0)
    with pytest.raises(ValueError, match="CUDA"):
        Engine(
            tiny_random_model("llama"),
            EngineOptions(
                drafter=make_drafter("self", quantization="int4"), max_batch=2, max_context=32, calibrate=False
            ),
        )


def generate(model, drafter, temperature=1.0):
    engine = Engine(
        model,
        EngineOptions(
            drafter=drafter, max_batch=4, max_context=64, max_draft_tokens=6, adaptive_drafts=False, calibrate=False
        ),
    )
    params = [SamplingParams(temperature=temperature, max_tokens=20, seed=7 + i) for i in range(len(PROMPTS))]
    return engine, [o.token_ids for o in engine.generate(PROMPTS, params)]


@pytest.mark.parametrize("name", ["self", "srt+self"])
def test_the_drafter_follows_weight_updates(name):
    """After `update_weights` the draft model is the new policy's copy: the engine emits the new
    policy's tokens, and the drafts keep being accepted (a stale copy would be rejected)."""
    old, new = tiny_random_model("llama", seed=0), tiny_random_model("llama", seed=5)
    _, expected = generate(new, None)
    engine, _ = generate(old, make_drafter(name))
    engine.update_weights(new.model.state_dict())
    assert engine.stats()["drafter_update_s"] > 0
    before = engine.stats()
    params = [SamplingParams(temperature=1.0, max_tokens=20, seed=7 + i) for i in range(len(PROMPTS))]
    assert [o.token_ids for o in engine.generate(PROMPTS, params)] == expected
    after = engine.stats()
    tested = after["model_draft_tested"] - before["model_draft_tested"]
    accepted = after["model_draft_accepted"] - before["model_draft_accepted"]
    assert tested > 0 and accepted / tested > 0.8, (accepted, tested)


def test_the_plan_drafts_only_where_it_pays():
    verify = ForwardCostModel()
    verify.calibrate([(t, 0.010 + 1e-4 * t, s) for s in (1, 4) for t in (s, 2 * s, 8 * s, 16 * s)])
    empty = [Draft(), Draft()]

    def cheap(chosen, depth):
        return 0.001 * depth

    plan = plan_model_drafts(empty, [8, 8], 0.9, verify, cheap, base_tokens=2)
    assert plan.depth > 1 and plan.sequences == [0, 1] and plan.rate > plan.rate_without
    dear = plan_model_drafts(empty, [8, 8], 0.9, verify, lambda chosen, depth: 0.02 * depth, base_tokens=2)
    assert dear.depth == 0 and not dear.sequences  # a pass costing twice a verification never pays
    rich = Draft([5, 6, 7, 8], [-1, 0, 1, 2], [0.99, 0.98, 0.97, 0.96])
    hybrid = plan_model_drafts(
        [rich, Draft()], [4, 4], 0.6, verify, lambda chosen, depth: 0.0002 * depth, base_tokens=2
    )
    assert hybrid.sequences == [1]  # the tree's draft stays where it expects more than the chain
    assert chain_gain(0.5, 3) == pytest.approx(0.875)


def test_a_full_batch_with_nothing_waiting_is_model_drafted_only_where_all_are_nearly_sure():
    """When nothing waits, a step gains what its slowest sequence gains: with 32 sequences each accepting
    with 0.85, that is almost never a token (0.85^32), so the plan spends no draft passes on them, where
    one sequence with the same chain is drafted."""
    verify = ForwardCostModel()
    verify.calibrate([(t, 0.010 + 1e-4 * t, s) for s in (1, 32) for t in (s, 2 * s, 8 * s)])
    cheap = lambda chosen, depth: 0.0005 * depth  # noqa: E731
    alone = plan_model_drafts([Draft()], [8], 0.85, verify, cheap, base_tokens=1, makespan=True)
    assert alone.depth > 0 and alone.sequences == [0]
    batch = plan_model_drafts([Draft()] * 32, [8] * 32, 0.85, verify, cheap, base_tokens=32, makespan=True)
    assert batch.depth == 0 and not batch.sequences
    sure = plan_model_drafts([Draft()] * 32, [8] * 32, 0.999, verify, cheap, base_tokens=32, makespan=True)
    assert sure.depth > 0  # every sequence nearly sure to accept: the slowest gains too


def test_the_slowest_sequences_expected_gain():
    from srt_agent.drafting.choice.cost_model import JointMinimum

    chain = Draft([1, 2], [-1, 0], [0.5, 0.25])
    fork = Draft([3, 4], [-1, -1], [0.5, 0.5])  # two children of the root: reaches depth 1 for sure
    slowest = JointMinimum([chain, fork])
    assert slowest.expected() == 0.0
    for seq, draft in enumerate((chain, fork)):
        for node, score in enumerate(draft.scores):
            slowest.add(seq, node, score)
    assert slowest.expected() == pytest.approx(0.5 * 1.0)  # depth 1: 0.5 × 1.0; depth 2: 0.25 × 0
    lone = JointMinimum([chain])
    lone.add(0, 0, 0.5)
    lone.add(0, 1, 0.25)
    assert lone.expected() == pytest.approx(0.75)  # one sequence: its own expectation


@pytest.mark.parametrize("diverge", [None, 0, 1, 4, 6])
def test_the_draft_cache_reuses_exactly_the_prefix_the_sequence_still_shares(diverge):
    """What the draft cache holds stays valid up to the first token where the sequence left it (a
    rejected draft token), and never covers the context's last token (it is fed again)."""
    from srt_agent.drafting.drafters.model_drafting import DraftRequest
    from srt_agent.drafting.drafters.self_drafter import _DraftState
    from srt_agent.runner.sampler import RowSampling

    drafter = make_drafter("self")
    cached = [5, 6, 7, 8, 9, 10, 11]
    drafter._states["r"] = _DraftState(tokens=cached, slot=0, cached=len(cached))
    context = list(cached) + [12]
    if diverge is not None:
        context[diverge] = 99
    request = DraftRequest("r", context, 4, RowSampling(1.0, 1.0, 0, 0, 0))
    assert drafter._reusable(request) == (len(cached) if diverge is None else diverge)
    assert drafter._reusable(DraftRequest("r", cached[:3], 4, request.sampling)) == 2
