"""Faults in the engine: drafter calls, the model's forward pass (a raise, NaN logits) and the sampler.

Random request mixes (hypothesis), a fault injected into some of them: a drafter fault costs speed only
(the faulty request still emits its exact tokens), a model or sampler fault ends the faulty request with
a clear error; every other request emits exactly the tokens of a fault-free run, and once everything is
released the engine holds nothing (sequences, KV slots, drafter requests, cache bytes).
"""

from __future__ import annotations

import pytest
from helpers.engine_faults import PROMPTS, FaultyDrafter, ModelFault, Req, drive, reference
from helpers.fault_injection import engine_leaks
from helpers.faults_report import FaultRecord
from hypothesis import HealthCheck, given, settings, strategies as st

from srt_agent.drafting import make_drafter
from srt_agent.engine import Engine, EngineOptions, RequestOutput

FAULTY_PROMPT = list(range(64, 104))  # long, so stale KV in its slot would reach the next, shorter user
DRAFTER_METHODS = ("start_request", "add_tokens", "draft", "stop_request")
MAX_DRAFT_TOKENS = 6
SETTINGS = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def request_mixes(min_size: int = 3, max_size: int = 7):
    """GRPO-like mixes: requests share prompts (so the SRT trees draft across siblings), lengths and seeds vary."""
    row = st.tuples(st.integers(0, len(PROMPTS) - 1), st.integers(4, 14), st.integers(0, 2**31), st.booleans())
    return st.lists(row, min_size=min_size, max_size=max_size).map(
        lambda rows: tuple(Req(f"r{i}", tuple(PROMPTS[p]), m, s, g) for i, (p, m, s, g) in enumerate(rows))
    )


def speculative_engine(model, drafter) -> Engine:
    return Engine(
        model,
        EngineOptions(
            drafter=drafter,
            max_batch=4,
            max_context=128,
            max_draft_tokens=MAX_DRAFT_TOKENS,
            adaptive_drafts=False,
            calibrate=False,
        ),
    )


def affected(outs: dict[str, RequestOutput], ref: dict[str, RequestOutput], suffix: str = "") -> list[str]:
    """Requests whose tokens or finish differ from the fault-free run."""
    return [
        rid
        for rid, want in ref.items()
        if (outs[rid + suffix].token_ids, outs[rid + suffix].finish_reason) != (want.token_ids, want.finish_reason)
    ]


def sure_drafter_faults(mix, ref):
    """Epoch-1 drafter faults ({request id: (method, n-th call)}, at least one) at calls the request makes
    whatever the drafts: it starts and stops once, drafts and adds its tokens in its first step; a step
    emits at most MAX_DRAFT_TOKENS + 1 tokens, so a request emitting more runs a second step (a second
    add), and one emitting two more drafts in it too (a second draft)."""
    per_step = MAX_DRAFT_TOKENS + 1

    def calls(r: Req) -> list[tuple[str, int]]:
        n = len(ref[r.rid].token_ids)
        return (
            [(m, 1) for m in DRAFTER_METHODS]
            + [("add_tokens", 2)] * (n > per_step)
            + [("draft", 2)] * (n > per_step + 1)
        )

    return st.lists(st.sampled_from(mix), min_size=1, unique=True).flatmap(
        lambda reqs: st.tuples(*(st.sampled_from(calls(r)) for r in reqs)).map(
            lambda chosen: {r.rid + "/1": call for r, call in zip(reqs, chosen)}
        )
    )


@SETTINGS
@given(mix=request_mixes(), data=st.data())
def test_drafter_faults_cost_speed_only(tiny_llama, ledger, mix, data):
    """Epoch 0 fills the trees; in epoch 1 (which drafts) scheduled drafter calls raise, and end_step may.
    Every scheduled fault fires."""
    ref = reference(tiny_llama, mix)
    faults = data.draw(sure_drafter_faults(mix, ref))
    drafter = FaultyDrafter(make_drafter("srt"), faults, end_step_fault=data.draw(st.booleans()))
    engine = speculative_engine(tiny_llama, drafter)
    epochs = [drive(engine, mix, "/0")]
    engine.end_step()
    epochs.append(drive(engine, mix, "/1"))
    scheduled = [(rid, method) for rid, (method, _) in faults.items()] + [(None, "end_step")] * drafter.end_step_fault
    bystanders = [r.rid for r in mix if r.rid + "/1" not in faults]
    hit = [rid for rid in affected(epochs[1], ref, "/1") if rid in bystanders] + affected(epochs[0], ref, "/0")
    leaks = engine_leaks(engine)
    kinds = "+".join(sorted({f"{m} raises" for _, m in drafter.fired}))
    ledger.record(FaultRecord("drafter", kinds, len(drafter.fired), len(bystanders) + len(mix), len(hit), len(leaks)))
    assert sorted(drafter.fired, key=repr) == sorted(scheduled, key=repr)
    assert hit == [] and leaks == []
    assert affected(epochs[1], ref, "/1") == []  # the faulty requests too: a drafter fault costs speed only
    stats = engine.stats()
    for method in (*DRAFTER_METHODS, "end_step"):
        assert stats["drafter_faults"][method] == sum(m == method for _, m in drafter.fired), method
    assert stats["undrafted_requests"] == len(
        {rid for rid, m in drafter.fired if m in ("start_request", "add_tokens", "draft")}
    )
    assert drafter.fired[-1][1] in stats["last_drafter_error"] and "InjectedFault" in stats["last_drafter_error"]
    assert stats["draft_accepted"] > 0  # the bystanders still drafted


