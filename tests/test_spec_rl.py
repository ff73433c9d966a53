"""SPEC-RL: previous-epoch rollouts as prefix drafts with lenient acceptance (not exactly on-policy).

Its lenience must be real (with a generous lenience the reused rollout survives a policy that would
sample otherwise) and counted (every leniently accepted token the exact sampler would not have drawn
is an override; a rollout differs from plain decoding exactly when it had one).
"""

from __future__ import annotations

import math

import pytest

from srt_agent.drafting import is_lenient
from srt_agent.drafting.drafters.spec_rl import SpecRLDrafter
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.engine.lenient import acceptance_uniform, lenient_accept

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9, 8]]


def test_lenient_rule():
    # A token the current policy likes at least as much (times the lenience) always survives.
    assert lenient_accept(math.log(0.2), math.log(0.3), lenience=1.5, u=1.0)
    # Less likely now: survives with probability lenience * ratio.
    assert lenient_accept(math.log(0.1), math.log(0.4), lenience=2.0, u=0.49)
    assert not lenient_accept(math.log(0.1), math.log(0.4), lenience=2.0, u=0.51)
    assert not lenient_accept(math.log(0.1), math.log(0.4), lenience=1.0, u=0.3)
    with pytest.raises(ValueError, match="lenience"):
        lenient_accept(0.0, 0.0, lenience=0.0, u=0.5)
    draws = {acceptance_uniform(7, p) for p in range(100)}
    assert len(draws) == 100 and all(0 < u <= 1 for u in draws)
    assert acceptance_uniform(7, 5) == acceptance_uniform(7, 5) != acceptance_uniform(8, 5)


def test_drafter_reuses_the_previous_epoch_by_start_order():
    d = SpecRLDrafter()
    assert is_lenient("spec-rl") and d.name == "spec-rl"
    d.start_request("a", "p", [1, 2])
    d.start_request("b", "p", [1, 2])
    assert len(d.draft("a", [1, 2], 8)) == 0  # nothing from an earlier epoch yet
    d.add_tokens("a", [10, 11, 12], [-0.1, -0.2, -0.3])
    d.add_tokens("a", [50, 51])  # forced tool output: no log-probabilities
    d.add_tokens("a", [13], [-0.4])
    d.add_tokens("b", [20, 21], [-1.0, -2.0])
    d.stop_request("a")
    d.stop_request("b")
    d.end_step()
    d.start_request("a2", "p", [1, 2])
    d.start_request("b2", "p", [1, 2])
    first = d.draft("a2", [1, 2], 8)
    assert first.token_ids == [10, 11, 12] and first.old_logprobs == [-0.1, -0.2, -0.3]  # up to the forced tokens
    assert first.parents == [-1, 0, 1]
    assert d.draft("b2", [1, 2], 1).token_ids == [20]
    d.add_tokens("a2", [10, 11, 12], [-0.5, -0.5, -0.5])
    d.add_tokens("a2", [50, 51])
    assert d.draft("a2", [], 8).token_ids == [13] and d.draft("a2", [], 8).old_logprobs == [-0.4]
    d.add_tokens("b2", [99], [-0.1])  # left the reused rollout: drafting ends
    assert len(d.draft("b2", [], 8)) == 0
    d.add_tokens("b2", [21], [-0.1])
    assert len(d.draft("b2", [], 8)) == 0
    with pytest.raises(ValueError, match="log-probabilities"):
        d.add_tokens("a2", [1, 2], [0.0])
    with pytest.raises(ValueError, match="lenience"):
        SpecRLDrafter(lenience=-1)


def _engine(tiny, drafter):
    return Engine(
        tiny,
        EngineOptions(
            drafter=drafter, max_batch=4, max_context=64, max_draft_tokens=6, calibrate=False, adaptive_drafts=False
        ),
    )


def _run(engine, seed, max_tokens=14):
    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed + i) for i in range(len(PROMPTS))]
    return [o.token_ids for o in engine.generate(PROMPTS, params)]


@pytest.mark.parametrize("lenience", [1e-9, math.exp(0.5), 1e9])
def test_lenience_is_real_and_counted(tiny_llama, lenience):
    """Epoch 1 is plain decoding (nothing to reuse yet); epoch 2 samples with new seeds, so the exact
    sampler wants other tokens than the reused rollouts hold."""
    plain = _engine(tiny_llama, "none")
    spec = _engine(tiny_llama, SpecRLDrafter(lenience=lenience))
    first = _run(spec, seed=100)
    assert first == _run(plain, seed=100) and spec.totals.lenient_overrides == 0
    spec.end_step()
    exact = _run(plain, seed=500)
    second = _run(spec, seed=500)
    overrides = spec.totals.lenient_overrides
    assert spec.totals.draft_accepted > 0 or lenience < 1
    if lenience < 1e-6:  # nothing survives: every position is the exact sample
        assert second == exact and overrides == 0
    elif lenience > 1e6:  # everything survives: the old rollouts come back (but their last, undrafted token)
        assert [s[:-1] for s in second] == [f[:-1] for f in first] and overrides > 0
        assert second != exact
    else:
        assert (second != exact) == (overrides > 0)
