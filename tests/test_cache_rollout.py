"""RolloutCache: streaming per-prompt trees, byte budget with LRU eviction, node caps, persistence."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from srt_agent.drafting import RolloutCache
from srt_agent.drafting.trees.tree import CompiledTokenTree

BACKENDS = ["python"] + (["compiled"] if CompiledTokenTree is not None else [])


def occurrences(seqs: list[list[int]], path: list[int]) -> int:
    n = len(path)
    return sum(1 for s in seqs for i in range(len(s) - n + 1) if s[i : i + n] == path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_siblings_draft_from_each_other_within_a_step(backend):
    cache = RolloutCache(max_depth=16, max_match=4, backend=backend)
    prompt = [100, 101, 102, 103, 104, 105]
    cache.start_request("a", "p", prompt)
    cache.start_request("b", "p", prompt)
    cache.add_tokens("a", [1, 2, 3, 4, 5, 6, 7])  # a runs ahead; b has produced nothing yet
    draft = cache.draft_request("b", prompt, budget=5)
    assert draft.token_ids == [1, 2, 3, 4, 5] and draft.parents == [-1, 0, 1, 2, 3]
    assert draft.match_len == 4  # the prompt tail, which leads every stored sequence
    cache.add_tokens("b", [1, 2, 9])
    draft = cache.draft_request("b", prompt + [1, 2, 9], budget=3)
    assert draft.token_ids == []  # "9" was never followed by anything
    draft = cache.draft_request("b", prompt + [1, 2], budget=2)
    assert draft.token_ids == [3, 9] and draft.parents == [-1, -1]
    assert draft.scores == [0.5, 0.5]
    assert cache.draft("p", prompt + [1, 2], budget=2) == draft  # the same without the request
    assert cache.sequences("p") == [prompt[-4:] + [1, 2, 3, 4, 5, 6, 7], prompt[-4:] + [1, 2, 9]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_rewound_past_a_stop_goes_on_from_the_stop_without_a_rebuild(backend):
    """drop_last rewinds a running request (a serving engine sampled tokens past a stop that the caller drops):
    those tokens stay as a finished sample, the request goes on in a sequence led by the tokens before the stop,
    so what follows the stop drafts after it; no rebuild, whatever the tree holds."""
    prompt = [100, 101, 102, 103]
    cache = RolloutCache(max_depth=8, max_match=4, backend=backend)
    cache.add_sequence("p", [100, 1, 2, 3])
    cache.start_request("r", "p", prompt)
    cache.add_tokens("r", [1, 2, 7, 7, 8])
    cache.drop_last("r", 3)
    cache.add_tokens("r", [5, 6])
    assert cache.sequences("p") == [[100, 1, 2, 3], prompt + [1, 2, 7, 7, 8], [102, 103, 1, 2, 5, 6]]
    for path in ([7], [2, 7], [5, 6], [1, 2, 5], [2]):
        assert cache.count("p", path) == occurrences(cache.sequences("p"), path)
    # after the stop ("102 103 1 2"), the dropped 7 and the continuation 5 tie; the lower token goes first
    assert cache.draft_request("r", prompt + [1, 2], budget=2).token_ids == [5, 7]
    assert cache.draft_request("r", [5], budget=1).token_ids == [6]
    stats = cache.stats()
    assert stats.rebuilds == 0 and stats.rebuilt_tokens == 4 and stats.inserted_tokens == 4 + 4 + 5 + 2
    cache.drop_last("r", 100)  # more than the request stored: it goes on from nothing
    cache.add_tokens("r", [9])
    cache.stop_request("r")
    assert cache.sequences("p")[-1] == [9] and cache.stats().active_requests == 0


def tree_bytes(cache: RolloutCache) -> int:
    """What the prompts' trees hold right now, each asked for its own allocated bytes."""
    return sum(entry.tree.nbytes for entry in cache._prompts.values())


ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 5), st.integers(0, 2)),
        st.tuples(st.just("add"), st.integers(0, 5), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
        st.tuples(st.just("stop"), st.integers(0, 5), st.none()),
        st.tuples(st.just("seq"), st.integers(0, 2), st.lists(st.integers(0, 3), max_size=20)),
    ),
    max_size=40,
)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.sampled_from([1 << 30, 6000, 25000]), st.sampled_from([1 << 20, 40]))
def test_counts_budget_and_caps_hold_under_any_operation_sequence(backend, script, max_bytes, max_nodes):
    """Counts always equal a scan of the stored sequences; the byte budget always holds."""
    cache = RolloutCache(max_depth=6, max_match=3, max_bytes=max_bytes, max_nodes_per_prompt=max_nodes, backend=backend)
    running: dict[int, str] = {}
    for op, a, b in script:
        if op == "start" and a not in running:
            cache.start_request(a, f"p{b}", [9, 8, 7, b])
            running[a] = f"p{b}"
        elif op == "add" and a in running:
            cache.add_tokens(a, b)
        elif op == "stop" and a in running:
            cache.stop_request(a)
            del running[a]
        elif op == "seq":
            cache.add_sequence(f"p{a}", b)
        stats = cache.stats()
        assert stats.bytes == tree_bytes(cache)  # the running counter is the trees' allocation, recounted
        assert stats.bytes <= max_bytes
        assert stats.prompts == len(cache) and stats.active_requests == len(running)
    for key in cache.prompt_keys():
        seqs = cache.sequences(key)
        paths = {tuple(s[i : i + n]) for s in seqs for n in (1, 2, 3, 6) for i in range(len(s) - n + 1)}
        for path in paths:
            assert cache.count(key, list(path)) == occurrences(seqs, list(path))
    if max_bytes == 1 << 30 and max_nodes == 1 << 20:
        assert cache.stats().evicted_prompts == 0


