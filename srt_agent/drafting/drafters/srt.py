"""`SRTDrafter`: SRT, drafted the same way by our engine and by vLLM's proposer.

One tree per prompt (:class:`RolloutCache`, under the caller's key or a hash of the prompt's tokens) holds
every rollout of that prompt, fed token by token as requests run, so GRPO siblings and later policy versions
draft from each other. Three more rules, each optional:

* ``whole_prompt``: a prompt's first rollout leads its sequence with the whole prompt (later ones with its last
  ``max_match`` tokens), so a first visit drafts what it copies from the prompt;
* held turns: a finished turn that may go on under a fresh id (``hold``, as vLLM's proposer ends turns) is held,
  and a later request whose prompt extends it (the tool output appended) continues its sequence; it may leave out up to
  ``max_overshoot`` tokens sampled past a stop that the caller dropped;
* ``global_fallback``: a tree of turns' tokens after their context, across prompts, drafts where it expects more
  accepted tokens than the prompt's own tree (a prompt without history still drafts). At most ``GLOBAL_FEEDERS``
  running turns feed it at once (every turn of a batch up to that size): a batch of 1,024 long rollouts would
  otherwise double the insert cost and refill its share of the budget many times a step, for content (what
  responses share across prompts) that a sample of the batch already holds.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..trees.budget import GLOBAL_FEEDERS, global_tree_bytes, held_turn_bytes, prompt_tree_bytes
from ..trees.held_turns import HeldTurns
from ..trees.keys import prompt_key as hash_key
from ..trees.rollout_cache import CacheStats, RolloutCache

GLOBAL_NODE_BYTES = 96  # bytes a global-tree node may take (43-81 measured): sets its node cap
GLOBAL_KEY = "responses"
COUNTERS = (
    "requests",
    "run_ahead_requests",
    "continuations",  # requests that continued a held turn
    "whole_prompts",  # prompt trees led by their whole prompt
    "global_drafts",  # drafts taken from the global tree, which expected more than the prompt's
    "rewound",  # continuations that left out tokens sampled past a stop (they stay in the tree)
    "dropped_past_stop",  # turns rewound to the caller's stop (end_turn)
)


@dataclass
class _Turn:
    sequence: int  # the sequence's id in the prompt trees (kept across a trajectory's turns)
    key: Hashable
    tokens: list[int]  # everything stored so far: prompt, responses, tool outputs
    floor: int  # the prompt this turn was given: a next turn shares at least that much
    run_ahead: bool = False
    in_global: bool = False  # its tokens go into the global tree too


@dataclass
class _RowPlan:
    """A batch's turns (`SRTDrafter.add_tokens_rows`), valid while no request starts or stops (`version`)."""

    version: int
    ids: list
    turns: list[_Turn]
    seqs: list[int]
    feeding: list[int]  # the rows whose turns feed the global tree
    fed_seqs: list[int]
    appends: list  # each turn's tokens.append

    @classmethod
    def of(cls, version: int, request_ids: list, turns: list[_Turn]) -> _RowPlan:
        seqs = [turn.sequence for turn in turns]
        feeding = [r for r, turn in enumerate(turns) if turn.in_global]
        appends = [turn.tokens.append for turn in turns]
        return cls(version, list(request_ids), turns, seqs, feeding, [seqs[r] for r in feeding], appends)


@dataclass
class SRTStats:
    """SRT's counters (see ``COUNTERS``), the requests it tracks and its trees' sizes."""

    counters: dict[str, int]
    active: int
    held: int
    cache: CacheStats
    responses: CacheStats | None = None


