"""Prompt affinity for verl clusters: every request of a prompt goes to the replica that holds its tree.

:class:`ConsistentHashRing` maps prompt keys to replicas so that a replica joining or leaving moves only
the keys it gains or loses (about 1/n of them). :class:`PromptAffinityRouter` is a verl load balancer
(``actor_rollout_ref.rollout.router_config_path`` → a YAML with ``router_class:
srt_agent.integrations.verl.affinity.PromptAffinityRouter``): sticky per request id like verl's default,
but a new request goes to its prompt's owner instead of the least-loaded replica, so GRPO siblings and
later epochs of a prompt find their history. When replicas join or leave, the trees of the prompts that
change owner are exported by the old owner and imported by the new one through Ray's object store.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

from ...drafting.trees.keys import prompt_key as first_turn_key

DEFAULT_VIRTUAL_NODES = 64
DEFAULT_STICKY_SIZE = 10000  # request ids remembered for sticky routing (verl's default)
DEFAULT_KNOWN_PROMPTS = 100000  # prompt keys remembered for tree migration


def ring_hash(text: str) -> int:
    """A stable 64-bit hash (the same in every process, unlike Python's ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ConsistentHashRing:
    """Nodes placed at `virtual_nodes` points each on a 64-bit ring; a key belongs to the next point."""

    def __init__(self, nodes: Sequence[str] = (), virtual_nodes: int = DEFAULT_VIRTUAL_NODES):
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be >= 1, got {virtual_nodes}")
        self.virtual_nodes = virtual_nodes
        self._points: list[int] = []
        self._owners: list[str] = []
        for node in nodes:
            self.add(node)

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self._owners))

    def add(self, node: str) -> None:
        if node in self._owners:
            return
        for i in range(self.virtual_nodes):
            point = ring_hash(f"{node}#{i}")
            at = bisect.bisect(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, node)

    def remove(self, node: str) -> None:
        keep = [(p, o) for p, o in zip(self._points, self._owners) if o != node]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def owner(self, key: Hashable) -> str:
        """The node that owns `key`; ValueError on an empty ring."""
        return next(self.successors(key))

    def successors(self, key: Hashable) -> Iterator[str]:
        """Distinct nodes in ring order from `key`'s position: its owner first, then the fallbacks."""
        if not self._points:
            raise ValueError("the ring has no nodes")
        start = bisect.bisect(self._points, ring_hash(str(key)))
        seen: set[str] = set()
        for i in range(len(self._points)):
            node = self._owners[(start + i) % len(self._points)]
            if node not in seen:
                seen.add(node)
                yield node


