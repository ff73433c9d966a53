"""`RolloutCache`: one token tree per prompt, under a global byte budget, saved across restarts.

Each prompt key owns a tree of every rollout produced for it (all samples, all policy versions). A running
request streams its tokens (sampled or forced) into its prompt's tree as they come, so siblings of the same
prompt draft from each other within a step. The first ``max_match`` prompt tokens go in ahead of each
response so the first response tokens can be drafted too.

Memory is bounded twice, each bound kept at amortised O(1) work per inserted token at any batch:

* a prompt whose tree grows past ``max_nodes_per_prompt`` nodes is rebuilt to about half of it: running
  sequences first (whole while they fit, else trimmed to their last ``max_depth`` tokens, all a running
  sequence's next windows need), then the newest finished ones, real rollouts before run-ahead content. So
  running content cannot pin a tree above its cap, and since a rebuild waits until half as many tokens as it
  kept went in since the last one, rebuilding costs at most a few re-inserted tokens per inserted token;
* when the total passes ``max_bytes``, run-ahead content goes first, then whole prompts, least recently used
  first, down to seven eighths of the budget (so the next eviction waits for an eighth of it to fill again).

Run-ahead content (continuations generated in idle capacity, never trained on) drafts like any rollout but
goes first when room runs out. ``CacheStats`` counts the work: tokens inserted, tokens re-inserted by
rebuilds, rebuilds, trimmed sequences, evictions. The file format that saves the trees is in `persistence`.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..draft import Draft
from ..tokens import check_budget, check_tokens
from . import persistence
from .tree import extend_rows_for, tree_class


@dataclass
class CacheStats:
    """Size of the cache: prompts, tree nodes, stored tokens, bytes, sequences, requests, evictions."""

    prompts: int
    nodes: int
    tokens: int
    bytes: int
    sequences: int
    active_requests: int
    evicted_prompts: int
    run_ahead_sequences: int = 0
    run_ahead_tokens: int = 0
    run_ahead_bytes: int = 0  # the trees' bytes in proportion to the run-ahead share of their tokens
    evicted_run_ahead: int = 0  # run-ahead sequences dropped to make room
    inserted_tokens: int = 0  # tokens the callers stored
    rebuilt_tokens: int = 0  # tokens re-inserted by node-cap rebuilds and trims (the bounds' work)
    rebuilds: int = 0
    trimmed_sequences: int = 0  # running sequences a rebuild cut to their last max_depth tokens

    @property
    def work_per_token(self) -> float:
        """Tokens put through a tree per token stored: 1 plus what keeping the bounds cost."""
        return (self.inserted_tokens + self.rebuilt_tokens) / max(1, self.inserted_tokens)


@dataclass(eq=False)
class _PromptTree:
    tree: Any
    seqs: list[int] = field(default_factory=list)  # sequence ids, oldest first
    active: dict[Hashable, int] = field(default_factory=dict)  # request id -> open sequence id
    run_ahead: set[int] = field(default_factory=set)  # ids of run-ahead sequences
    nbytes: int = 0  # the tree's bytes, as counted in the cache's total
    base: int = 0  # the tree's tokens after the last rebuild (those stored since: num_tokens - base)
    gate: int = 0  # tokens to store before the next node-cap rebuild (half of what the last one kept)

    def run_ahead_tokens(self) -> int:
        return sum(self.tree.sequence_length(s) for s in self.run_ahead)


@dataclass
class _RowPlan:
    """Where a batch's rows store (`RolloutCache.add_tokens_rows`), kept until a request moves or stops."""

    ids: list
    rows: list  # each row's _PromptTree (None: detached)
    trees: list
    seqs: np.ndarray
    entries: list  # the distinct rows
    detached: list[int]


@dataclass
class _Request:
    prompt_key: Hashable
    seq: int
    detached: bool = False  # its prompt was evicted while it ran: nothing more is stored for it


