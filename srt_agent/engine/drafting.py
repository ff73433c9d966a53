"""Drafting for an engine step: every running sequence's draft tree, behind the drafter's fault boundary,
sized to the batch by the cost model.

A drafter that raises or hands back a malformed tree costs speed, never a request: the fault is
counted, the request it concerns decodes without drafts from then on, and the others are untouched. A
model drafter (one that declares the ``model`` capability, `model_drafting.ModelDrafter`) drafts only where the draft plan expects it to pay. The
acceptance observed per source (tree or model) calibrates the draft scores the cost model chooses
from.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from ..drafting.choice.acceptance import AcceptanceModel
from ..drafting.choice.cost_model import ForwardCostModel, choose_drafts
from ..drafting.choice.guard import PaidDrafting
from ..drafting.draft import Draft, validate_draft
from ..drafting.drafter import Drafter, capabilities
from ..drafting.drafters.model_drafting import DraftRequest, plan_model_drafts
from ..runner.sampler import RowSampling
from .sequence import Sequence
from .stats import EngineStats

log = logging.getLogger(__name__)
MODEL_ACCEPTANCE_PRIOR = 0.8  # a model drafter's per-token acceptance before any is observed


def resolve_drafter(drafter: str | Drafter | None) -> Drafter | None:
    """A drafter by name (`make_drafter`), the drafter given, or None."""
    if drafter is None:
        return None
    if isinstance(drafter, str):
        from ..drafting import make_drafter

        return make_drafter(drafter)
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a name or implement the Drafter protocol, got {type(drafter).__name__}")
    return drafter


class Drafting:
    """The engine's drafter, the fault boundary around it and the acceptance its drafts have shown.

    `cost_model` is the engine's (it also sizes run-ahead rows); `totals` are the engine's counters.
    """

    def __init__(
        self,
        drafter: Drafter | None,
        cost_model: ForwardCostModel,
        totals: EngineStats,
        vocab_size: int,
        max_draft_tokens: int,
        max_context: int,
        adaptive: bool,
        min_gain: float,
        guarded: bool = True,
    ):
        self.drafter = drafter
        self.capabilities = capabilities(drafter)
        self.cost_model = cost_model
        self.totals = totals
        self.vocab_size = vocab_size
        self.max_draft_tokens = max_draft_tokens
        self.max_context = max_context
        self.adaptive = adaptive
        self.min_gain = min_gain
        self.acceptance = AcceptanceModel()  # of tree drafts
        self.model_acceptance = AcceptanceModel()  # of model drafts
        # with adaptive drafts, only at batch sizes where drafting was measured to pay (`guarded`: a replay, whose
        # clock is the cost model's own, has no misprediction to guard against)
        self.paid = PaidDrafting() if guarded else None

    # ----- the fault boundary ---------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self, method: str, seq: Sequence | None) -> Iterator[None]:
        """Run the drafter call made inside the block for `seq` (None: not for one request) behind the fault
        boundary (see `fault`); `method` names the call in the fault counts."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - a failing drafter costs speed, never a request
            self.fault(method, seq, exc)

    def fault(self, method: str, seq: Sequence | None, exc: Exception) -> None:
        """Count and log a drafter fault; the request it concerns decodes without drafts from then on.

        The drafter's record of that request may be incomplete, so the request is stopped there (best
        effort: a raise there is part of the same fault) and never drafted for again. Other requests are
        untouched.
        """
        t = self.totals
        t.drafter_errors += 1
        t.drafter_faults[method] += 1
        where = f" for request {seq.request_id!r}" if seq is not None else ""
        t.last_drafter_error = f"{method}{where}: {type(exc).__name__}: {exc}"
        report = log.warning if t.drafter_faults[method] == 1 else log.debug
        report(
            "drafter %r failed in %s; %s",
            self.drafter.name,
            t.last_drafter_error,
            "that request decodes without drafts" if seq is not None else "drafting goes on",
        )
        if seq is not None and seq.drafting:
            seq.drafting = False
            t.undrafted_requests += 1
            try:
                self.drafter.stop_request(seq.request_id)
            except Exception:  # noqa: BLE001 - the same fault, already counted
                pass

    # ----- drafts for a step ----------------------------------------------------------------------

    def draft(self, seqs: list[Sequence], makespan: bool) -> tuple[list[Draft], list[float]]:
        """Every sequence's draft (empty where it may not draft) and the seconds each took. `makespan`:
        nothing waits, so the slowest sequence sets the step's time (see `model_drafting`)."""
        budgets = [
            min(self.max_draft_tokens, s.params.max_tokens - s.num_generated - 1, self.max_context - len(s.tokens) - 1)
            if s.drafting
            else 0
            for s in seqs
        ]
        drafts, times = [], []
        for seq, budget in zip(seqs, budgets):
            t0 = time.perf_counter()
            draft = self._draft_one(seq, budget) if budget > 0 else Draft()
            drafts.append(draft)
            times.append(time.perf_counter() - t0)
        if self.capabilities.model and max(budgets, default=0) > 0:
            self._draft_with_model(seqs, budgets, drafts, times, makespan)
        self.totals.draft_proposed += sum(len(d) for d in drafts)
        return drafts, times

    def choose(self, seqs: list[Sequence], drafts: list[Draft], makespan: bool) -> list[Draft]:
        """The drafts cut to the nodes worth verifying in this batch (all of them without adaptive drafts)."""
        if not self.adaptive or not any(len(d) for d in drafts):
            return drafts
        if self.paid is not None and not self.paid.allows(len(seqs)):
            return [Draft() for _ in drafts]
        base = sum(len(s.pending()) for s in seqs)
        return choose_drafts(drafts, base, self.cost_model, self.min_gain, makespan, self.calibrated)

    def observe(self, drafts: list[Draft], accepted: list[list[int]]) -> None:
        """Record which nodes of the verified drafts were accepted, per source."""
        for acceptance, source in ((self.acceptance, "tree"), (self.model_acceptance, "model")):
            picked = [i for i, d in enumerate(drafts) if d.source == source]
            acceptance.observe([drafts[i] for i in picked], [accepted[i] for i in picked])

    def calibrated(self, draft: Draft) -> Draft:
        """The draft with scores calibrated by the acceptance observed for its source."""
        return (self.model_acceptance if draft.source == "model" else self.acceptance).calibrate(draft)

    def _draft_one(self, seq: Sequence, budget: int) -> Draft:
        """The drafter's draft for `seq`, checked; a raise or a malformed tree is a drafter fault."""
        try:
            draft = self.drafter.draft(seq.request_id, seq.tokens, budget).truncated(budget)
            validate_draft(draft, self.vocab_size)
        except Exception as exc:  # noqa: BLE001 - a failing drafter costs speed, never correctness
            self.fault("draft", seq, exc)
            return Draft()
        if not draft.scores:
            draft.scores = [1.0] * len(draft)
        return draft

    def _draft_with_model(
        self, seqs: list[Sequence], budgets: list[int], drafts: list[Draft], times: list[float], makespan: bool
    ) -> None:
        """Replace drafts by the model drafter's where the draft plan expects that to pay (in place)."""
        t0 = time.perf_counter()
        requests = [
            DraftRequest(
                s.request_id, s.tokens, b, RowSampling(s.params.temperature, s.params.top_p, s.params.top_k, s.seed, 0)
            )
            for s, b in zip(seqs, budgets)
        ]
        if self.adaptive:
            plan = plan_model_drafts(
                [self.calibrated(d) for d in drafts],
                budgets,
                self.model_acceptance.rate(prior=MODEL_ACCEPTANCE_PRIOR),
                self.cost_model,
                lambda chosen, depth: self.drafter.draft_seconds([requests[i] for i in chosen], depth),
                sum(len(s.pending()) for s in seqs),
                self.min_gain,
                makespan=makespan,
            )
            depth, chosen = plan.depth, plan.sequences
        else:  # verify everything: the model drafts wherever the free drafter has nothing
            depth, chosen = max(budgets), [i for i, (d, b) in enumerate(zip(drafts, budgets)) if b > 0 and not len(d)]
        if not depth or not chosen:
            return
        try:
            model_drafts = self.drafter.draft_batch([requests[i] for i in chosen], depth)
            for d, i in zip(model_drafts, chosen):
                validate_draft(d, self.vocab_size)
                drafts[i] = d.truncated(budgets[i])
        except Exception as exc:  # noqa: BLE001 - a failing drafter costs speed, never correctness
            self.fault("draft", None, exc)
            return
        elapsed = time.perf_counter() - t0
        for i in chosen:
            times[i] += elapsed / len(chosen)
        self.totals.model_drafted += sum(len(drafts[i]) for i in chosen)
        self.totals.model_draft_s += elapsed
