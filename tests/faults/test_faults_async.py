"""Faults behind the async front: a fault in one request, a failing call, a step that raises, a stuck engine.

Many coroutines await at once. A request that faults gets its own error output while the others get
exactly their fault-free tokens and the front keeps serving; a failing `call` reaches only its future;
a step that raises fails the requests in flight and the front serves on; an engine whose steps keep
failing is restarted when the front has a `restart`, else the front answers every waiter at once and
reports itself closed, so nothing hangs.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers.engine_faults import PROMPTS, FaultyDrafter, ModelFault, Req, reference
from helpers.fault_injection import HostState, InjectedFault, engine_leaks, host_leaks
from helpers.faults_report import FaultRecord

from srt_agent.drafting import make_drafter
from srt_agent.engine import AsyncEngine, Engine, EngineOptions

MIX = tuple(Req(f"r{i}", tuple(PROMPTS[i % len(PROMPTS)]), 6 + i % 5, 100 + i, i % 3 == 0) for i in range(8))
ANSWER_WITHIN_S = 30.0  # a hang shows up as a timeout, never as a stuck suite


def front(model, drafter="srt") -> AsyncEngine:
    drafter = make_drafter(drafter) if isinstance(drafter, str) else drafter
    return AsyncEngine(
        Engine(model, EngineOptions(drafter=drafter, max_batch=4, max_context=128, max_draft_tokens=6, calibrate=False))
    )


async def generate_all(engine: AsyncEngine, reqs) -> dict:
    async def one(r: Req):
        out = await engine.generate(r.rid, list(r.prompt), r.params())
        engine.release(r.rid)
        return r.rid, out

    return dict(await asyncio.wait_for(asyncio.gather(*(one(r) for r in reqs)), ANSWER_WITHIN_S))


def mismatches(outs: dict, ref: dict) -> list[str]:
    return [rid for rid, want in ref.items() if outs[rid].token_ids != want.token_ids]


@pytest.mark.parametrize("kind", ["drafter start_request raises", "NaN logits", "forward raises"])
def test_a_faulty_request_among_many_coroutines(tiny_llama, ledger, kind):
    ref = reference(tiny_llama, MIX)
    fed = {t for out in ref.values() for t in out.token_ids} | {t for r in MIX for t in r.prompt}
    poison = max(set(range(256)) - fed)  # a token no request of MIX feeds
    host = HostState.now()
    faulty = Req("faulty", (70, 71, 72, poison), 6, 9, False)
    if kind.startswith("drafter"):
        engine = front(tiny_llama, FaultyDrafter(make_drafter("srt"), {"faulty": ("start_request", 1)}))
        injection = None
    else:
        engine = front(tiny_llama)
        injection = ModelFault(kind, tiny_llama, poison, seed=-1, position=0)
    try:
        if injection is not None:
            injection.__enter__()
        try:
            outs = asyncio.run(generate_all(engine, (*MIX, faulty)))
        finally:
            if injection is not None:
                injection.__exit__(None, None, None)
        later = asyncio.run(generate_all(engine, MIX[:2]))  # the front still serves
        assert not engine.closed
    finally:
        engine.close()
    hit = mismatches(outs, ref) + mismatches(later, {r: ref[r] for r in later})
    leaks = engine_leaks(engine.engine) + host_leaks(host)
    ledger.record(FaultRecord("async front", kind, 1, len(MIX) + 2, len(hit), len(leaks)))
    assert hit == [] and leaks == []
    if kind.startswith("drafter"):
        assert outs["faulty"].token_ids == reference(tiny_llama, (faulty,))["faulty"].token_ids
        assert engine.engine.stats()["drafter_faults"]["start_request"] == 1
    else:
        assert outs["faulty"].finish_reason == "error" and outs["faulty"].error


def test_a_failing_call_reaches_only_its_future(tiny_llama, ledger):
    ref = reference(tiny_llama, MIX)
    engine = front(tiny_llama)

    async def main():
        work = asyncio.ensure_future(generate_all(engine, MIX))
        bad = engine.call(lambda e: e.update_weights({"no.such.weight": None}))
        good = engine.call(lambda e: e.idle_capacity())
        return await work, await asyncio.wrap_future(good), bad

    try:
        outs, capacity, bad = asyncio.run(main())
    finally:
        engine.close()
    hit = mismatches(outs, ref)
    ledger.record(FaultRecord("async front", "call raises", 1, len(MIX), len(hit), len(engine_leaks(engine.engine))))
    assert hit == [] and engine_leaks(engine.engine) == []
    with pytest.raises(RuntimeError, match="no.such.weight"):
        bad.result(timeout=0)
    assert 0 <= capacity <= 4


def failing_steps(engine: AsyncEngine, monkeypatch, failing: set[int] | None = None) -> list[int]:
    """Make the engine's step raise InjectedFault at the given step numbers (1-based; None: from the third on)."""
    real_step, steps = engine.engine.step, []

    def step():
        steps.append(1)
        if (len(steps) in failing) if failing is not None else len(steps) >= 3:
            raise InjectedFault("the step itself broke")
        return real_step()

    monkeypatch.setattr(engine.engine, "step", step)
    return steps