def test_lru_eviction_drops_the_least_recently_used_prompt():
    cache = RolloutCache(max_depth=8, max_match=4)
    for key in ("a", "b", "c"):
        cache.add_sequence(key, list(range(50)))
    per_prompt = cache.stats().bytes // 3
    cache.max_bytes = cache.stats().bytes + per_prompt // 2
    cache.start_request("r", "a", [1, 2])  # touches "a": "b" is now the least recently used
    cache.add_sequence("d", list(range(100, 150)))
    assert cache.prompt_keys() == ["c", "a", "d"]
    assert cache.stats().evicted_prompts == 1
    assert cache.stats().bytes <= cache.max_bytes


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_ahead_content_goes_before_any_real_rollout(backend, tmp_path):
    cache = RolloutCache(max_depth=8, max_match=4, backend=backend)
    rng = random.Random(2)
    for key in ("old", "new"):  # "old" is the least recently used prompt
        cache.add_sequence(key, [rng.randrange(50) for _ in range(60)])
    real_bytes = cache.stats().bytes
    cache.max_bytes = real_bytes + real_bytes // 4
    cache.start_request("ahead", "new", [1, 2, 3, 4], run_ahead=True)
    for _ in range(20):  # run-ahead content of the newest prompt pushes the cache over its budget
        cache.add_tokens("ahead", [rng.randrange(50) for _ in range(10)])
    stats = cache.stats()
    assert stats.evicted_prompts == 0 and stats.evicted_run_ahead >= 1  # only run-ahead content went
    assert cache.prompt_keys() == ["old", "new"] and len(cache.sequences("old")) == 1
    assert stats.bytes <= cache.max_bytes and stats.run_ahead_tokens == 0 and stats.run_ahead_bytes == 0
    assert cache.draft_request("ahead", [1, 2, 3, 4], 4).token_ids == []  # detached: stores nothing more
    cache.add_tokens("ahead", [7])
    cache.stop_request("ahead")
    # Counted and saved as run-ahead content: a reload keeps the mark.
    cache.max_bytes = 1 << 30
    cache.add_sequence("new", [9, 9, 9, 9, 5, 6], run_ahead=True)
    assert cache.stats().run_ahead_sequences == 1 and cache.stats().run_ahead_tokens == 6
    assert 0 < cache.stats().run_ahead_bytes < cache.stats().bytes
    cache.save(tmp_path / "c.npz")
    loaded = RolloutCache.load(tmp_path / "c.npz", backend=backend)
    assert loaded.sequences("new", run_ahead=False) == cache.sequences("new", run_ahead=False)
    assert loaded.sequences("new") == cache.sequences("new") and loaded.stats().run_ahead_sequences == 1


