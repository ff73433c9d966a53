"""HeldTurns: a trajectory's next turn found by its tokens (longest held turn its prompt extends), LRU-bounded."""

from srt_agent.integrations.turns import HeldTurns


def test_a_prompt_claims_the_longest_held_turn_it_extends():
    turns = HeldTurns(max_held=8)
    turns.hold("short", [1, 2])
    turns.hold("long", [1, 2, 3, 4])
    turns.hold("sibling", [1, 2, 3, 5])
    assert turns.claim([1, 2, 3, 4, 9, 9]) == ("long", [1, 2, 3, 4])
    assert "long" not in turns and turns.claim([1, 2, 3, 4]) == ("short", [1, 2])
    assert turns.claim([1]) is None and turns.claim([7, 1, 2]) is None  # not an extension of any held turn
    assert turns.release_all() == ["sibling"] and len(turns) == 0


def test_holding_past_the_bound_releases_the_least_recently_held():
    turns = HeldTurns(max_held=2)
    assert turns.hold("a", [1]) == [] and turns.hold("b", [2]) == []
    assert turns.hold("c", [3]) == ["a"]
    assert turns.claim([1, 5]) is None and turns.claim([2, 5]) == ("b", [2])
