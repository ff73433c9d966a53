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

import torch

from ..cache.draft import Draft
from ..cache.drafter import Drafter, capabilities
from .lenient import acceptance_uniform, lenient_accept, target_logprob
from .model_runner import Chunk, ModelRunner
from .sampler import RowSampling, sample_rows
from .sequence import Sequence
from .stats import EngineStats

EAGER_LOGITS_ROWS = 64  # up to this many verified rows, all logits come from one LM-head pass

# Per sequence: the emitted (token, log-probability) pairs and the accepted draft nodes; and the
# sequences (by index) whose pass or logits failed, with what went wrong.
Verified = tuple[list[list[tuple[int, float]]], list[list[int]], dict[int, str]]


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

    def forward_and_verify(self, seqs: list[Sequence], chunks: list[Chunk], drafts: list[Draft]) -> Verified:
        """One forward pass and the walk of every draft tree. Changes no sequence: on a raise the step can
        run again (the pass writes KV only at positions no sequence counts as cached)."""
        hidden = self.runner.forward(chunks)
        out = self._verify(seqs, chunks, drafts, hidden)
        self.runner.synchronize()
        return out

    def forward_one_by_one(self, seqs: list[Sequence], chunks: list[Chunk], drafts: list[Draft]) -> Verified:
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

    def _verify(self, seqs: list[Sequence], chunks: list[Chunk], drafts: list[Draft], hidden: torch.Tensor) -> Verified:
        """Walk every sequence's draft tree level by level with the lossless sampler.

        Returns per sequence the emitted (token, logprob) pairs and the accepted draft nodes, and the
        sequences (by index) whose next logits were not finite (NaN or +inf), with what went wrong: their
        walk stops there, after the tokens plain decoding would also have emitted.
        """
        offsets, off = [], 0
        for chunk in chunks:
            offsets.append(off)
            off += len(chunk)
        children = [{(p, t): i for i, (p, t) in enumerate(zip(d.parents, d.token_ids))} for d in drafts]
        emitted: list[list[tuple[int, float]]] = [[] for _ in seqs]
        accepted: list[list[int]] = [[] for _ in seqs]
        node = [-1] * len(seqs)
        faults: dict[int, str] = {}
        active = list(range(len(seqs)))
        # Rows that may need logits: each chunk's last pending token and its draft nodes. Few of them:
        # one LM-head pass over all (the head's weights are read once). Many: level by level, only
        # the rows on accepted paths.
        candidates = [
            offsets[i] + c.num_pending - 1 + j for i, c in enumerate(chunks) for j in range(len(c.parents) + 1)
        ]
        eager = None
        if len(candidates) <= max(EAGER_LOGITS_ROWS, 2 * len(seqs)):
            eager = dict(zip(candidates, self.runner.logits(hidden[candidates])))
        while active:
            rows = [offsets[i] + chunks[i].num_pending - 1 + (node[i] + 1 if node[i] >= 0 else 0) for i in active]
            logits = torch.stack([eager[r] for r in rows]) if eager is not None else self.runner.logits(hidden[rows])
            broken = (torch.isnan(logits) | (logits == float("inf"))).any(dim=-1)
            if bool(broken.any()):
                fine = [j for j, bad in enumerate(broken.tolist()) if not bad]
                for j, bad in enumerate(broken.tolist()):
                    if bad:
                        i = active[j]
                        position = len(seqs[i].tokens) + len(emitted[i])
                        faults[i] = f"the model produced non-finite logits (NaN or +inf) for position {position}"
                active, logits = [active[j] for j in fine], logits[fine]
                if not active:
                    break
            specs = []
            for i in active:
                p = seqs[i].params
                position = len(seqs[i].tokens) + len(emitted[i])
                specs.append(RowSampling(p.temperature, p.top_p, p.top_k, seqs[i].seed, position))
            tokens, logprobs = sample_rows(logits, specs)
            still = []
            for j, (i, token, lp) in enumerate(zip(active, tokens, logprobs)):
                if drafts[i].old_logprobs is None:
                    child = children[i].get((node[i], token))
                else:
                    picked = self._lenient(drafts[i], node[i], logits[j], specs[j], token, lp)
                    if picked is None:  # the reused draft ran out after accepted nodes: the next step goes on with it
                        continue
                    token, lp, child = picked
                emitted[i].append((token, lp))
                if child is not None:
                    accepted[i].append(child)
                    node[i] = child
                    still.append(i)
            active = still
        return emitted, accepted, faults

    def _lenient(
        self, draft: Draft, node: int, logits: torch.Tensor, spec: RowSampling, sampled: int, sampled_lp: float
    ) -> tuple[int, float, int | None] | None:
        """SPEC-RL's rule at the child of `node` in a reused draft (see `lenient`): the token emitted at
        this position, its log-probability, and the accepted node (None: rejected, so the exact sample is
        emitted and the walk stops). None when the draft ran out after an accepted node: every reused
        position is judged leniently, so no exact token follows (the next step drafts on from there)."""
        child = next((k for k, parent in enumerate(draft.parents) if parent == node), None)
        if child is None:
            return None if node >= 0 else (sampled, sampled_lp, None)
        token = draft.token_ids[child]
        new = target_logprob(logits, spec, token)
        lenience = self.drafter.lenience if capabilities(self.drafter).lenient else 1.0
        if not lenient_accept(new, draft.old_logprobs[child], lenience, acceptance_uniform(spec.seed, spec.position)):
            return sampled, sampled_lp, None
        if token != sampled:
            self.totals.lenient_overrides += 1
        return token, new, child
