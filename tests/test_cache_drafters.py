"""Every drafter behind the Drafter interface: hand-checked cases, shared contracts, bad input."""

from __future__ import annotations

import random
import sys

import pytest

from srt_agent.bench.cache import available_drafters
from srt_agent.drafting import (
    DRAFTERS,
    Draft,
    Drafter,
    RolloutCache,
    SRTDrafter,
    is_lenient,
    make_drafter,
)

NAMES = [n for n in DRAFTERS if n != "arctic"] + (["arctic"] if "arctic" in available_drafters() else [])


@pytest.mark.parametrize("name", NAMES)
def test_contract_and_bad_input(name):
    drafter = make_drafter(name)
    assert isinstance(drafter, Drafter) and drafter.name == name
    drafter.start_request("r", "p", [1, 2, 3, 1, 2])
    with pytest.raises(ValueError, match="already running"):
        drafter.start_request("r", "p", [1])
    for call in (
        lambda: drafter.add_tokens("nobody", [1]),
        lambda: drafter.draft("nobody", [1], 4),
        lambda: drafter.stop_request("nobody"),
    ):
        with pytest.raises(ValueError, match="unknown request"):
            call()
    with pytest.raises(ValueError):
        drafter.add_tokens("r", [3, -1])
    with pytest.raises(ValueError):
        drafter.add_tokens("r", ["3"])
    with pytest.raises(ValueError, match="budget"):
        drafter.draft("r", [1, 2, 3, 1, 2], -1)
    with pytest.raises(ValueError):
        drafter.draft("r", [1, 2, None], 4)
    assert drafter.draft("r", [1, 2, 3, 1, 2], 0) == Draft()
    assert len(drafter.draft("r", [], 4)) == 0
    drafter.add_tokens("r", [3, 1, 2])
    draft = drafter.draft("r", [1, 2, 3, 1, 2, 3, 1, 2], 6)
    assert len(draft) <= 6
    assert all(p < i for i, p in enumerate(draft.parents))
    drafter.stop_request("r")
    drafter.end_step()


@pytest.mark.parametrize("name", NAMES)
def test_drafts_are_valid_trees_on_a_random_stream(name):
    rng = random.Random(3)
    drafter = make_drafter(name)
    base = [rng.randrange(30) for _ in range(80)]
    for step in range(2):
        for r in range(3):
            rid = f"{step}-{r}"
            drafter.start_request(rid, "p", [1, 2, 3])
            context = [1, 2, 3]
            for tok in base:
                budget = rng.randrange(0, 9)
                draft = drafter.draft(rid, context, budget)
                assert len(draft) <= budget
                assert len(draft.token_ids) == len(draft.parents) == len(draft.scores)
                assert all(-1 <= p < i for i, p in enumerate(draft.parents))
                assert all(0.0 <= s <= 1.0 for s in draft.scores)
                assert (draft.match_len > 0) == (len(draft) > 0) or name in ("arctic", "ngram")
                new = tok if rng.random() > 0.1 else rng.randrange(30)
                drafter.add_tokens(rid, [new])
                context.append(new)
            drafter.stop_request(rid)
        drafter.end_step()


def test_ngram_follows_vllm_prompt_lookup():
    drafter = make_drafter("ngram", prompt_lookup_min=2, prompt_lookup_max=3)
    drafter.start_request("r", "p", [6, 7, 1, 5, 6, 7, 2, 5, 6, 7])
    # The longest n-gram wins: [5, 6, 7] first occurs at 3 (the 2-gram [6, 7] would say 1).
    assert drafter.draft("r", [6, 7, 1, 5, 6, 7, 2, 5, 6, 7], 3) == Draft([2, 5, 6], [-1, 0, 1], [1.0] * 3, 3)
    drafter.add_tokens("r", [9])
    assert len(drafter.draft("r", [6, 7, 1, 5, 6, 7, 2, 5, 6, 7, 9], 3)) == 0  # "7 9" never seen before
    drafter.start_request("s", "q", [1, 2, 3, 1, 2])
    # The earliest occurrence of [1, 2]; the proposal stops at the end of the context.
    assert drafter.draft("s", [1, 2, 3, 1, 2], 5).token_ids == [3, 1, 2]
    # A context the drafter was not streamed is indexed afresh.
    assert drafter.draft("s", [4, 4, 8, 4, 4], 2).token_ids == [8, 4]
    with pytest.raises(ValueError, match="prompt_lookup"):
        make_drafter("ngram", prompt_lookup_min=3, prompt_lookup_max=2)


