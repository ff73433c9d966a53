"""Prompt affinity without a cluster: the consistent-hash ring, the router's placement, and the affinity bench."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("verl.workers.rollout.router", reason="verl is an optional extra: pip install 'srt-agent[verl]'")

from srt_agent.bench.affinity import AffinityBenchSpec, run_affinity_bench  # noqa: E402
from srt_agent.drafting.trees.keys import prompt_key  # noqa: E402
from srt_agent.integrations.verl.affinity import ConsistentHashRing, PromptAffinityRouter  # noqa: E402

KEYS = [f"prompt-{i}" for i in range(2000)]


def test_ring_spreads_keys_and_moves_only_what_a_joining_or_leaving_node_takes():
    ring = ConsistentHashRing(["a", "b", "c", "d"])
    before = {k: ring.owner(k) for k in KEYS}
    shares = [sum(1 for o in before.values() if o == n) / len(KEYS) for n in "abcd"]
    assert all(0.15 < s < 0.35 for s in shares)  # 64 virtual nodes each: roughly even
    ring.add("e")
    after = {k: ring.owner(k) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "e" for k in moved)  # only keys the new node takes move
    assert 0.1 < len(moved) / len(KEYS) < 0.3  # about 1/5 of them
    ring.remove("e")
    assert {k: ring.owner(k) for k in KEYS} == before  # leaving restores the old owners exactly
    ring.remove("b")
    assert all(ring.owner(k) == before[k] for k in KEYS if before[k] != "b")
    assert list(ConsistentHashRing(["x", "y"]).successors("k")) in (["x", "y"], ["y", "x"])
    with pytest.raises(ValueError, match="no nodes"):
        ConsistentHashRing().owner("k")


LOAD_FACTORS = st.sampled_from([None, 1.0, 1.25, 2.0])
PROPERTIES = settings(max_examples=80, deadline=None, derandomize=True)


@st.composite
def workloads(draw, max_prompts: int = 24):
    """Steps of GRPO groups over a pool of prompts (a prompt recurs across steps), sent in a random order,
    with in-flight calls released at random moments; some prompts are keyed by their token ids, some by the
    key their agent loop sends. Yields ("acquire", request id, prompt, turn) and ("release", call index)."""
    prompts = draw(st.integers(1, max_prompts))
    events = []
    calls = 0
    open_calls: list[int] = []
    for step in range(draw(st.integers(1, 4))):
        chosen = draw(st.lists(st.integers(0, prompts - 1), min_size=1, max_size=prompts, unique=True))
        requests = [(f"s{step}-p{p}-{j}", p) for p in chosen for j in range(draw(st.integers(1, 6)))]
        for rid, p in draw(st.permutations(requests)):
            for turn in range(draw(st.integers(1, 2))):  # a second turn: same request id, longer prompt
                events.append(("acquire", rid, p, turn))
                open_calls.append(calls)
                calls += 1
                while open_calls and draw(st.booleans()):
                    events.append(("release", open_calls.pop(draw(st.integers(0, len(open_calls) - 1)))))
        events += [("release", c) for c in open_calls]  # the step ends: every call has come back
        open_calls = []
    return events


def first_turn(prompt: int) -> list[int]:
    return [1000 + prompt] * 8


def key_of(prompt: int):
    """The prompt's key: odd prompts send one (as srt_retool does), even ones are keyed by their first turn."""
    return f"task-{prompt}" if prompt % 2 else prompt_key(first_turn(prompt))


def acquire(router, rid: str, prompt: int, turn: int = 0) -> str:
    """Route one call of `prompt`; turn t's prompt extends the first turn's by 3t tokens."""
    if prompt % 2:
        return router.acquire_server(rid, prompt_key=key_of(prompt))[0]
    return router.acquire_server(rid, prompt_ids=first_turn(prompt) + [7] * (3 * turn))[0]


def loads(router) -> dict[str, int]:
    return router.get_status()["servers"]


def play(router, events) -> dict[int, str]:
    """Run `events`; checks, call by call, that a prompt always goes where it went first (siblings, later
    steps), a request's later turns go where its first did, and with `load_factor` that a new prompt goes to
    a replica whose in-flight load, counting it, is at most ceil(load_factor × the mean load counting it).
    Returns each prompt's replica."""
    home: dict[int, str] = {}
    where: dict[str, str] = {}
    calls: list[str] = []
    for event in events:
        if event[0] == "release":
            router.release_server(calls[event[1]])
            continue
        _, rid, prompt, turn = event
        before = loads(router)
        sid = acquire(router, rid, prompt, turn)
        calls.append(sid)
        assert where.setdefault(rid, sid) == sid, "a later turn changed replica"
        if prompt in home:
            assert sid == home[prompt], "a prompt's request left its replica"
        else:
            home[prompt] = sid
            if router.load_factor is not None:
                bound = math.ceil(router.load_factor * (sum(before.values()) + 1) / len(before))
                assert loads(router)[sid] <= bound, (loads(router), bound)
    assert router.get_total_inflight() == 0
    return home


