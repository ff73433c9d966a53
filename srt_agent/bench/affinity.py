"""`srt-agent bench affinity`: accepted draft tokens per step on a simulated multi-replica split, with prompt
affinity (:class:`PromptAffinityRouter`) against verl's default routing (its ``GlobalRequestLoadBalancer``:
sticky per request, least in-flight otherwise).

Each replica owns an SRT drafter (its own rollout trees). The cache benchmark's synthetic GRPO workload
runs in lockstep, as a batched engine runs it: every request of a training step is routed when it starts,
drafts from its replica's trees with the given budget, and is verified greedily against its true next tokens.
Besides accepted tokens per draft it counts each replica's drafts (verification rows): with whole prompts
pinned to replicas the load is uneven, and the busiest replica sets the step's time.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from verl.workers.rollout.router import GlobalRequestLoadBalancer

from ..console import Progress
from ..drafting import SRTDrafter
from ..drafting.draft import Draft
from ..integrations.verl.affinity import PromptAffinityRouter
from .cache import WorkloadSpec, make_workload, run_drafter

POLICIES = ("affinity", "affinity-bounded", "verl-default")
BOUNDED_LOAD_FACTOR = 1.25


@dataclass
class AffinityBenchSpec:
    workload: WorkloadSpec = field(default_factory=lambda: WorkloadSpec(prompts=32, rollouts=8, steps=3, tokens=600))
    replicas: int = 4
    budget: int = 16
    seed: int = 0

    @classmethod
    def quick(cls) -> AffinityBenchSpec:
        return cls(WorkloadSpec(prompts=8, rollouts=4, steps=2, tokens=120, vocab=2000), replicas=4, budget=8)


class RoutedDrafter:
    """Several replicas' drafters behind one Drafter: each request goes where the router sends it."""

    name = "routed"

    def __init__(self, router: Any, replicas: Sequence[SRTDrafter], send_prompt_key: bool):
        self.router = router
        self.replicas = list(replicas)
        self.send_prompt_key = send_prompt_key
        self.placed: dict[Hashable, tuple[str, int]] = {}
        self.requests_per_replica = [0] * len(self.replicas)
        self.drafts_per_replica = [0] * len(self.replicas)  # verification rows: each replica's share of the work
        self.step = 0  # request ids repeat across steps; the router sees them per step (verl's are uuids)

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        fields = {"prompt_key": prompt_key} if self.send_prompt_key else {}
        server_id, index = self.router.acquire_server(f"{self.step}/{request_id}", **fields)
        self.placed[request_id] = (server_id, index)
        self.requests_per_replica[index] += 1
        self.replicas[index].start_request(request_id, prompt_key, prompt_ids)

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self.replicas[self.placed[request_id][1]].add_tokens(request_id, token_ids)

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        index = self.placed[request_id][1]
        self.drafts_per_replica[index] += 1
        return self.replicas[index].draft(request_id, context, budget)

    def stop_request(self, request_id: Hashable) -> None:
        server_id, index = self.placed.pop(request_id)
        self.replicas[index].stop_request(request_id)
        self.router.release_server(server_id)

    def end_step(self) -> None:
        self.step += 1
        for replica in self.replicas:
            replica.end_step()


def make_router(policy: str, replicas: int) -> Any:
    servers = {f"replica-{i}": i for i in range(replicas)}
    if policy == "affinity":
        return PromptAffinityRouter(servers)
    if policy == "affinity-bounded":
        return PromptAffinityRouter(servers, {"load_factor": BOUNDED_LOAD_FACTOR})
    if policy == "verl-default":
        return GlobalRequestLoadBalancer(servers)
    raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")


def run_affinity_bench(spec: AffinityBenchSpec, work: Progress | None = None) -> dict:
    """Both policies on the same workload; the JSON-ready result. `work` hears of each policy's steps."""
    workload = make_workload(spec.workload)
    work = work or Progress.unseen()
    work.update(total=len(POLICIES) * len(workload))
    result: dict = {
        "workload": asdict(spec.workload),
        "replicas": spec.replicas,
        "budget": spec.budget,
        "requests": sum(len(step) for step in workload),
        "policies": {},
    }
    for policy in POLICIES:
        random.seed(spec.seed)  # verl's balancer breaks ties with the global random module
        drafter = RoutedDrafter(
            make_router(policy, spec.replicas), [SRTDrafter() for _ in range(spec.replicas)], policy != "verl-default"
        )
        per_step = []
        for index, step in enumerate(workload, start=1):
            work.now(f"{policy} step {index}")
            per_step.append(run_drafter(drafter, [step], "lockstep", spec.budget))
            work.done(f"{policy} step {index}: {per_step[-1].accepted_per_draft:.2f} accepted per draft")
        drafts = sum(r.drafts for r in per_step)
        caches = [replica.cache for replica in drafter.replicas]
        result["policies"][policy] = {
            "accepted_per_draft": sum(r.accepted_per_draft * r.drafts for r in per_step) / max(drafts, 1),
            "accepted_per_step": [r.accepted_per_draft for r in per_step],
            "drafts": drafts,
            "tokens": sum(r.tokens for r in per_step),
            "requests_per_replica": drafter.requests_per_replica,
            "drafts_per_replica": drafter.drafts_per_replica,
            "busiest_replica_drafts": max(drafter.drafts_per_replica),
            "prompt_copies": sum(len(cache) for cache in caches),
            "tree_bytes": sum(cache.stats().bytes for cache in caches),
        }
    default = result["policies"]["verl-default"]
    result["vs_verl_default"] = {
        policy: {
            "accepted_per_draft": figures["accepted_per_draft"] / default["accepted_per_draft"],
            "busiest_replica_drafts": figures["busiest_replica_drafts"] / default["busiest_replica_drafts"],
        }
        for policy, figures in result["policies"].items()
        if policy != "verl-default"
    }
    return result


def result_table(result: dict):
    """A rich table: one row per policy."""
    from rich.table import Table

    steps = len(next(iter(result["policies"].values()))["accepted_per_step"])
    table = Table(
        "routing",
        "accepted/draft",
        *[f"step {s + 1}" for s in range(steps)],
        "requests per replica",
        "busiest replica's drafts",
        "prompt trees",
        "tree MB",
    )
    for policy, r in result["policies"].items():
        table.add_row(
            policy,
            f"{r['accepted_per_draft']:.2f}",
            *[f"{a:.2f}" for a in r["accepted_per_step"]],
            " / ".join(str(n) for n in r["requests_per_replica"]),
            str(r["busiest_replica_drafts"]),
            str(r["prompt_copies"]),
            f"{r['tree_bytes'] / 1e6:.1f}",
        )
    return table