def test_node_cap_drops_run_ahead_content_before_real_rollouts():
    cache = RolloutCache(max_depth=8, max_match=4, max_nodes_per_prompt=300)
    rng = random.Random(3)
    real = [[rng.randrange(40) for _ in range(20)] for _ in range(3)]
    for i in range(12):
        cache.add_sequence("p", [rng.randrange(40) for _ in range(20)], run_ahead=True)
        if i < 3:
            cache.add_sequence("p", real[i])
    kept = cache.sequences("p", run_ahead=False)
    assert kept == real  # every real rollout survived the rebuilds; run-ahead ones were dropped first
    assert len(cache.sequences("p")) - len(kept) < 9


def test_a_running_request_whose_prompt_was_evicted_keeps_working():
    cache = RolloutCache(max_depth=8, max_match=4, max_bytes=1 << 30)
    cache.start_request("r", "a", [1, 2, 3])
    cache.add_tokens("r", [4, 5])
    cache.forget("a")
    cache.add_tokens("r", [6])  # nothing is stored, nothing fails
    assert cache.draft_request("r", [1, 2, 3, 4, 5, 6], 4).token_ids == []
    with pytest.raises(ValueError, match="out of range"):
        cache.add_tokens("r", [-3])
    cache.stop_request("r")
    assert "a" not in cache and cache.stats().active_requests == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_node_cap_rebuilds_from_the_newest_rollouts_and_keeps_running_ones(backend):
    cache = RolloutCache(max_depth=8, max_match=4, max_nodes_per_prompt=400, backend=backend)
    rng = random.Random(0)
    cache.start_request("live", "p", [1, 2, 3, 4])
    cache.add_tokens("live", [7, 7, 7])
    for i in range(30):
        cache.add_sequence("p", [rng.randrange(40) for _ in range(30)])
        cache.add_tokens("live", [i % 5])
    seqs = cache.sequences("p")
    assert len(seqs) < 31  # old rollouts were dropped
    assert seqs[0] == [1, 2, 3, 4, 7, 7, 7] + [i % 5 for i in range(30)]  # the running one survived
    cache.add_tokens("live", [42, 43])
    assert cache.count("p", [42, 43]) == 1
    for path in ([7, 7], [0, 1, 2], [3]):
        assert cache.count("p", path) == occurrences(cache.sequences("p"), path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_load_round_trip(tmp_path, backend):
    rng = random.Random(1)
    cache = RolloutCache(max_depth=12, max_match=6, max_bytes=1 << 28, backend=backend)
    keys = ["text", 7, ("task", 3)]
    for key in keys:
        for _ in range(3):
            cache.add_sequence(key, [rng.randrange(20) for _ in range(60)])
    cache.start_request("r", "text", [5, 5, 5])
    cache.add_tokens("r", [1, 2, 3])
    path = tmp_path / "sub" / "cache.npz"
    cache.save(path)
    assert os.listdir(path.parent) == ["cache.npz"]  # no temporary file left behind
    loaded = RolloutCache.load(path, backend=backend)
    assert loaded.prompt_keys() == cache.prompt_keys()
    assert (loaded.max_depth, loaded.max_match, loaded.max_bytes) == (12, 6, 1 << 28)
    for key in keys:
        assert loaded.sequences(key) == cache.sequences(key)
        seq = cache.sequences(key)[1]
        for i in range(0, 50, 7):
            assert loaded.count(key, seq[i : i + 5]) == cache.count(key, seq[i : i + 5])
            assert loaded.draft(key, seq[: i + 3], 8) == cache.draft(key, seq[: i + 3], 8)
    assert loaded.stats().active_requests == 0 and loaded.stats().tokens == cache.stats().tokens


@pytest.mark.parametrize("backend", BACKENDS)
def test_export_import_moves_one_prompt_tree(backend):
    rng = random.Random(2)
    source = RolloutCache(max_depth=12, max_match=6, backend=backend)
    for key in ("moving", ("task", 3), "staying"):
        for _ in range(3):
            source.add_sequence(key, [rng.randrange(20) for _ in range(40)])
    source.start_request("live", "moving", [5, 5, 5])
    source.add_tokens("live", [1, 2, 3])  # a running rollout goes as far as it got
    target = RolloutCache(max_depth=12, max_match=6, backend=backend)
    target.add_sequence("moving", [9, 9, 9, 9])  # the target's own history of that prompt is kept
    for key in ("moving", ("task", 3)):
        data = source.export_prompt(key)
        assert isinstance(data, bytes) and target.import_prompt(data) == key
    assert target.sequences("moving") == [[9, 9, 9, 9]] + source.sequences("moving")
    assert target.sequences(("task", 3)) == source.sequences(("task", 3))
    assert "staying" not in target
    seq = source.sequences("moving")[0]
    for i in range(0, 30, 5):
        assert target.count("moving", seq[i : i + 4]) == source.count("moving", seq[i : i + 4])
        assert target.draft(("task", 3), source.sequences(("task", 3))[1][: i + 3], 8) == source.draft(
            ("task", 3), source.sequences(("task", 3))[1][: i + 3], 8
        )
    with pytest.raises(ValueError, match="unknown prompt key"):
        source.export_prompt("never seen")
    with pytest.raises(ValueError, match="not a saved RolloutCache"):
        target.import_prompt(b"garbage")


def test_save_is_atomic_and_load_rejects_garbage(tmp_path):
    path = tmp_path / "cache.npz"
    good = RolloutCache(max_depth=4, max_match=2)
    good.add_sequence("a", [1, 2, 3])
    good.save(path)
    bad = RolloutCache(max_depth=4, max_match=2)
    bad.add_sequence(frozenset({1}), [1, 2])
    with pytest.raises(ValueError, match="cannot save prompt key"):
        bad.save(path)
    assert RolloutCache.load(path).sequences("a") == [[1, 2, 3]]  # the old file is intact
    assert os.listdir(tmp_path) == ["cache.npz"]
    (tmp_path / "junk.npz").write_bytes(b"not a cache")
    with pytest.raises(ValueError, match="not a saved RolloutCache"):
        RolloutCache.load(tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="not a saved RolloutCache"):
        RolloutCache.load(tmp_path / "missing.npz")


def test_bad_input_gives_defined_results_or_clear_errors():
    cache = RolloutCache(max_depth=8, max_match=4)
    cache.add_sequence("p", [1, 2, 3, 1, 2, 4])
    assert cache.draft("p", [], 4).token_ids == []
    assert cache.draft("unknown", [1, 2], 4).token_ids == []
    assert cache.count("unknown", [1]) == 0
    assert cache.draft("p", [1, 2], 0).token_ids == []
    with pytest.raises(ValueError, match="budget"):
        cache.draft("p", [1, 2], -1)
    with pytest.raises(ValueError, match=r"context\[1\]"):
        cache.draft("p", [1, -2], 4)
    with pytest.raises(ValueError, match="not an integer"):
        cache.draft("p", [1, "x"], 4)
    with pytest.raises(ValueError, match="unknown request"):
        cache.add_tokens("nobody", [1])
    with pytest.raises(ValueError, match="unknown request"):
        cache.draft_request("nobody", [1], 2)
    with pytest.raises(ValueError, match="unknown request"):
        cache.stop_request("nobody")
    cache.start_request("r", "p", [1])
    with pytest.raises(ValueError, match="already running"):
        cache.start_request("r", "p", [1])
    before = cache.sequences("p")
    with pytest.raises(ValueError, match=r"token_ids\[2\]"):
        cache.add_tokens("r", [2, 3, 1.5])
    with pytest.raises(ValueError, match="prompt_ids"):
        cache.start_request("s", "p", [1, -1])
    assert cache.sequences("p") == before and cache.stats().active_requests == 1
    with pytest.raises(ValueError, match="max_match"):
        RolloutCache(max_depth=4, max_match=4)
    with pytest.raises(ValueError, match="backend"):
        RolloutCache(backend="gpu")