class RolloutCache:
    """Per-prompt rollout trees with streaming inserts, drafting, LRU eviction and persistence."""

    def __init__(
        self,
        max_depth: int = 64,
        max_match: int = 32,
        max_bytes: int = 1 << 30,
        max_nodes_per_prompt: int = 1 << 21,
        backend: str = "auto",
    ) -> None:
        if not 1 <= max_match < max_depth:
            raise ValueError(f"need 1 <= max_match < max_depth, got max_match={max_match}, max_depth={max_depth}")
        if max_bytes <= 0 or max_nodes_per_prompt <= 0:
            raise ValueError("max_bytes and max_nodes_per_prompt must be positive")
        self.max_depth = max_depth
        self.max_match = max_match
        self.max_bytes = max_bytes
        self.max_nodes_per_prompt = max_nodes_per_prompt
        self.backend = backend
        self._tree_cls = tree_class(backend)
        self._extend_rows = extend_rows_for(self._tree_cls)
        self._prompts: OrderedDict[Hashable, _PromptTree] = OrderedDict()  # least recently used first
        self._requests: dict[Hashable, _Request] = {}
        self._bytes = 0
        self._evicted = 0
        self._evicted_run_ahead = 0
        self._plan: _RowPlan | None = None  # dropped whenever a running request's tree or sequence changes or it stops
        self._work = dict.fromkeys(("inserted_tokens", "rebuilt_tokens", "rebuilds", "trimmed_sequences"), 0)

    # ---- streaming rollouts -------------------------------------------------------------------
    def start_request(
        self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int], run_ahead: bool = False
    ) -> None:
        """Begin a rollout of `prompt_key`; the prompt's last `max_match` tokens lead its sequence.

        `run_ahead` marks it as run-ahead content: it drafts like a rollout but is evicted first.
        """
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already running")
        prompt = check_tokens(prompt_ids, "prompt_ids")
        entry = self._touch(prompt_key)
        seq = entry.tree.add_sequence()
        entry.seqs.append(seq)
        entry.active[request_id] = seq
        if run_ahead:
            entry.run_ahead.add(seq)
        self._requests[request_id] = _Request(prompt_key, seq)
        self._extend(prompt_key, entry, seq, self.prompt_tail(prompt))

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        """Append sampled or forced tokens of a running request to its prompt's tree."""
        req = self._requests.get(request_id) or self._request(request_id)
        if req.detached:
            check_tokens(token_ids)
            return
        self._extend(req.prompt_key, self._prompts[req.prompt_key], req.seq, token_ids)

    def add_tokens_rows(self, request_ids: Sequence[Hashable], tokens: Sequence[int], offsets: Sequence[int]) -> None:
        """`add_tokens` for a batch of running requests in one call into the trees: request ``request_ids[r]`` gets
        ``tokens[offsets[r]:offsets[r + 1]]``. The same trees as that many `add_tokens` calls in row order (a
        rebuild or an eviction happens after the same row); checked before anything changes. Where to store
        each row is looked up once for a batch that comes back unchanged (one lookup a row otherwise)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        start, total = 0, len(request_ids)
        while start < total:
            plan = self._row_plan(request_ids)
            stop, self._bytes = self._extend_rows(
                plan.trees, plan.seqs, tokens, offsets, start, self.max_nodes_per_prompt, self._bytes, self.max_bytes
            )
            end = min(stop + 1, total)
            for entry in plan.entries if start == 0 and end == total else dict.fromkeys(plan.rows[start:end]):
                if entry is not None:
                    entry.nbytes = entry.tree.nbytes
            skipped = sum(int(offsets[r + 1] - offsets[r]) for r in plan.detached if start <= r < end)
            self._work["inserted_tokens"] += int(offsets[end] - offsets[start]) - skipped
            if stop < total:  # the node cap or the byte budget, after this row
                self._grown(self._requests[request_ids[stop]].prompt_key, plan.rows[stop])
            start = end

    def _row_plan(self, request_ids: Sequence[Hashable]) -> _RowPlan:
        """Where `request_ids` store (kept while no request moves, stops or loses its tree)."""
        plan = self._plan
        if plan is not None and plan.ids == request_ids:
            return plan
        reqs = [self._requests.get(rid) or self._request(rid) for rid in request_ids]
        rows = [None if req.detached else self._prompts[req.prompt_key] for req in reqs]
        self._plan = plan = _RowPlan(
            list(request_ids),
            rows,
            [None if entry is None else entry.tree for entry in rows],
            np.fromiter((req.seq for req in reqs), np.int64, len(reqs)),
            list(dict.fromkeys(rows)),
            [r for r, entry in enumerate(rows) if entry is None],
        )
        return plan

    def drop_last(self, request_id: Hashable, count: int) -> None:
        """The running request goes on from before its last `count` tokens (tokens a serving engine sampled past
        a stop that the caller drops): they stay in the tree as a finished sample (the policy did sample them),
        and the request continues in a new sequence led by the `max_match` tokens before them. O(max_match)."""
        req = self._request(request_id)
        if count <= 0 or req.detached:
            return
        self._plan = None
        entry = self._prompts[req.prompt_key]
        cut = max(0, entry.tree.sequence_length(req.seq) - count)
        lead = entry.tree.sequence(req.seq, cut - self.max_match)[: min(cut, self.max_match)]
        entry.tree.close(req.seq)
        seq = entry.tree.add_sequence()
        entry.seqs.append(seq)
        if req.seq in entry.run_ahead:
            entry.run_ahead.add(seq)
        entry.active[request_id] = req.seq = seq
        self._extend(req.prompt_key, entry, seq, lead, work="rebuilt_tokens")

    def stop_request(self, request_id: Hashable) -> None:
        """Finish a request; its tokens stay in the tree."""
        req = self._requests.pop(request_id, None)
        if req is None:
            raise ValueError(f"unknown request {request_id!r}")
        self._plan = None
        if not req.detached:
            entry = self._prompts[req.prompt_key]
            entry.tree.close(entry.active.pop(request_id))
            self._resize(entry, entry.tree.nbytes)  # closing releases the sequence's cursors

    def add_sequence(self, prompt_key: Hashable, token_ids: Sequence[int], run_ahead: bool = False) -> None:
        """Store a complete sequence (prompt tail + response) for `prompt_key` at once."""
        tokens = check_tokens(token_ids)
        entry = self._touch(prompt_key)
        seq = entry.tree.add_sequence()
        entry.seqs.append(seq)
        if run_ahead:
            entry.run_ahead.add(seq)
        entry.tree.extend(seq, tokens)
        entry.tree.close(seq)
        self._work["inserted_tokens"] += len(tokens)
        self._grown(prompt_key, entry)

    def forget(self, prompt_key: Hashable) -> None:
        """Drop `prompt_key`'s tree (its running requests stop storing tokens)."""
        if prompt_key not in self._prompts:
            raise ValueError(f"unknown prompt key {prompt_key!r}")
        self._drop(prompt_key, evicted=False)

    def prompt_tail(self, prompt_ids: Sequence[int]) -> list[int]:
        """The prompt tokens that lead each stored sequence: the last `max_match`."""
        return list(prompt_ids[len(prompt_ids) - self.max_match :] if len(prompt_ids) > self.max_match else prompt_ids)

    # ---- drafting -----------------------------------------------------------------------------
    def draft(
        self, prompt_key: Hashable, context: Sequence[int], budget: int, chain: bool = False, min_prob: float = 0.0
    ) -> Draft:
        """Draft from `prompt_key`'s tree given the full context; empty if the prompt has no tree."""
        return self._draft(self._prompts.get(prompt_key), context, budget, chain, min_prob, -1)

    def draft_request(
        self, request_id: Hashable, context: Sequence[int], budget: int, chain: bool = False, min_prob: float = 0.0
    ) -> Draft:
        """`draft` for a running request's prompt; fastest when `context` ends with its streamed tokens."""
        req = self._request(request_id)
        entry = None if req.detached else self._prompts[req.prompt_key]
        return self._draft(entry, context, budget, chain, min_prob, req.seq)

    def count(self, prompt_key: Hashable, path: Sequence[int]) -> int:
        """Occurrences of the token string `path` in `prompt_key`'s stored sequences (len <= max_depth)."""
        entry = self._prompts.get(prompt_key)
        return 0 if entry is None else entry.tree.count(check_tokens(path, "path"))

    def sequences(self, prompt_key: Hashable, run_ahead: bool = True) -> list[list[int]]:
        """The stored sequences of `prompt_key`, oldest first (running ones as far as they got);
        without the run-ahead ones unless `run_ahead`."""
        entry = self._prompts.get(prompt_key)
        if entry is None:
            return []
        return [entry.tree.sequence(s) for s in entry.seqs if run_ahead or s not in entry.run_ahead]

    def run_ahead_indices(self, prompt_key: Hashable) -> list[int]:
        """Which of `sequences(prompt_key)` are run-ahead content, as indices in that list."""
        entry = self._prompts.get(prompt_key)
        return [] if entry is None else [i for i, s in enumerate(entry.seqs) if s in entry.run_ahead]

    # ---- size ---------------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        entries = list(self._prompts.values())
        run_ahead_tokens = [e.run_ahead_tokens() for e in entries]
        return CacheStats(
            prompts=len(entries),
            nodes=sum(e.tree.num_nodes for e in entries),
            tokens=sum(e.tree.num_tokens for e in entries),
            bytes=self._bytes,
            sequences=sum(len(e.seqs) for e in entries),
            active_requests=len(self._requests),
            evicted_prompts=self._evicted,
            run_ahead_sequences=sum(len(e.run_ahead) for e in entries),
            run_ahead_tokens=sum(run_ahead_tokens),
            run_ahead_bytes=sum(e.nbytes * n // max(e.tree.num_tokens, 1) for e, n in zip(entries, run_ahead_tokens)),
            evicted_run_ahead=self._evicted_run_ahead,
            **self._work,
        )

    def __contains__(self, prompt_key: Hashable) -> bool:
        return prompt_key in self._prompts

    def __len__(self) -> int:
        return len(self._prompts)

    def prompt_keys(self) -> list[Hashable]:
        """Cached prompt keys, least recently used first."""
        return list(self._prompts)

    # ---- persistence (the file format is in persistence.py) ------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write every prompt's sequences to `path` atomically (temp file + rename).

        An interrupted save leaves the previous file as it was; the temp file of a writer that was
        killed outright is removed by the next save to the same path.
        """
        persistence.save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, backend: str = "auto", **overrides: int) -> RolloutCache:
        """Rebuild a cache saved by `save` (its config, unless overridden).

        A file that is missing, truncated, corrupted or not a saved cache raises ValueError naming the
        file and the problem; nothing is half-loaded.
        """
        return persistence.load(cls, path, backend, overrides)

    def to_bytes(self) -> bytes:
        """Every prompt's sequences and this cache's config, as `save` writes them; `from_bytes` rebuilds it."""
        return persistence.to_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes, backend: str = "auto") -> RolloutCache:
        return persistence.from_bytes(cls, data, backend)

    def export_prompt(self, prompt_key: Hashable) -> bytes:
        """One prompt's stored sequences as bytes (e.g. to move its tree to another replica through Ray's
        object store); `import_prompt` on the other side rebuilds it. Running sequences go as far as they got."""
        return persistence.export_prompt(self, prompt_key)

    def import_prompt(self, data: bytes) -> Hashable:
        """Add the sequences of an exported prompt (merged into its tree when this cache has one); returns its key."""
        return persistence.import_prompt(self, data)

    # ---- internals ----------------------------------------------------------------------------
    def _draft(
        self, entry: _PromptTree | None, context: Sequence[int], budget: int, chain: bool, min_prob: float, seq: int
    ) -> Draft:
        budget = check_budget(budget)
        tail = context[-self.max_match :]
        if entry is None or budget == 0 or not len(tail):
            check_tokens(tail, "context")
            return Draft()
        try:
            tokens, parents, scores, match_len = entry.tree.draft(tail, budget, self.max_match, chain, min_prob, seq)
        except TypeError:
            check_tokens(tail, "context")  # raises a ValueError naming the bad token
            raise
        return Draft(tokens, parents, scores, match_len)

    def _request(self, request_id: Hashable) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}: call start_request first") from None

    def _touch(self, prompt_key: Hashable) -> _PromptTree:
        """`prompt_key`'s tree (created if new), marked most recently used."""
        entry = self._prompts.get(prompt_key)
        if entry is None:
            entry = self._prompts[prompt_key] = _PromptTree(self._tree_cls(self.max_depth))
        self._prompts.move_to_end(prompt_key)
        return entry

    def _extend(
        self,
        prompt_key: Hashable,
        entry: _PromptTree,
        seq: int,
        token_ids: Sequence[int],
        work: str = "inserted_tokens",
    ) -> None:
        try:
            entry.tree.extend(seq, token_ids)
        except TypeError:
            check_tokens(token_ids)  # raises a ValueError naming the bad token
            raise
        self._work[work] += len(token_ids)
        self._grown(prompt_key, entry)

    def _grown(self, prompt_key: Hashable, entry: _PromptTree) -> None:
        """Keep the per-prompt node cap and the global byte budget after `entry` grew."""
        tree = entry.tree
        nbytes = tree.nbytes
        self._bytes += nbytes - entry.nbytes
        entry.nbytes = nbytes
        if tree.num_tokens - entry.base >= entry.gate and tree.num_nodes > self.max_nodes_per_prompt:
            half = self.max_nodes_per_prompt // 2
            self._rebuild(entry, keep_tokens=entry.tree.num_tokens * half // entry.tree.num_nodes)
        if self._bytes > self.max_bytes:
            self._evict(prompt_key)

    def _resize(self, entry: _PromptTree, nbytes: int) -> None:
        self._bytes += nbytes - entry.nbytes
        entry.nbytes = nbytes

    def _rebuild(self, entry: _PromptTree, keep_tokens: int) -> None:
        """Replace the tree by one of about `keep_tokens` tokens: the running sequences (newest first; those past
        the room left trimmed to their last ``max_depth`` tokens), then the newest finished ones, real rollouts
        before run-ahead content."""
        running = set(entry.active.values())
        length = {seq: entry.tree.sequence_length(seq) for seq in entry.seqs}
        tails = {seq: min(length[seq], self.max_depth) for seq in running}
        total = sum(tails.values())  # what running sequences keep at least
        keep: dict[int, int] = {}  # sequence -> its first token kept
        for run_ahead in (False, True):
            for finished in (False, True):
                for seq in reversed(entry.seqs):
                    if (seq in entry.run_ahead) != run_ahead or (seq not in running) != finished:
                        continue
                    extra = length[seq] - tails.get(seq, 0)
                    if total + extra <= keep_tokens:
                        keep[seq], total = 0, total + extra
                    elif seq in running:
                        keep[seq] = length[seq] - tails[seq]
        self._work["trimmed_sequences"] += sum(1 for seq, start in keep.items() if start)
        self._rebuild_with(entry, keep)

    def _rebuild_with(self, entry: _PromptTree, keep: dict[int, int]) -> None:
        """Replace the tree by one holding only the sequences in `keep` (oldest first, as before), each from the
        token `keep` gives on; running requests whose sequence is dropped are detached."""
        old = entry.tree
        self._plan = None
        running = {seq: rid for rid, seq in entry.active.items()}
        new = self._tree_cls(self.max_depth)
        seqs, active, run_ahead, total = [], {}, set(), 0
        for seq in entry.seqs:
            if seq not in keep:
                if seq in running:
                    self._requests[running[seq]].detached = True
                continue
            sid = new.add_sequence()
            tokens = old.sequence(seq, keep[seq])
            new.extend(sid, tokens)
            total += len(tokens)
            seqs.append(sid)
            if seq in entry.run_ahead:
                run_ahead.add(sid)
            if seq in running:
                active[running[seq]] = sid
                self._requests[running[seq]].seq = sid
            else:
                new.close(sid)
        entry.tree, entry.seqs, entry.active, entry.run_ahead = new, seqs, active, run_ahead
        entry.base, entry.gate = new.num_tokens, total // 2
        self._work["rebuilds"] += 1
        self._work["rebuilt_tokens"] += total
        self._resize(entry, new.nbytes)

    def _evict(self, current: Hashable) -> None:
        """Get down to seven eighths of the budget: drop run-ahead content (least recently used prompts first),
        then evict least recently used prompts; trim `current` to its running tails before evicting it."""
        low = self.max_bytes - self.max_bytes // 8
        for key in list(self._prompts):
            if self._bytes <= low:
                return
            entry = self._prompts[key]
            if entry.run_ahead:
                self._evicted_run_ahead += len(entry.run_ahead)
                self._rebuild_with(entry, dict.fromkeys([s for s in entry.seqs if s not in entry.run_ahead], 0))
        for key in list(self._prompts):
            if self._bytes <= low:
                return
            if key != current:
                self._drop(key)
        self._rebuild(self._prompts[current], keep_tokens=0)
        if self._bytes > low:
            self._drop(current)

    def _drop(self, prompt_key: Hashable, evicted: bool = True) -> None:
        entry = self._prompts.pop(prompt_key)
        self._plan = None
        self._bytes -= entry.nbytes
        self._evicted += evicted
        for rid in entry.active:
            self._requests[rid].detached = True
