"""Drafting with a model: what the engine asks of model drafters, and how deep they draft each step.

A model drafter (`self`, `srt+self`) costs forward passes, unlike a tree lookup, so `plan_model_drafts`
decides before drafting, per step, which sequences get a model-drafted chain and how deep: the depth whose
expected emitted tokens per second (chain tokens each accepted with probability ``alpha`` given the one
before, the draft model's pass time, the verification cost model) beats verifying the free drafts alone.
When nothing waits (`makespan`) it counts what the slowest sequence gains (`cost_model.JointMinimum`), so a
full batch is model-drafted only where every sequence is nearly sure to accept. See docs/engine.md,
"Drafting with the policy itself".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ...runner.sampler import RowSampling
from ..choice.cost_model import ForwardCostModel, best_prefix
from ..draft import Draft

DEPTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)  # chain depths the plan considers


@dataclass
class DraftRequest:
    """One sequence to draft for: its tokens, how many nodes at most, and how it samples
    (``sampling.position`` is ignored: each drafted position uses its own)."""

    request_id: Hashable
    context: Sequence[int]
    budget: int
    sampling: RowSampling


@runtime_checkable
class ModelDrafter(Protocol):
    """A drafter that runs a model. Besides the Drafter protocol (whose ``draft`` returns only what
    needs no model pass: a hybrid's tree, or nothing) it is bound to the engine's policy and drafts
    many sequences together."""

    pass_cost: ForwardCostModel  # seconds of one draft-model pass, by (sequences, tokens)

    def attach(
        self, model: torch.nn.Module, device: torch.device, max_batch: int, max_context: int, calibrate: bool
    ) -> None:
        """Bind to the policy `model` and build the draft model from it (the engine calls this once)."""

    def rebuild(self) -> float:
        """Rebuild the draft model from the policy's current weights; returns the seconds it took."""

    def draft_seconds(self, requests: list[DraftRequest], depth: int) -> float:
        """Predicted seconds to draft `depth` tokens for each of `requests`."""

    def draft_batch(self, requests: list[DraftRequest], depth: int) -> list[Draft]:
        """Chains (or trees) of up to `depth` levels, one per request, within each request's budget."""


@dataclass
class ModelDraftPlan:
    """Which sequences (indices into the step's) get a model draft, how deep, and the expected rates."""

    depth: int
    sequences: list[int]
    rate: float  # expected emitted tokens per second with the plan
    rate_without: float  # … verifying the free drafts only


def chain_gain(alpha: float, depth: int) -> float:
    """Expected accepted tokens of a chain of `depth` whose nodes are each accepted with `alpha`."""
    return sum(alpha**j for j in range(1, depth + 1))


def top_gain(draft: Draft, nodes: int) -> float:
    """Expected accepted tokens of the `nodes` best-scored nodes of a (calibrated) draft."""
    return float(sum(sorted(draft.scores, reverse=True)[:nodes]))


def plan_model_drafts(
    free_drafts: list[Draft],
    budgets: list[int],
    alpha: float,
    verify_cost: ForwardCostModel,
    draft_seconds: Callable[[list[int], int], float],
    base_tokens: int,
    min_gain: float = 0.0,
    makespan: bool = False,
    depths: Sequence[int] = DEPTHS,
) -> ModelDraftPlan:
    """The depth and sequences whose model drafting maximizes expected tokens per second.

    `free_drafts` hold the calibrated drafts that cost nothing more (empty for a pure model drafter),
    `budgets` each sequence's node budget, `alpha` the model's per-token acceptance,
    `draft_seconds(sequences, depth)` the predicted drafting time. No model draft unless the best plan
    beats the free drafts by the fraction `min_gain`.
    """
    without = best_prefix(free_drafts, base_tokens, verify_cost, makespan, joint=True).rate
    best = ModelDraftPlan(0, [], without, without)
    for depth in depths:
        if depth > max(budgets, default=0):
            break
        chosen = [
            i
            for i, (d, b) in enumerate(zip(free_drafts, budgets))
            if b > 0 and chain_gain(alpha, min(depth, b)) > top_gain(d, min(depth, b))
        ]
        if not chosen:
            continue
        drafts = list(free_drafts)
        for i in chosen:
            n = min(depth, budgets[i])
            drafts[i] = Draft([0] * n, list(range(-1, n - 1)), [alpha**j for j in range(1, n + 1)])
        rate = best_prefix(drafts, base_tokens, verify_cost, makespan, draft_seconds(chosen, depth), joint=True).rate
        if rate > best.rate:
            best = ModelDraftPlan(depth, chosen, rate, without)
    if best.rate < (1.0 + min_gain) * without:
        return ModelDraftPlan(0, [], without, without)
    return best