def test_a_step_that_raises_fails_its_requests_and_the_front_serves_on(tiny_llama, ledger, monkeypatch):
    host = HostState.now()
    ref = reference(tiny_llama, MIX)
    engine = front(tiny_llama)
    failing_steps(engine, monkeypatch, failing={3})
    try:
        outs = asyncio.run(generate_all(engine, MIX))
        later = asyncio.run(generate_all(engine, MIX[:2]))
        health = engine.health()
    finally:
        engine.close()
    hit = mismatches(later, {r: ref[r] for r in later})
    leaks = engine_leaks(engine.engine) + host_leaks(host)
    ledger.record(FaultRecord("async front", "a step raises", 1, 2, len(hit), len(leaks)))
    assert hit == [] and leaks == []
    assert all(out.finish_reason == "error" and "InjectedFault" in out.error for out in outs.values())
    assert (health["status"], health["step_failures"], health["restarts"]) == ("ready", 1, 0)


def test_a_stuck_engine_is_restarted(tiny_llama, ledger, monkeypatch):
    """Steps fail twice in a row: `restart` builds a new engine, requests sent meanwhile wait for it."""
    ref = reference(tiny_llama, MIX)
    started = []

    def restart(old: Engine) -> Engine:
        started.append(old)
        return Engine(
            tiny_llama, EngineOptions(drafter="srt", max_batch=4, max_context=128, max_draft_tokens=6, calibrate=False)
        )

    engine = AsyncEngine(front(tiny_llama).engine, restart=restart)
    failing_steps(engine, monkeypatch, failing={3, 4})
    try:
        first = asyncio.run(generate_all(engine, MIX[:4]))
        second = asyncio.run(generate_all(engine, MIX[4:5]))  # its step is the second failure in a row
        later = asyncio.run(generate_all(engine, MIX))
        health = engine.health()
    finally:
        engine.close()
    ledger.record(FaultRecord("async front", "stuck engine restarts", 2, len(MIX), len(mismatches(later, ref)), 0))
    assert all(out.finish_reason == "error" for out in (*first.values(), *second.values()))
    assert mismatches(later, ref) == [] and len(started) == 1 and engine.engine is not started[0]
    assert (health["status"], health["step_failures"], health["restarts"]) == ("ready", 2, 1)


def test_a_stuck_engine_without_a_restart_closes_the_front(tiny_llama, ledger, monkeypatch):
    host = HostState.now()
    engine = front(tiny_llama)
    failing_steps(engine, monkeypatch)

    async def main():
        outs = await generate_all(engine, MIX)
        late = await asyncio.wait_for(engine.generate("late", [1, 2, 3]), ANSWER_WITHIN_S)
        for _ in range(int(ANSWER_WITHIN_S * 100)):  # the loop ends just after answering `late`
            if engine.closed:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError, match="engine stopped: RuntimeError"):
            await asyncio.wait_for(engine.generate("later", [1, 2, 3]), ANSWER_WITHIN_S)
        return outs, late

    outs, late = asyncio.run(main())
    engine.close()
    ledger.record(FaultRecord("async front", "stuck engine, no restart", 1, 0, 0, len(host_leaks(host))))
    assert engine.closed and "cannot go on" in str(engine.error) and engine.health()["status"] == "failed"
    assert all(out.finish_reason == "error" and "InjectedFault" in out.error for out in (*outs.values(), late))
    with pytest.raises(RuntimeError, match="engine stopped"):
        engine.call(lambda e: None).result(timeout=0)
    engine.release("r0")  # nothing to free any more: a no-op, not an error
    assert host_leaks(host) == []