class SRTDrafter:
    """The Drafter over per-prompt rollout trees (``.cache``), which outlive requests and weight updates.

    ``chain=True`` drafts one path (the most frequent child at each step: what vLLM verifies); ``min_prob``
    drops draft nodes whose path frequency falls below it; ``max_bytes`` bounds the prompt trees, the held
    turns (an eighth) and the global tree (``global_bytes``, default a 32nd) together; ``max_held=0`` holds no turns.
    """

    name = "srt"
    capabilities = DrafterCapabilities(trees=True, run_ahead=True, global_tree=True)

    def __init__(
        self,
        cache: RolloutCache | None = None,
        *,
        chain: bool = False,
        min_prob: float = 0.0,
        whole_prompt: bool = True,
        global_fallback: bool = True,
        max_held: int = 4096,
        held_ttl_s: float = 900.0,
        max_overshoot: int = 0,
        max_bytes: int = 1 << 30,
        global_bytes: int | None = None,
        **tree_options,
    ) -> None:
        if cache is not None and tree_options:
            raise ValueError(f"pass either a cache or tree options, not both: {sorted(tree_options)}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        if max_overshoot < 0:
            raise ValueError(f"max_overshoot must be >= 0, got {max_overshoot}")
        held_bytes = held_turn_bytes(max_bytes)
        if global_bytes is not None and not 0 < global_bytes <= max_bytes // 2:
            raise ValueError(f"global_bytes must be in (0, max_bytes / 2], got {global_bytes} of {max_bytes}")
        prompt_bytes = prompt_tree_bytes(max_bytes, global_fallback, global_bytes)
        global_bytes = global_tree_bytes(max_bytes, global_fallback, global_bytes)
        self.cache = cache if cache is not None else RolloutCache(max_bytes=prompt_bytes, **tree_options)
        self.responses = (
            RolloutCache(
                max_depth=self.cache.max_depth,
                max_match=self.cache.max_match,
                max_bytes=global_bytes,
                max_nodes_per_prompt=max(1, global_bytes // GLOBAL_NODE_BYTES),
                backend=self.cache.backend,
            )
            if global_fallback
            else None
        )
        self.turns = HeldTurns(max_held, max_bytes=held_bytes, ttl_s=held_ttl_s)
        self.chain, self.min_prob, self.whole_prompt, self.max_overshoot = chain, min_prob, whole_prompt, max_overshoot
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._active: dict[Hashable, _Turn] = {}
        self._held: dict[int, _Turn] = {}  # sequence id -> a finished turn
        self._feeders: set[int] = set()  # the sequences of the running turns that feed the global tree
        self._next_sequence = 0
        self._version = 0  # moves whenever a request starts or stops (add_tokens_rows' plan)
        self._plan: _RowPlan | None = None

    # ---- requests --------------------------------------------------------------------------------
    def start_request(self, request_id: Hashable, prompt_key: Hashable | None, prompt_ids: Sequence[int]) -> None:
        """Begin a request: continue the held turn its prompt extends, else start a sequence in its prompt's
        tree (`prompt_key`; None: the hash of `prompt_ids`)."""
        self._check_new(request_id)
        prompt = list(prompt_ids)
        turn = self._continued(prompt)
        if turn is None:
            turn = self._new_turn(hash_key(prompt) if prompt_key is None else prompt_key, prompt, run_ahead=False)
            self._start_global(turn)
        appended = prompt[len(turn.tokens) :]  # a next turn's tool output (or whatever the caller appended)
        self._open(request_id, turn)
        if appended:
            self.add_tokens(request_id, appended)
        self.counters["requests"] += 1

    def start_run_ahead(self, request_id: Hashable, prompt_key: Hashable | None, context_ids: Sequence[int]) -> None:
        """Begin a run-ahead sequence continuing `context_ids`: stored like a rollout, evicted first, never held."""
        self._check_new(request_id)
        context = list(context_ids)
        key = hash_key(context) if prompt_key is None else prompt_key
        self._open(request_id, self._new_turn(key, context, run_ahead=True))
        self.counters["run_ahead_requests"] += 1

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        turn = self._active.get(request_id) or self._turn(request_id)
        tokens = list(token_ids)
        self.cache.add_tokens(turn.sequence, tokens)
        if turn.in_global:
            self.responses.add_tokens(turn.sequence, tokens)
        turn.tokens += tokens

    def add_tokens_rows(self, request_ids: list[Hashable], tokens: list[int], offsets: Sequence[int]) -> None:
        """`add_tokens` for a batch of running requests at once (``tokens[offsets[r]:offsets[r + 1]]`` for
        ``request_ids[r]``): one call into each of the trees, the same trees as one `add_tokens` per row."""
        plan = self._plan
        if plan is None or plan.version != self._version or plan.ids != request_ids:
            plan = self._plan = _RowPlan.of(self._version, request_ids, [self._turn(rid) for rid in request_ids])
        self.cache.add_tokens_rows(plan.seqs, tokens, offsets)
        offsets = np.asarray(offsets)
        single = len(tokens) == len(request_ids) and bool((np.diff(offsets) == 1).all())  # a decode step's rows
        if plan.feeding:
            fed = [tokens[r : r + 1] if single else tokens[offsets[r] : offsets[r + 1]] for r in plan.feeding]
            lengths = [len(part) for part in fed]
            self.responses.add_tokens_rows(plan.fed_seqs, [t for part in fed for t in part], np.cumsum([0] + lengths))
        if single:
            for append, token in zip(plan.appends, tokens):
                append(token)
        else:
            for turn, begin, end in zip(plan.turns, offsets, offsets[1:]):
                turn.tokens += tokens[begin:end]

    def end_turn(self, request_id: Hashable, length: int) -> None:
        """The caller ended the request's turn at `length` tokens (prompt included) by a rule the engine did not
        know: the prompt tree's sequence goes on from there (what was stored past it, sampled inside an accepted
        draft, stays in the tree as a finished sample; see `RolloutCache.drop_last`)."""
        turn = self._turn(request_id)
        if len(turn.tokens) <= length:
            return
        self.cache.drop_last(turn.sequence, len(turn.tokens) - length)
        del turn.tokens[length:]
        self.counters["dropped_past_stop"] += 1

    def stop_request(self, request_id: Hashable) -> None:
        """The request (a whole trajectory: our engine continues one under its id) is over; its tokens stay."""
        self._stop_sequences(self._pop(request_id))

    def hold(self, request_id: Hashable) -> None:
        """The request's turn is over, and its trajectory's next turn may come under a fresh id (vLLM's): hold it,
        its sequences open, until a prompt continues it, it ages out or the step ends. Run-ahead closes."""
        turn = self._pop(request_id)
        if turn.run_ahead:
            self._stop_sequences(turn)
            return
        self._held[turn.sequence] = turn
        self._release(self.turns.hold(turn.sequence, turn.tokens, floor=turn.floor))
        turn.tokens = []  # held as int32 by self.turns until a next turn claims it

    def end_step(self) -> None:
        """An RL step's rollouts are over: release every held turn (their tokens stay in the trees)."""
        self._release(self.turns.release_all())

    def expire(self) -> None:
        """Release the turns held longer than their time to live."""
        self._release(self.turns.expire())

    # ---- drafting --------------------------------------------------------------------------------
    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        """The prompt tree's draft after `context`, or the global tree's where that one expects more."""
        turn = self._turn(request_id)
        own = self.cache.draft_request(turn.sequence, context, budget, self.chain, self.min_prob)
        if self.responses is None or turn.run_ahead or own.expected_accepted >= budget:  # nothing beats a sure draft
            return own
        if turn.in_global:
            other = self.responses.draft_request(turn.sequence, context, budget, self.chain, self.min_prob)
        else:
            other = self.responses.draft(GLOBAL_KEY, context, budget, self.chain, self.min_prob)
        if other.expected_accepted <= own.expected_accepted:
            return own
        self.counters["global_drafts"] += 1
        return other

    # ---- state -----------------------------------------------------------------------------------
    def stats(self) -> SRTStats:
        return SRTStats(
            dict(self.counters),
            len(self._active),
            len(self.turns),
            self.cache.stats(),
            self.responses.stats() if self.responses is not None else None,
        )

    def busy(self) -> bool:
        """Whether requests run or turns are held (trees may be swapped only when not)."""
        return bool(self._active or len(self.turns))

    def _continued(self, prompt: list[int]) -> _Turn | None:
        """The held turn `prompt` extends, reopened (rewound to a stop it left out), or None."""
        claimed = self.turns.claim(prompt, max_overshoot=self.max_overshoot) if len(self.turns) else None
        if claimed is None:
            return None
        sequence, shared, held_len = claimed
        turn = self._held.pop(sequence)
        if shared < held_len:  # it left out tokens sampled past a stop: go on from the stop
            self._stop_sequences(turn)  # what was sampled stays in the trees, as any sample
            turn.sequence = self._sequence_id()
            self.cache.start_request(turn.sequence, turn.key, [])
            self._start_global(turn)
            self.counters["rewound"] += 1
        turn.tokens, turn.floor = prompt[:shared], len(prompt)
        self.counters["continuations"] += 1
        return turn

    def _new_turn(self, key: Hashable, prompt: list[int], run_ahead: bool) -> _Turn:
        """A sequence in `key`'s tree, led by the prompt's tail, or by the whole prompt when the tree is new."""
        turn = _Turn(self._sequence_id(), key, prompt, len(prompt), run_ahead=run_ahead)
        whole = self.whole_prompt and key not in self.cache
        self.cache.start_request(turn.sequence, key, [] if whole else prompt, run_ahead=run_ahead)
        if whole:
            self.cache.add_tokens(turn.sequence, prompt)
            self.counters["whole_prompts"] += 1
        return turn

    def _check_new(self, request_id: Hashable) -> None:
        if request_id in self._active:
            raise ValueError(f"request {request_id!r} is already running")

    def _start_global(self, turn: _Turn) -> None:
        """The turn's tokens after its prompt go into the global tree too (``global_fallback``), if fewer than
        ``GLOBAL_FEEDERS`` running turns feed it."""
        turn.in_global = self.responses is not None and len(self._feeders) < GLOBAL_FEEDERS
        if turn.in_global:
            self._feeders.add(turn.sequence)
            self.responses.start_request(turn.sequence, GLOBAL_KEY, [])

    def _stop_sequences(self, turn: _Turn) -> None:
        self.cache.stop_request(turn.sequence)
        if turn.in_global:
            self.responses.stop_request(turn.sequence)
            self._feeders.discard(turn.sequence)
            turn.in_global = False

    def _open(self, request_id: Hashable, turn: _Turn) -> None:
        self._active[request_id] = turn
        self._version += 1

    def _pop(self, request_id: Hashable) -> _Turn:
        turn = self._active.pop(request_id, None)
        if turn is None:
            raise ValueError(f"unknown request {request_id!r}")
        self._version += 1
        return turn

    def _turn(self, request_id: Hashable) -> _Turn:
        try:
            return self._active[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}") from None

    def _sequence_id(self) -> int:
        self._next_sequence += 1
        return self._next_sequence - 1

    def _release(self, sequences: list[int]) -> None:
        for sequence in sequences:
            self._stop_sequences(self._held.pop(sequence))
