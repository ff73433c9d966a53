"""HeldTurns: a trajectory's next turn found by its tokens (the held turn it shares most with), bounded by
count, bytes and age; a turn may be continued past a few tokens sampled beyond a stop."""

import pytest

from srt_agent.drafting.trees.held_turns import HeldTurns


def test_a_prompt_claims_the_longest_held_turn_it_extends():
    turns = HeldTurns(max_held=8)
    turns.hold("short", [1, 2])
    turns.hold("long", [1, 2, 3, 4])
    turns.hold("sibling", [1, 2, 3, 5])
    assert turns.claim([1, 2, 3, 4, 9, 9]) == ("long", 4, 4)
    assert "long" not in turns and turns.claim([1, 2, 3, 4]) == ("short", 2, 2)
    assert turns.claim([1]) is None and turns.claim([7, 1, 2]) is None  # not an extension of any held turn
    assert turns.release_all() == ["sibling"] and len(turns) == 0 and turns.nbytes == 0


def test_holding_past_the_bound_releases_the_least_recently_held():
    turns = HeldTurns(max_held=2)
    assert turns.hold("a", [1]) == [] and turns.hold("b", [2]) == []
    assert turns.hold("c", [3]) == ["a"]
    assert turns.claim([1, 5]) is None and turns.claim([2, 5]) == ("b", 1, 1)


def test_a_turn_with_tokens_sampled_past_its_stop_is_continued_from_the_stop():
    """A speculative step accepted tokens past the stop ([7, 7]); the caller cut them and appended tool output
    ([50, 51]). The next prompt shares the turn up to the stop and at least the turn's own context (floor)."""
    turns = HeldTurns(max_held=8)
    prompt, response, overshoot = [1, 2, 3], [10, 11, 12], [7, 7]
    turns.hold("t", prompt + response + overshoot, floor=len(prompt))
    assert turns.claim(prompt + response + [50, 51]) is None  # exact extensions only unless overshoot is allowed
    assert turns.claim(prompt + response + [50, 51], max_overshoot=2) == ("t", 6, 8)
    turns.hold("t", prompt + response + overshoot, floor=len(prompt))
    assert turns.claim(prompt + [10, 50, 51], max_overshoot=2) is None  # leaves out more than the overshoot
    assert turns.claim([1, 2, 9, 10, 11, 12, 50], max_overshoot=8) is None  # differs inside the turn's context
    assert turns.claim(prompt, max_overshoot=8) is None  # the context alone: a sibling's first turn, not a next turn
    sibling = prompt + [10, 11, 12, 7]
    turns.hold("s", sibling, floor=len(prompt))
    assert turns.claim(prompt + response + overshoot + [50], max_overshoot=2) == ("t", 8, 8)  # the full turn wins


def test_held_turns_are_bounded_by_bytes_and_age():
    now = [0.0]
    turns = HeldTurns(max_held=100, max_bytes=4 * 10, ttl_s=60.0, clock=lambda: now[0])
    assert turns.hold("a", list(range(6))) == [] and turns.nbytes == 24
    assert turns.hold("b", list(range(6))) == ["a"] and turns.nbytes == 24  # 48 bytes > 40: the oldest goes
    now[0] = 30.0
    turns.hold("c", [1])
    now[0] = 61.0
    assert turns.expire() == ["b"] and list(turns.release_all()) == ["c"]
    with pytest.raises(ValueError, match="max_bytes"):
        HeldTurns(max_held=1, max_bytes=-1)
