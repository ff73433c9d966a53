"""Verification: one tree-masked forward pass over every sequence's pending tokens and draft tree, then a
walk of each tree with the lossless sampler.

At each position the sampler draws the token plain decoding would draw (its noise is keyed by the
request's seed and the position, `sampler.py`); the drafted child with that token is accepted and the
walk goes on from it, otherwise the sampled token is emitted and the walk stops. So the emitted tokens
never depend on the draft. The one exception is opt-in: a draft carrying its old policy's
log-probabilities (SPEC-RL's reused rollouts) is judged by the lenient rule of `lenient.py`, and every
token it keeps that the exact sampler would not have drawn is counted (``lenient_overrides``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..drafting.draft import Draft
from ..drafting.drafter import Drafter, capabilities
from ..runner.device_info import DeviceInfo
from ..runner.model_runner import Chunk, ModelRunner
from ..runner.sampler import RowSampling, draw, to_host, upload
from .lenient import acceptance_uniform, lenient_accept, target_logprobs
from .sequence import Sequence
from .stats import EngineStats

CPU_EAGER_ROWS = 64  # on a CPU, up to this many verified rows take all logits from one LM-head pass
EAGER_LOGITS_BYTES = 1 << 28  # on a GPU, as many rows as fit 256 MiB of float32 logits


def eager_logits_rows(info: DeviceInfo, vocab_size: int) -> int:
    """Up to how many candidate rows the verifier samples in one LM-head pass and one read (more rows: level
    by level, one read per level). A CPU computes every extra row's logits for nothing when a walk stops
    early, so it stays at `CPU_EAGER_ROWS` (tuned there); on a GPU a read per level waits for the device's
    whole queue, which costs more than the extra rows, so every row goes at once up to `EAGER_LOGITS_BYTES`
    of logits (the main job's shape, 16 rows × 17 candidates, at any vocabulary up to ~240k tokens)."""
    if info.device != "cuda":
        return CPU_EAGER_ROWS
    return max(CPU_EAGER_ROWS, EAGER_LOGITS_BYTES // (4 * max(1, vocab_size)))


# Per sequence: the emitted (token, log-probability) pairs and the accepted draft nodes; and the
# sequences (by index) whose pass or logits failed, with what went wrong.
VerifiedRows = tuple[list[list[tuple[int, float]]], list[list[int]], dict[int, str]]


def chunks_of(seqs: list[Sequence], drafts: list[Draft]) -> list[Chunk]:
    """What each sequence feeds this step: its pending tokens, then its draft tree."""
    return [
        Chunk(s.slot, s.num_cached, s.pending() + d.token_ids, len(s.pending()), d.parents)
        for s, d in zip(seqs, drafts)
    ]


class Verifier:
    """Runs a step's forward pass over the engine's `runner` and walks the drafts (see the module
    docstring); lenient drafts are judged with the `drafter`'s lenience."""

    def __init__(self, runner: ModelRunner, drafter: Drafter | None, totals: EngineStats):
        self.runner = runner
        self.drafter = drafter
        self.totals = totals
        self.eager_rows = eager_logits_rows(runner.device_info, runner.vocab_size)

    def forward_and_verify(self, seqs: list[Sequence], chunks: list[Chunk], drafts: list[Draft]) -> VerifiedRows:
        """One forward pass and the walk of every draft tree. Changes no sequence: on a raise the step can
        run again (the pass writes KV only at positions no sequence counts as cached)."""
        hidden = self.runner.forward(chunks)
        out = self._verify(seqs, chunks, drafts, hidden)
        self.runner.synchronize()
        return out

    def forward_one_by_one(self, seqs: list[Sequence], chunks: list[Chunk], drafts: list[Draft]) -> VerifiedRows:
        """The step's pass for each sequence alone (after the batched one raised): only a sequence whose own
        pass fails is charged with the fault."""
        emitted, accepted, faults = [], [], {}
        for i, (seq, chunk, draft) in enumerate(zip(seqs, chunks, drafts)):
            try:
                (em,), (acc,), fault = self.forward_and_verify([seq], [chunk], [draft])
            except Exception as exc:  # noqa: BLE001 - this request's fault, no one else's
                em, acc, fault = [], [], {0: f"the forward pass or sampling failed: {type(exc).__name__}: {exc}"}
            emitted.append(em)
            accepted.append(acc)
            if fault:
                faults[i] = fault[0]
        return emitted, accepted, faults

    def compact(self, chunks: list[Chunk], accepted: list[list[int]]) -> None:
        """Move accepted draft nodes' KV right after the pending tokens, in path order."""
        slots, src, dst = [], [], []
        for chunk, acc in zip(chunks, accepted):
            base = chunk.start + chunk.num_pending
            for depth, node in enumerate(acc):
                if node != depth:
                    slots.append(chunk.slot)
                    src.append(base + node)
                    dst.append(base + depth)
        self.runner.move_kv(slots, src, dst)

    def _verify(
        self, seqs: list[Sequence], chunks: list[Chunk], drafts: list[Draft], hidden: torch.Tensor
    ) -> VerifiedRows:
        """Walk every sequence's draft tree with the lossless sampler.

        Returns per sequence the emitted (token, logprob) pairs and the accepted draft nodes, and the
        sequences (by index) whose next logits were not finite (NaN or +inf), with what went wrong: their
        walk stops there, after the tokens plain decoding would also have emitted.
        """
        walks, row = [], 0
        for seq, chunk, draft in zip(seqs, chunks, drafts):
            walks.append(_Walk(seq, draft, row + chunk.num_pending - 1))
            row += len(chunk)
        # Rows that may need logits: each chunk's last pending token and its draft nodes. Few of them: one
        # LM-head pass and one draw over all, read back at once. Many: level by level, only the rows on
        # accepted paths.
        if sum(len(d.parents) + 1 for d in drafts) <= max(self.eager_rows, 2 * len(seqs)):
            self._walk_at_once(walks, hidden)
        else:
            self._walk_by_level(walks, hidden)
        faults = {i: w.fault for i, w in enumerate(walks) if w.fault is not None}
        return [w.emitted for w in walks], [w.accepted for w in walks], faults

    def _walk_at_once(self, walks: list[_Walk], hidden: torch.Tensor) -> None:
        """Sample every candidate row in one draw (a node's token depends only on its logits and its
        position, so this gives the tokens a level-by-level walk would), then walk the trees on the host."""
        nodes = [(w, node) for w in walks for node in range(-1, len(w.draft.parents))]
        outcomes = self._outcomes(self._logits(hidden, [w.row(node) for w, node in nodes]), nodes)
        base = 0
        for w in walks:
            while self._advance(w, outcomes[base + w.node + 1]):
                pass
            base += len(w.draft.parents) + 1

    def _walk_by_level(self, walks: list[_Walk], hidden: torch.Tensor) -> None:
        """One LM-head pass, draw and read back per tree level, over the rows the walks have reached."""
        active = walks
        while active:
            nodes = [(w, w.node) for w in active]
            outcomes = self._outcomes(self._logits(hidden, [w.row(w.node) for w in active]), nodes)
            active = [w for w, outcome in zip(active, outcomes) if self._advance(w, outcome)]

    def _logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """LM-head logits of some hidden rows (their indices copied over without waiting for the device)."""
        return self.runner.logits(hidden[upload(torch.tensor(rows), hidden.device)])

    def _outcomes(self, logits: torch.Tensor, nodes: list[tuple[_Walk, int]]) -> list[_Outcome]:
        """Each row's sampled token, its log-probability, whether its logits are broken, and the log-probability
        of the lenient child's token: sampled on the device, read back in one transfer (two where a top-p
        nucleus reached past the tokens first sorted)."""
        specs = [w.spec(node) for w, node in nodes]
        broken = (torch.isnan(logits) | (logits == float("inf"))).any(dim=-1)
        draws = draw(logits, specs)
        columns = [draws.tokens, draws.logprobs, broken]
        lenient = [w.lenient_child(node) for w, node in nodes]
        judged = any(child is not None for child in lenient)
        if judged:
            tokens = [w.draft.token_ids[c] if c is not None else 0 for (w, _), c in zip(nodes, lenient)]
            columns.append(target_logprobs(logits, [s.temperature for s in specs], tokens))
        if draws.covered is not None:
            columns.append(draws.covered | broken)
        host = to_host(columns)
        if draws.covered is not None and not all(host[-1]):
            exact = draw(logits, specs, exhaustive=True)
            host[:2] = to_host([exact.tokens, exact.logprobs])
        news = host[3] if judged else [0.0] * len(nodes)
        return [_Outcome(int(t), lp, bad > 0, new) for t, lp, bad, new in zip(host[0], host[1], host[2], news)]

    def _advance(self, walk: _Walk, outcome: _Outcome) -> bool:
        """One step of a walk at its node: emit the sampled token (or the lenient draft's), and go on to the
        child with that token if the draft has one; False when the walk ends."""
        if outcome.broken:
            position = len(walk.seq.tokens) + len(walk.emitted)
            walk.fault = f"the model produced non-finite logits (NaN or +inf) for position {position}"
            return False
        token, logprob = outcome.token, outcome.logprob
        if walk.draft.old_logprobs is None:
            child = walk.children.get((walk.node, token))
        else:
            picked = self._lenient(walk, token, logprob, outcome.lenient_logprob)
            if picked is None:  # the reused draft ran out after accepted nodes: the next step goes on with it
                return False
            token, logprob, child = picked
        walk.emitted.append((token, logprob))
        if child is None:
            return False
        walk.accepted.append(child)
        walk.node = child
        return True

    def _lenient(
        self, walk: _Walk, sampled: int, sampled_lp: float, child_lp: float
    ) -> tuple[int, float, int | None] | None:
        """SPEC-RL's rule at the child of the walk's node in a reused draft (see `lenient`; `child_lp`: the
        current policy's log-probability of that child's token): the token emitted at this position, its
        log-probability, and the accepted node (None: rejected, so the exact sample is emitted and the walk
        stops). None when the draft ran out after an accepted node: every reused position is judged
        leniently, so no exact token follows (the next step drafts on from there)."""
        child = walk.lenient_child(walk.node)
        if child is None:
            return None if walk.node >= 0 else (sampled, sampled_lp, None)
        spec = walk.spec(walk.node)
        token = walk.draft.token_ids[child]
        lenience = self.drafter.lenience if capabilities(self.drafter).lenient else 1.0
        u = acceptance_uniform(spec.seed, spec.position)
        if not lenient_accept(child_lp, walk.draft.old_logprobs[child], lenience, u):
            return sampled, sampled_lp, None
        if token != sampled:
            self.totals.lenient_overrides += 1
        return token, child_lp, child


class _Outcome(NamedTuple):
    """What the draw at one row gave: the sampled token and its log-probability, whether the row's logits
    were broken, and the log-probability of a lenient draft's child token there (0 where none)."""

    token: int
    logprob: float
    broken: bool
    lenient_logprob: float


@dataclass
class _Walk:
    """One sequence's walk down its draft tree: the node reached (-1: the last pending token), and what it
    emitted and accepted so far. `root_row`: the hidden row of the last pending token (node i's is
    root_row + 1 + i)."""

    seq: Sequence
    draft: Draft
    root_row: int
    node: int = -1
    emitted: list[tuple[int, float]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    fault: str | None = None
    children: dict[tuple[int, int], int] = field(init=False)
    depths: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.children = {(p, t): i for i, (p, t) in enumerate(zip(self.draft.parents, self.draft.token_ids))}
        self.depths = []
        for parent in self.draft.parents:
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)

    def row(self, node: int) -> int:
        return self.root_row + node + 1

    def spec(self, node: int) -> RowSampling:
        """How the token after `node` is sampled: at the sequence's length plus the node's depth."""
        p = self.seq.params
        position = len(self.seq.tokens) + (self.depths[node] if node >= 0 else 0)
        return RowSampling(p.temperature, p.top_p, p.top_k, self.seq.seed, position)

    def lenient_child(self, node: int) -> int | None:
        """The first child of `node` in a reused (lenient) draft; None for exact drafts or a leaf."""
        if self.draft.old_logprobs is None:
            return None
        return next((k for k, parent in enumerate(self.draft.parents) if parent == node), None)
