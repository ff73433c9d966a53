"""The scheduler: which sequences hold KV slots, which run this step, which wait or are evicted."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .prefix_sharing import PrefixSharing
from .sequence import Sequence, Status


@dataclass
class Scheduler:
    """Slots for `num_slots` sequences; waiting sequences are admitted in arrival order.

    A new sequence's prompt is prefilled in the same forward pass as the running sequences' decode
    steps, up to `max_prefill_tokens` new prompt tokens per step (one sequence is always admitted when
    a slot is free). Finished sequences stay held in their slot for a continuation; when slots run out
    the least recently finished one is evicted (its KV dropped; a continuation then re-prefills what
    `sharing` does not find cached). With `sharing`, an admitted sequence starts from the longest cached
    prefix of its tokens, and one that shares more with a sequence admitted in the same step waits a
    step for it (it is passed over, later ones are still admitted).
    """

    num_slots: int
    max_prefill_tokens: int = 4096
    sharing: PrefixSharing | None = None
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    held: OrderedDict[str, Sequence] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.free_slots = list(range(self.num_slots - 1, -1, -1))  # pop() hands out the lowest slot

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def take_held(self, request_id: str) -> Sequence | None:
        """Remove and return the held sequence of `request_id` (still owning its slot), if any."""
        return self.held.pop(request_id, None)

    def resume(self, seq: Sequence) -> None:
        """A held sequence continues: it keeps its slot and runs from the next step."""
        seq.status = Status.RUNNING
        self.running.append(seq)

    def schedule(self) -> list[Sequence]:
        """Admit waiting sequences into free (or evicted) slots; return everything that runs this step."""
        budget = self.max_prefill_tokens
        admitted: list[Sequence] = []
        passed_over: list[Sequence] = []
        while self.waiting:
            seq = self.waiting[0]
            reused = 0
            if self.sharing is not None:
                reuse = self.sharing.find(seq, self._live())
                if self.sharing.worth_waiting(seq, reuse, admitted):
                    passed_over.append(self.waiting.popleft())
                    continue
                reused = reuse.tokens
            cost = len(seq.tokens) - reused
            if admitted and cost > budget:
                break
            if not self.free_slots and not self._evict_one():
                break
            self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            seq.num_cached = self.sharing.attach(seq, self._live()) if self.sharing is not None else 0
            seq.status = Status.RUNNING
            self.running.append(seq)
            budget -= cost
            admitted.append(seq)
        self.waiting.extendleft(reversed(passed_over))
        self.running.sort(key=lambda s: s.slot)
        return list(self.running)

    def _live(self) -> list[Sequence]:
        """Sequences whose slots hold KV: running (admitted this step included) and held."""
        return self.running + list(self.held.values())

    def finish(self, seq: Sequence) -> None:
        """A running sequence ended its call: hold it (with its slot) for a continuation."""
        self.running.remove(seq)
        seq.status = Status.HELD
        self.held[seq.request_id] = seq

    def release(self, seq: Sequence) -> None:
        """Free the slot of a sequence that is not running."""
        if seq.slot is not None:
            self.free_slots.append(seq.slot)
            self.free_slots.sort(reverse=True)
        seq.slot = None
        seq.num_cached = 0

    def _evict_one(self) -> bool:
        if not self.held:
            return False
        _, seq = self.held.popitem(last=False)
        self.release(seq)
        return True

    def idle_capacity(self) -> int:
        """Slots not needed by running or waiting sequences (held ones count as idle: they are evictable)."""
        return max(0, self.num_slots - len(self.running) - len(self.waiting))
