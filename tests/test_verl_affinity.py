"""Prompt affinity without a cluster: the consistent-hash ring, the router's placement, and the affinity bench."""

from __future__ import annotations

import pytest

pytest.importorskip("verl.workers.rollout.router", reason="verl is an optional extra: pip install 'srt-agent[verl]'")

from srt_agent.engine.engine import default_prompt_key  # noqa: E402
from srt_agent.integrations.verl.affinity import ConsistentHashRing, PromptAffinityRouter  # noqa: E402
from srt_agent.integrations.verl.affinity_bench import AffinityBenchSpec, run_affinity_bench  # noqa: E402

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


def test_router_sends_siblings_to_their_prompts_owner_and_keeps_requests_sticky():
    router = PromptAffinityRouter({name: f"handle-{name}" for name in "abcd"})
    prompt = list(range(100, 140))
    owner = router.ring.owner(default_prompt_key(prompt))
    for sibling in range(8):  # a GRPO group: same first-turn prompt, different request ids
        assert router.acquire_server(f"r{sibling}", prompt_ids=prompt) == (owner, f"handle-{owner}")
    assert router.get_total_inflight() == 8
    # later turns of a trajectory carry a longer prompt but stay on the same replica (sticky by request id)
    assert router.acquire_server("r0", prompt_ids=prompt + [1, 2, 3])[0] == owner
    assert router.acquire_server("sent", prompt_key="task-7")[0] == router.ring.owner("task-7")
    for _ in range(10):
        router.release_server(owner)
    assert router.get_status()["servers"][owner] == 0


def test_bounded_loads_place_new_prompts_evenly_and_keep_siblings_together():
    plain = PromptAffinityRouter({name: name for name in "abcd"})
    bounded = PromptAffinityRouter({name: name for name in "abcd"}, {"load_factor": 1.0})
    for router in (plain, bounded):
        for i in range(40):
            router.acquire_server(f"p{i}-first", prompt_key=f"p{i}")
    assert max(plain.get_status()["servers"].values()) > 10  # the ring alone is uneven for 40 prompts
    assert sorted(bounded.get_status()["servers"].values()) == [10, 10, 10, 10]
    home = bounded.acquire_server("p0-first", prompt_key="p0")[0]
    assert all(bounded.acquire_server(f"p0-sibling{j}", prompt_key="p0")[0] == home for j in range(8))  # over cap
    with pytest.raises(ValueError, match="load_factor"):
        PromptAffinityRouter({}, {"load_factor": 0.5})
    with pytest.raises(RuntimeError, match="No available servers"):
        PromptAffinityRouter({}).acquire_server("r", prompt_key="k")


def test_router_records_which_prompts_move_when_replicas_change():
    router = PromptAffinityRouter({name: name for name in "abc"}, {"migrate_trees": False})
    for i in range(300):
        router.acquire_server(f"r{i}", prompt_key=f"p{i}")
    owners = {f"p{i}": router.ring.owner(f"p{i}") for i in range(300)}
    router.remove_servers(["b"])
    assert {key for key, _, _ in router.migrations} == {k for k, o in owners.items() if o == "b"}
    assert all(old == "b" and new in "ac" for _, old, new in router.migrations)
    router.clear_sticky_cache()
    assert all(router.acquire_server(f"again{i}", prompt_key=f"p{i}")[0] != "b" for i in range(300))


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