@PROPERTIES
@given(replicas=st.integers(1, 6), load_factor=LOAD_FACTORS, events=workloads())
def test_a_prompt_stays_on_one_replica_and_new_prompts_respect_the_load_bound(replicas, load_factor, events):
    router = PromptAffinityRouter({f"r{i}": f"handle-{i}" for i in range(replicas)}, {"load_factor": load_factor})
    home = play(router, events)
    assert set(home.values()) <= set(router.get_all_servers())


def test_bounded_loads_spread_single_requests_evenly():
    plain = PromptAffinityRouter({name: name for name in "abcd"})
    bounded = PromptAffinityRouter({name: name for name in "abcd"}, {"load_factor": 1.0})
    for router in (plain, bounded):
        for i in range(40):
            router.acquire_server(f"p{i}-first", prompt_key=f"p{i}")
    assert max(loads(plain).values()) > 10  # the ring alone is uneven for 40 prompts
    assert sorted(loads(bounded).values()) == [10, 10, 10, 10]
    with pytest.raises(ValueError, match="load_factor"):
        PromptAffinityRouter({}, {"load_factor": 0.5})
    with pytest.raises(RuntimeError, match="No available servers"):
        PromptAffinityRouter({}).acquire_server("r", prompt_key="k")


def homes(router, prompts, tag: str) -> dict[int, str]:
    """Where each prompt's next request goes (a fresh request id each, released at once)."""
    out = {}
    for p in prompts:
        out[p] = acquire(router, f"{tag}-{p}", p)
        router.release_server(out[p])
    return out


@PROPERTIES
@given(
    replicas=st.integers(2, 6),
    load_factor=LOAD_FACTORS,
    events=workloads(max_prompts=60),
    join=st.booleans(),
    leaving=st.integers(0, 5),
)
def test_a_replica_joining_or_leaving_moves_only_the_prompts_it_gains_or_loses(
    replicas, load_factor, events, join, leaving
):
    names = [f"r{i}" for i in range(replicas)]
    router = PromptAffinityRouter({n: n for n in names}, {"load_factor": load_factor, "migrate_trees": False})
    before = play(router, events)
    assert homes(router, before, "check") == before
    if join:
        router.add_servers({"new": "new"})
    else:
        gone = names[leaving % replicas]
        router.remove_servers([gone])
    after = homes(router, before, "after")
    moved = {p for p in before if after[p] != before[p]}
    if join:
        assert all(after[p] == "new" for p in moved)  # only what the new replica gains moves, and to it
    else:
        assert moved == {p for p in before if before[p] == gone}  # exactly what the leaving one held moves
        assert gone not in after.values()
    assert sorted(map(repr, router.migrations)) == sorted(repr((key_of(p), before[p], after[p])) for p in moved)


def test_prompts_a_joining_replica_gains_are_about_its_share():
    router = PromptAffinityRouter({n: n for n in "abcd"}, {"migrate_trees": False})
    prompts = range(1, 2001, 2)  # 1000 prompts with sent keys
    before = homes(router, prompts, "first")
    router.add_servers({"e": "e"})
    gained = sum(1 for p, sid in homes(router, prompts, "after").items() if sid != before[p])
    assert 0.1 < gained / len(prompts) < 0.3  # about 1/5


def test_affinity_bench_quick_run_reports_both_policies():
    result = run_affinity_bench(AffinityBenchSpec.quick())
    policies = result["policies"]
    assert set(policies) == {"affinity", "affinity-bounded", "verl-default"}
    for figures in policies.values():
        assert figures["drafts"] > 0 and len(figures["accepted_per_step"]) == result["workload"]["steps"]
        assert sum(figures["requests_per_replica"]) == result["requests"]
    # affinity keeps each prompt's history on one replica: every prompt is stored once
    assert policies["affinity"]["prompt_copies"] == result["workload"]["prompts"]
    assert policies["verl-default"]["prompt_copies"] > result["workload"]["prompts"]
    assert result["vs_verl_default"]["affinity"]["accepted_per_draft"] == pytest.approx(
        policies["affinity"]["accepted_per_draft"] / policies["verl-default"]["accepted_per_draft"]
    )
    for figures in policies.values():
        assert sum(figures["drafts_per_replica"]) == figures["drafts"]