def test_suffix_drafts_from_its_own_prompt_and_from_other_responses():
    drafter = make_drafter("suffix")
    drafter.start_request("a", "pa", [1, 2, 3, 1, 2, 3, 4])
    assert drafter.draft("a", [1, 2, 3, 1, 2, 3, 4, 1, 2], 2).token_ids == [3, 1]  # from its prompt
    drafter.add_tokens("a", [70, 71, 72, 73, 74])
    drafter.stop_request("a")
    drafter.start_request("b", "pb", [50, 51])  # another prompt: only the global tree helps
    drafter.add_tokens("b", [70, 71])
    draft = drafter.draft("b", [50, 51, 70, 71], 3)
    assert draft.token_ids == [72, 73, 74] and draft.match_len == 2


def test_history_sees_only_earlier_steps_while_srt_shares_within_a_step():
    prompt = [10, 11, 12]
    history, srt = make_drafter("history"), make_drafter("srt")
    for drafter in (history, srt):
        drafter.start_request("a", "p", prompt)
        drafter.add_tokens("a", [1, 2, 3, 4])
        drafter.start_request("b", "p", prompt)
    assert srt.draft("b", prompt, 4).token_ids == [1, 2, 3, 4]
    assert history.draft("b", prompt, 4).token_ids == []
    history.stop_request("a")
    assert history.draft("b", prompt, 4).token_ids == []  # finished, but the step has not ended
    history.end_step()
    history.start_request("c", "p", prompt)
    assert history.draft("c", prompt, 4).token_ids == [1, 2, 3, 4]
    assert history.cache.sequences("p") == [prompt + [1, 2, 3, 4]]


def test_srt_cache_is_shared_and_survives_steps():
    cache = RolloutCache(max_depth=16, max_match=4)
    first = SRTDrafter(cache=cache)
    first.start_request("a", "p", [5, 6])
    first.add_tokens("a", [7, 8, 9])
    first.stop_request("a")
    first.end_step()
    second = make_drafter("srt", cache=cache, chain=True)
    second.start_request("b", "p", [5, 6])
    # count([5, 6]) = 2 (b's own prompt tail is stored too), but only a's occurrence went on: b's own
    # window, which ends there, does not dilute what a wrote.
    assert second.draft("b", [5, 6], 8) == Draft([7, 8, 9], [-1, 0, 1], [1.0, 1.0, 1.0], 2)
    assert second.cache is cache
    with pytest.raises(ValueError, match="either a cache or tree options"):
        SRTDrafter(cache=cache, max_depth=8)


def test_make_drafter_errors():
    with pytest.raises(ValueError, match="unknown drafter 'medusa'.*srt"):
        make_drafter("medusa")
    with pytest.raises(ValueError, match="bad options for drafter 'srt'"):
        make_drafter("srt", colour="red")


def test_arctic_missing_gives_install_instructions(monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # as if not installed
    with pytest.raises(ValueError, match="install_arctic.sh"):
        make_drafter("arctic")


@pytest.mark.skipif("arctic" not in NAMES, reason="arctic-inference not installed (scripts/install_arctic.sh)")
def test_arctic_drafts_from_other_responses():
    drafter = make_drafter("arctic")
    drafter.start_request("a", "p", [1, 2, 3])
    drafter.add_tokens("a", [40, 41, 42, 43, 44, 45])
    drafter.stop_request("a")
    drafter.start_request("a", "p", [1, 2, 3])  # ids may be reused: finished ones stay cached inside
    drafter.add_tokens("a", [40, 41, 42])
    assert drafter.draft("a", [1, 2, 3, 40, 41, 42], 3).token_ids == [43, 44, 45]


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_every_drafter_declares_what_it_offers(name):
    """Capabilities are declared on the class, and each flag matches what the class has."""
    from srt_agent.drafting import DrafterCapabilities, RolloutCache

    cls = DRAFTERS[name].load()
    caps = vars(cls).get("capabilities")
    assert isinstance(caps, DrafterCapabilities), f"{cls.__name__} declares no capabilities"
    assert caps.run_ahead == hasattr(cls, "start_run_ahead")
    assert caps.model == all(hasattr(cls, m) for m in ("attach", "rebuild", "draft_batch", "draft_seconds"))
    assert caps.lenient == caps.needs_logprobs == is_lenient(name)
    if name != "arctic" or "arctic" in available_drafters():
        assert caps.trees == isinstance(getattr(make_drafter(name), "cache", None), RolloutCache)