def test_a_malformed_draft_is_a_drafter_fault(tiny_llama, ledger):
    """A drafter returning a tree outside the vocabulary is refused like a raising one."""

    class OutOfVocabulary(FaultyDrafter):
        def draft(self, request_id, context, budget):
            return type(self.inner.draft(request_id, context, budget))([300], [-1], [1.0])

    mix = (Req("a", tuple(PROMPTS[0]), 8, 3, False), Req("b", tuple(PROMPTS[1]), 8, 4, True))
    engine = speculative_engine(tiny_llama, OutOfVocabulary(make_drafter("srt"), {}))
    outs = drive(engine, mix)
    hit, leaks = affected(outs, reference(tiny_llama, mix)), engine_leaks(engine)
    ledger.record(FaultRecord("drafter", "malformed draft", 2, 0, len(hit), len(leaks)))
    assert hit == [] and leaks == []
    stats = engine.stats()
    assert stats["drafter_faults"]["draft"] == 2 and stats["undrafted_requests"] == 2
    assert "outside the vocabulary" in stats["last_drafter_error"]


MODEL_FAULTS = {
    "forward raises": "the forward pass or sampling failed: InjectedFault",
    "NaN logits": "non-finite logits (NaN or +inf)",
    "sampler raises": "the forward pass or sampling failed: InjectedFault",
}


@pytest.mark.parametrize("kind", sorted(MODEL_FAULTS))
@SETTINGS
@given(mix=request_mixes(), mid_run=st.booleans(), data=st.data())
def test_a_model_fault_ends_only_its_request(tiny_llama, ledger, kind, mix, mid_run, data):
    """The faulty request meets its fault at prefill or, in a second turn, in its forced tokens (mid-run
    for the others); then the same requests run again on the same engine, in the slots it used."""
    ref = reference(tiny_llama, mix)
    used = {t for r in mix for t in r.prompt} | {t for out in ref.values() for t in out.token_ids}
    poison = min(set(range(104, 256)) - used)  # a token no bystander ever feeds
    seed = data.draw(st.integers(0, 2**31))
    faulty = Req("faulty", tuple(FAULTY_PROMPT if mid_run else FAULTY_PROMPT + [poison]), 6, seed, False)
    # no global tree: from it a bystander could draft the poison token the faulty request fed, and feed it too
    engine = speculative_engine(tiny_llama, make_drafter("srt", global_fallback=False))
    position = len(FAULTY_PROMPT) + (7 if mid_run else 0)  # the sampler fault: in the second turn, or at once

    def second_turn(out: RequestOutput) -> None:
        if out.request_id == "faulty" and mid_run and out.finish_reason != "error":
            history = FAULTY_PROMPT + out.token_ids + [poison, poison + 1]
            engine.add_request(history, faulty.params(), "faulty")

    with ModelFault(kind, tiny_llama, poison, seed, position) as fault:
        first = drive(engine, (*mix, faulty), on_output=second_turn)
        again = drive(engine, mix, "/again")
    hit = affected(first, ref) + affected(again, ref, "/again")
    leaks = engine_leaks(engine)
    ledger.record(
        FaultRecord("model" if "sampler" not in kind else "sampler", kind, 1, 2 * len(mix), len(hit), len(leaks))
    )
    assert fault.fired >= 1
    assert first["faulty"].finish_reason == "error" and MODEL_FAULTS[kind] in first["faulty"].error
    assert hit == [] and leaks == []
    assert engine.stats()["model_errors"] == 1
    for rid, want in ref.items():
        assert first[rid].logprobs == pytest.approx(want.logprobs, abs=1e-9)