class PromptAffinityRouter:
    """verl's load-balancer protocol with prompt affinity (plain class; verl wraps it with ``ray.remote``).

    The prompt key of a request is the ``prompt_key`` its agent loop sends (srt-agent's ``srt_retool``
    does on the ``srt`` backend), else a hash of its first turn's ``prompt_ids`` (what GRPO siblings share).
    A prompt keeps the replica it was first placed on (where its tree is) until that replica leaves or a
    joining one becomes its owner.
    Options (the router YAML): ``virtual_nodes``; ``load_factor`` (off by default): when set, a new prompt
    whose owner already has more than ``load_factor`` × the mean in-flight load is placed on the next
    replica on the ring (consistent hashing with bounded loads); ``migrate_trees`` (default true).
    """

    def __init__(self, servers: dict[str, Any], config: dict | None = None):
        config = dict(config or {})
        self.load_factor: float | None = config.get("load_factor")
        if self.load_factor is not None and self.load_factor < 1:
            raise ValueError(f"load_factor must be >= 1 (or null), got {self.load_factor}")
        self.migrate_trees = bool(config.get("migrate_trees", True))
        self.ring = ConsistentHashRing(virtual_nodes=int(config.get("virtual_nodes", DEFAULT_VIRTUAL_NODES)))
        self._servers: dict[str, Any] = {}
        self._inflight: dict[str, int] = {}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._known: OrderedDict[Hashable, str] = OrderedDict()  # prompt key -> replica that served it last
        self.migrations: list[tuple[Hashable, str, str]] = []  # (prompt key, from, to), oldest first
        for sid, handle in servers.items():
            self._add(sid, handle)

    # ---- verl's RequestLoadBalancer protocol ---------------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids", "prompt_key"]

    def require_release_fields(self) -> list[str]:
        return []

    def acquire_server(
        self, request_id: str, prompt_ids: Sequence[int] | None = None, prompt_key: Hashable | None = None, **_: Any
    ) -> tuple[str, Any]:
        """The replica for `request_id`: its sticky one, else its prompt's owner."""
        if not self._servers:
            raise RuntimeError("No available servers in load balancer")
        sid = self._sticky.get(request_id)
        if sid not in self._servers:
            key = self.prompt_key(request_id, prompt_ids, prompt_key)
            sid = self._known.get(key)
            if sid not in self._servers:  # a prompt not seen yet (or whose replica left) gets a home
                sid = self._place(key)
            self._remember(self._known, key, sid, DEFAULT_KNOWN_PROMPTS)
        self._remember(self._sticky, request_id, sid, DEFAULT_STICKY_SIZE)
        self._inflight[sid] += 1
        return sid, self._servers[sid]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def add_servers(self, servers: dict[str, Any]) -> None:
        before = dict(self._known)
        joined = set(servers) - set(self._servers)
        for sid, handle in servers.items():
            self._add(sid, handle)
        self._migrate(before, joined=joined)

    def remove_servers(self, server_ids: list[str]) -> None:
        before = dict(self._known)
        handles = dict(self._servers)
        for sid in server_ids:
            self.ring.remove(sid)
            self._servers.pop(sid, None)
            self._inflight.pop(sid, None)
        self._migrate(before, handles)

    def get_all_servers(self) -> list[str]:
        return list(self._servers)

    def get_status(self) -> dict:
        return {
            "servers": dict(self._inflight),
            "total_inflight": sum(self._inflight.values()),
            "active_servers": len(self._servers),
            "registered_handles": list(self._servers),
            "prompts_per_server": {sid: sum(1 for s in self._known.values() if s == sid) for sid in self._servers},
            "migrations": len(self.migrations),
        }

    def clear_sticky_cache(self) -> dict:
        """Forget request stickiness; prompt ownership stays (it is the ring's, not the cache's)."""
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())

    # ---- placement ------------------------------------------------------------------------------
    @staticmethod
    def prompt_key(request_id: str, prompt_ids: Sequence[int] | None, prompt_key: Hashable | None) -> Hashable:
        """The routing key: the one sent, else the key of the first turn's prompt (``cache.keys``), else the
        request id."""
        if prompt_key is not None:
            return prompt_key
        if prompt_ids is not None and len(prompt_ids):
            return first_turn_key(prompt_ids)
        return request_id

    def _place(self, key: Hashable) -> str:
        if self.load_factor is None:
            return self.ring.owner(key)
        cap = math.ceil(self.load_factor * (sum(self._inflight.values()) + 1) / len(self._servers))
        candidates = list(self.ring.successors(key))
        return next((sid for sid in candidates if self._inflight[sid] < cap), candidates[0])

    def _add(self, sid: str, handle: Any) -> None:
        self._servers[sid] = handle
        self._inflight.setdefault(sid, 0)
        self.ring.add(sid)

    def _migrate(
        self, before: dict[Hashable, str], handles: dict[str, Any] | None = None, joined: set[str] = frozenset()
    ) -> None:
        """Move the known prompts that change replica, and their trees (the old replica exports, the new
        imports): those whose replica left get a new home, those a `joined` replica now owns go to it.
        Every other prompt stays, also one that bounded loads placed off its owner."""
        if not self._servers:
            return
        handles = handles or self._servers
        for key, old in before.items():
            owner = self.ring.owner(key)
            new = self._place(key) if old not in self._servers else owner if owner in joined else old
            if new == old:
                continue
            self._known[key] = new
            self.migrations.append((key, old, new))
            if self.migrate_trees and old in handles:
                # The exported bytes go through Ray's object store; a replica that is gone exports nothing.
                self._servers[new].import_prompt.remote(handles[old].export_prompt.remote(key))

    @staticmethod
    def _remember(table: OrderedDict, key: Hashable, value: str, limit: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > limit:
            table.popitem(last=False)
