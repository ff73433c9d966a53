"""`SRTProposer`: SRT (:class:`~srt_agent.drafting.SRTDrafter`, the drafter our engine uses) as vLLM V1's
speculative proposer.

vLLM builds it for ``speculative_config={"method": "custom_class", ...}`` and calls ``propose`` after each step;
the plugin hands it the runner's input batch and requests first (request ids, prompt lengths and each request's
:class:`~srt_agent.drafting.RequestKind`, carried in its sampling parameters' ``extra_args``). This module only
translates: vLLM's rows to SRT's requests (their new tokens, a draft per row, which requests left), drafts sized
to the batch by the cost model (vLLM verifies linear drafts, so SRT drafts chains), vLLM's measured steps into
that model, and faults: a failure for one request gives it no draft and no more inserts; every other request
goes on. Measurements behind the defaults: docs/vllm.md.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from ...drafting import RequestKind, RolloutCache, SRTDrafter, make_drafter
from ...drafting.choice.acceptance import AcceptanceModel
from ...drafting.choice.cost_model import choose_drafts, joint_rate_bound
from ...drafting.choice.guard import PaidDrafting
from ...drafting.choice.step_cost import StepClock, vllm_step_cost
from ...drafting.draft import EMPTY_DRAFT, Draft
from ...drafting.trees.budget import prompt_tree_bytes
from .plugin import check_seam
from .proposer_options import ProposerOptions
from .row_plan import RowPlan
from .settings import proposer_options, request_kind

logger = logging.getLogger(__name__)
MIN_LOUD_FAULTS = 8  # faults before a high fault share fails drafting loudly


@dataclass
class _Row:
    kind: RequestKind
    stored: int  # tokens of the row already handed to SRT
    draft: Draft = field(default_factory=lambda: EMPTY_DRAFT)  # the last draft proposed (raw scores), settled next step


def srt_drafter(options: ProposerOptions, max_overshoot: int) -> SRTDrafter:
    """The options' drafter (SRT by default, or one registered as built like it) with their trees (loaded from
    ``trees`` if set), drafting chains."""
    o = options
    srt = dict(chain=True, min_prob=o.min_prob, whole_prompt=o.whole_prompt, global_fallback=o.global_fallback)
    srt.update(max_held=o.max_held, held_ttl_s=o.held_ttl_s, max_overshoot=max_overshoot, max_bytes=o.max_bytes)
    srt.update(global_bytes=o.global_bytes)
    if o.trees:
        return make_drafter(o.drafter, cache=saved_trees(o, o.trees), **srt)
    trees = dict(max_depth=o.max_depth, max_match=o.max_match, max_nodes_per_prompt=o.max_nodes_per_prompt)
    return make_drafter(o.drafter, **trees, **srt)


def saved_trees(options: ProposerOptions, path: str) -> RolloutCache:
    """The prompt trees saved at `path`, within the options' share of the byte budget for them."""
    budget = prompt_tree_bytes(options.max_bytes, options.global_fallback, options.global_bytes)
    return RolloutCache.load(path, max_bytes=budget, max_nodes_per_prompt=options.max_nodes_per_prompt)


class SRTProposer:
    """vLLM ``custom_class`` proposer over an :class:`SRTDrafter` (``.srt``)."""

    wants_input_batch = True

    def __init__(self, vllm_config: Any = None, options: ProposerOptions | None = None) -> None:
        self.options = o = options or proposer_options()
        self.k = vllm_config.speculative_config.num_speculative_tokens if vllm_config is not None else 8
        self.max_model_len = vllm_config.model_config.max_model_len if vllm_config is not None else 1 << 30
        if vllm_config is not None:
            check_seam()
        parallel = getattr(vllm_config, "parallel_config", None)
        self.dp_rank = int(getattr(parallel, "data_parallel_rank", 0) or 0)
        self.rank = int(getattr(parallel, "rank", 0) or 0)
        # a serving engine can sample past a stop inside an accepted draft: a next turn may leave that out
        self.srt = srt_drafter(o, max_overshoot=2 * (self.k + 1))
        self._batch: Any = None
        self._requests: dict = {}  # the runner's request states (their sampling parameters carry the kind)
        self._rows: dict[str, _Row] = {}  # vLLM request id -> row state
        self._broken: set[str] = set()  # requests a fault happened for: no drafts, no inserts
        self._stats = dict.fromkeys(
            "steps drafted accepted rows rows_drafted rows_seen rows_undrafted faults saves host_ns host_cpu_ns".split(),
            0,
        )
        self._stats["expected"] = 0.0
        self._stats["verify_s"] = 0.0  # the cost model's seconds for verifying the drafts proposed
        self._first_fault: str | None = None
        self._saved_at = time.monotonic()
        self.acceptance = AcceptanceModel()
        self.clock = StepClock(vllm_step_cost(o.step_fixed_ms, o.step_row_ms, o.draft_token_ms, o.calibrate))
        self.paid = PaidDrafting()  # drafting only at batch sizes where it has been measured to pay
        self._verified: list[tuple[Draft, int]] = []  # this step's settled drafts and their accepted counts
        self._version = 0  # moves whenever a row starts, leaves, fails or is rewound (the plan is then stale)
        self._plan: RowPlan | None = None  # the last step's rows, if all known and live

    @property
    def cost(self):
        """What a step costs (a prior line, learned from vLLM's measured steps with ``calibrate``)."""
        return self.clock.cost

    @cost.setter
    def cost(self, cost) -> None:
        self.clock.cost = cost

    @property
    def cache(self) -> RolloutCache:
        """The prompt trees (what checkpoints save)."""
        return self.srt.cache

    @cache.setter
    def cache(self, cache: RolloutCache) -> None:
        self.srt.cache = cache

    # ---- vLLM's interface ------------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load."""

    def bind_input_batch(self, batch: Any, requests: dict | None = None) -> None:
        self._batch, self._requests = batch, requests if requests is not None else {}

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One draft (a list of token ids, maybe empty) per batch row."""
        started, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        finally:
            self._stats["host_ns"] += time.perf_counter_ns() - started
            self._stats["host_cpu_ns"] += time.thread_time_ns() - cpu

    def _propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        rows = len(sampled_token_ids)
        self._stats["rows_seen"] += rows
        plan = self._plan
        if plan is not None and plan.steady(self._version, self._batch, sampled_token_ids, num_tokens_no_spec):
            return self._propose_steady(plan, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        try:
            req_ids = list(self._batch.req_ids[:rows])
            self._retire(set(self._batch.req_ids))
            kinds = [row.kind if (row := self._rows.get(rid)) is not None else self._kind(rid) for rid in req_ids]
            lengths = num_tokens_no_spec[:rows].tolist()
        except Exception:  # the batch itself is unreadable: no drafts this step
            self.clock.skip()  # nor a timed step
            self._fault("batch", None, rows)
            return [[] for _ in range(rows)]
        self._stats["steps"] += 1
        undrafted = kinds.count(RequestKind.UNDRAFTED)
        self._stats["rows_undrafted"] += undrafted
        live = [
            i
            for i in range(rows)
            if sampled_token_ids[i] and req_ids[i] is not None and kinds[i] is not RequestKind.UNDRAFTED
        ]
        prefilled = len(live) < rows or any(req_ids[i] not in self._rows for i in live)
        started = self.clock.tick(rows, prefilled, timed=not undrafted and self.options.calibrate)
        self._judge_step(sampled_token_ids)
        self._store_rows(live, req_ids, kinds, sampled_token_ids, lengths, token_ids_cpu)
        self._observe()
        decoding = [i for i in live if kinds[i] is RequestKind.ROLLOUT]
        offered = [i for i in decoding if req_ids[i] in self._rows and req_ids[i] not in self._broken]
        plan = RowPlan.of(self._version, self._batch.req_ids, req_ids, self._rows, live, offered, lengths)
        self._plan = None if self._broken else plan
        return self._draft_step(rows, req_ids, offered, lengths, token_ids_cpu, started)

    def _propose_steady(self, plan: RowPlan, sampled: list, num_tokens_no_spec: np.ndarray, token_ids) -> list:
        """A step of the same rows as the last, each sampled what it stores: SRT and the trees take the rows'
        tokens in one call, and Python touches each row O(1) (settling last step's drafts, its stored count)."""
        self.srt.expire()  # what `_retire` does for a batch nobody left
        self._stats["steps"] += 1
        started = self.clock.tick(len(sampled), False, timed=self.options.calibrate)
        self._judge_step(sampled)
        lengths = num_tokens_no_spec[: len(sampled)].tolist()
        for i, row in plan.drafted:
            self._settle(row, len(sampled[i]) - 1)
        try:
            self.srt.add_tokens_rows(plan.req_ids, list(chain.from_iterable(sampled)), plan.offsets())
        except Exception:  # nothing was stored: row by row, each fault its row's
            self._store_rows(list(range(len(sampled))), plan.req_ids, [], sampled, lengths, token_ids)
        else:
            for row, n in zip(plan.rows, lengths):
                row.stored = n
        plan.lengths = num_tokens_no_spec[: len(sampled)].copy()
        self._observe()
        return self._draft_step(len(sampled), plan.req_ids, plan.offered, lengths, token_ids, started)

    def _draft_step(self, rows: int, req_ids: list, offered: list[int], lengths: list, token_ids, started) -> list:
        """The step's drafts, one per batch row: the offered rows' as the cost policy chooses them."""
        self._stats["rows"] += len(offered)
        drafts: list[list[int]] = [[] for _ in range(rows)]
        drafted, raw = [], None
        if offered and (self.options.policy == "always" or not self.options.calibrate or self.paid.allows(rows)):
            raw = self._draft_rows(offered, req_ids, lengths, token_ids)
        if raw is not None:  # some choice can pay: propose what the cost policy picks
            for i, draft in zip(offered, self.choose(raw)):
                row = self._rows[req_ids[i]]
                row.draft = draft
                drafts[i] = list(draft.token_ids)
                if len(draft):
                    drafted.append((i, row))
            self._stats["rows_drafted"] += len(drafted)
        if self._plan is not None:
            self._plan.drafted = drafted
        fed = rows + sum(map(len, drafts))
        if fed > rows:
            self._stats["verify_s"] += max(0.0, self.cost.predict(fed, rows) - self.cost.predict(rows, rows))
        self.clock.started(rows, fed, started)
        return drafts

    def _judge_step(self, sampled: list[list[int]]) -> None:
        """The step that just ended, if timed with every row decoding: what it emitted against its time, for
        `PaidDrafting`."""
        if self.clock.ended is not None:
            sequences, fed, seconds = self.clock.ended
            self.paid.observe(sequences, fed - sequences, sum(map(len, sampled)), seconds)

    def choose(self, drafts: list[Draft]) -> list[Draft]:
        """What of each decoding row's draft to propose: all with policy ``always``; else what the options' objective
        expects to pay at this batch size (the slowest row's gain, or the batch's tokens per second)."""
        if self.options.policy == "always" or not any(len(d) for d in drafts):
            return drafts
        makespan = self.options.objective == "makespan"
        return choose_drafts(
            drafts, len(drafts), self.cost, makespan=makespan, calibrate=self.acceptance.calibrate, joint=makespan
        )

    # ---- rows to SRT's requests ------------------------------------------------------------------
    def _store_rows(self, live: list[int], req_ids: list, kinds: list, sampled: list, lengths: list, token_ids) -> None:
        """Hand SRT the live rows' new tokens, in row order: runs of known rows whose new tokens are just what this
        step sampled go in one call into the trees (`SRTDrafter.add_tokens_rows`), any other row by `_store`."""
        rows, broken, run = self._rows, self._broken, []
        for i in live:
            rid = req_ids[i]
            row = rows.get(rid)
            if row is not None and lengths[i] - row.stored == len(sampled[i]) and rid not in broken:
                self._settle(row, len(sampled[i]) - 1)
                run.append(i)
                continue
            self._store_run(run, req_ids, sampled, lengths, token_ids)
            run = []
            if rid not in broken:
                try:
                    self._store(rid, i, kinds[i], sampled[i], lengths[i], token_ids)
                except Exception:
                    self._fault(rid, i)
        self._store_run(run, req_ids, sampled, lengths, token_ids)

    def _store_run(self, run: list[int], req_ids: list, sampled: list, lengths: list, token_ids) -> None:
        """Known rows' sampled tokens in one call; should that fail, row by row (a fault isolated to its row)."""
        if not run:
            return
        ids = [req_ids[i] for i in run]
        parts = [sampled[i] for i in run]
        try:
            self.srt.add_tokens_rows(ids, [t for part in parts for t in part], np.cumsum([0] + [len(p) for p in parts]))
        except Exception:  # nothing was stored: find the failing rows one by one
            for i in run:
                try:
                    self._store(req_ids[i], i, RequestKind.ROLLOUT, sampled[i], lengths[i], token_ids)
                except Exception:
                    self._fault(req_ids[i], i)
            return
        for rid, i in zip(ids, run):
            self._rows[rid].stored = lengths[i]

    def _store(self, rid: str, i: int, kind: RequestKind, sampled: list[int], n: int, token_ids: np.ndarray) -> None:
        """Hand SRT the row's new tokens (every one since the last call: usually just what this step `sampled`)."""
        row = self._rows.get(rid) or self._begin(rid, i, kind, token_ids)
        self._settle(row, len(sampled) - 1)
        if n > row.stored:
            self.srt.add_tokens(
                rid, sampled if n - row.stored == len(sampled) else token_ids[i, row.stored : n].tolist()
            )
            row.stored = n

    def _draft_rows(self, rows: list[int], req_ids: list, lengths: list, token_ids: np.ndarray) -> list[Draft] | None:
        """The drafts of the decoding `rows` (known and not broken), or None where the cost policy can tell
        that no choice could pay at this batch (`joint_rate_bound`): before the first draft, even for sure ones;
        after a row with no draft, which rules out every draft; or once the drafts so far, the rest sure,
        cannot. Drafting stops there."""
        cost = self.options.policy == "cost" and self.options.objective == "makespan"  # the bound is the makespan's
        verify_none = 1.0 / self.cost.predict(len(rows), len(rows))
        reach = [1.0] * self.k  # per depth: the product of the drafted rows' calibrated chance to get that far
        if not rows or (cost and joint_rate_bound(self.cost, len(rows), reach) <= verify_none):
            return None
        rids = [req_ids[i] for i in rows]
        lengths = [lengths[i] for i in rows]
        drafts = []
        for rid, n, i in zip(rids, lengths, rows):
            try:
                draft = self._draft(rid, n, token_ids[i])
            except Exception:
                self._fault(rid, i)
                draft = EMPTY_DRAFT
            drafts.append(draft)
            if cost:
                if not len(draft):
                    return None
                scores = self.acceptance.calibrate(draft).scores  # a chain: node d at depth d + 1
                reach = [r * (scores[d] if d < len(scores) else 0.0) for d, r in enumerate(reach)]
                if joint_rate_bound(self.cost, len(rows), reach) <= verify_none:
                    return None
        return drafts

    def _begin(self, rid: str, i: int, kind: RequestKind, token_ids: np.ndarray) -> _Row:
        """First sight of a request: SRT continues the held turn its prompt extends, or starts its prompt's tree."""
        prompt = token_ids[i, : int(self._batch.num_prompt_tokens[i])].tolist()
        if kind is RequestKind.RUN_AHEAD:
            self.srt.start_run_ahead(rid, None, prompt)
        else:
            self.srt.start_request(rid, None, prompt)
        row = self._rows[rid] = _Row(kind, len(prompt))
        self._version += 1
        return row

    def _draft(self, rid: str, n: int, tokens: np.ndarray) -> Draft:
        budget = min(self.k, self.max_model_len - n - 1)
        if budget <= 0:
            return EMPTY_DRAFT
        return self.srt.draft(rid, tokens[max(0, n - self.srt.cache.max_match) : n].tolist(), budget)

    def _kind(self, rid: str | None) -> RequestKind:
        state = self._requests.get(rid)
        return request_kind(getattr(state, "sampling_params", None))

    def _retire(self, in_batch: set[str]) -> None:
        """Stop the requests that left the batch (SRT holds their turns); once the batch has drained, save the
        trees if ``save_path`` asks for it."""
        gone = [rid for rid in self._rows if rid not in in_batch]
        self._version += bool(gone)
        for rid in gone:
            del self._rows[rid]
            self._stop(rid)
        self.srt.expire()
        self._broken &= in_batch
        if gone and not self._rows:
            self._autosave()

    def _stop(self, rid: str) -> None:
        try:
            self.srt.hold(rid)
        except Exception:
            self._fault(rid, None)

    def end_turn(self, request_id: str, length: int) -> None:
        """The caller ended `request_id`'s turn at `length` tokens (prompt included) by a stop rule vLLM does
        not know (vLLM's own id may carry a suffix ``<id>-<suffix>``): what SRT stored past it leaves."""
        prefix = request_id + "-"
        found = [r for r in self._rows if r.startswith(prefix) and "-" not in r[len(prefix) :]]
        found = [request_id] if request_id in self._rows else found
        if len(found) == 1 and found[0] not in self._broken:
            self._version += 1
            self.srt.end_turn(found[0], length)
            self._rows[found[0]].stored = min(self._rows[found[0]].stored, length)

    def end_step(self) -> None:
        """The RL step's rollouts are over (call it when nothing runs): every turn closes and is released; their
        tokens stay in the trees."""
        self._version += 1
        for rid in list(self._rows):
            del self._rows[rid]
            self._stop(rid)
        self.srt.end_step()
        self._autosave()

    def _autosave(self) -> None:
        """Save the trees to ``save_path`` (first tensor-parallel rank only) if the last save is
        ``save_interval_s`` old: how trees outlive a serving engine nobody calls ``save`` on (verl's)."""
        o = self.options
        if not o.save_path or self.rank != 0 or time.monotonic() - self._saved_at < o.save_interval_s:
            return
        self.save(o.save_path.format(dp_rank=self.dp_rank))
        self._saved_at = time.monotonic()
        self._stats["saves"] += 1

    # ---- cost and acceptance ---------------------------------------------------------------------
    def _settle(self, row: _Row, accepted: int) -> None:
        """Count how much of the row's last draft was accepted (learned from at the step's end)."""
        draft = row.draft
        if not len(draft):
            return
        row.draft = EMPTY_DRAFT
        accepted = max(0, min(accepted, len(draft)))
        self._verified.append((draft, accepted))
        self._stats["drafted"] += len(draft)
        self._stats["accepted"] += accepted
        self._stats["expected"] += draft.expected_accepted

    def _observe(self) -> None:
        if self._verified:
            self.acceptance.observe([d for d, _ in self._verified], [list(range(a)) for _, a in self._verified])
            self._verified = []

    def _fault(self, rid: str | None, row: int | None, rows: int = 1) -> None:
        """A request (or, with `rows`, a whole batch) gets no draft; drafting fails loudly once faults are no
        longer rare (a seam that moved must not read as 'SRT drafts nothing')."""
        self._stats["faults"] += rows
        self._version += 1
        if self._first_fault is None:
            self._first_fault = traceback.format_exc(limit=-1).strip().splitlines()[-1]
        if self._stats["faults"] <= 3:
            logger.exception("SRTProposer: no draft for request %s (row %s)", rid, row)
        if rid is not None and rid != "batch":
            self._broken.add(rid)
        faults, seen = self._stats["faults"], self._stats["rows_seen"]
        if faults >= MIN_LOUD_FAULTS and faults > self.options.max_fault_share * seen:
            raise RuntimeError(
                f"SRTProposer failed for {faults} of {seen} batch rows (first: {self._first_fault}); vLLM's seam "
                "may have moved: check the vLLM version against srt-agent's supported range"
            )

    # ---- stats and persistence ---------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters (SRT's and the rows'), the acceptance rate and model, and the trees' sizes."""
        srt = self.srt.stats()
        out = {**self._stats, **srt.counters}
        out["acceptance"] = out["accepted"] / out["drafted"] if out["drafted"] else 0.0
        out["host_us_per_row"] = out["host_ns"] / 1e3 / max(1, out["rows_seen"])  # propose's time per batch row
        out["host_cpu_us_per_row"] = out["host_cpu_ns"] / 1e3 / max(1, out["rows_seen"])  # … its thread's CPU time
        out["paid_suspensions"] = self.paid.suspensions  # batch sizes where drafting was found not to pay
        out["paid_plain_probes"] = self.paid.plain_probes  # steps left undrafted to measure plain decoding
        out["nodes_tested"] = self.acceptance.nodes_tested  # drafted tokens whose parent was accepted …
        out["nodes_accepted"] = self.acceptance.nodes_accepted  # … and those of them accepted
        out.update(active=len(self._rows), held=srt.held, cache=asdict(srt.cache))
        out["global"] = asdict(srt.responses) if srt.responses is not None else None
        return out

    def save(self, path: str) -> None:
        """Write the trees to `path` (atomic; running requests are saved as far as they got)."""
        self.srt.cache.save(path)

    def load(self, path: str) -> None:
        """Replace the trees with those saved at `path`; only between steps (after ``end_step``)."""
        if self._rows or self.srt.busy():
            raise RuntimeError("load the trees between steps: requests are running or held (call end_step)")
        self.srt.cache = saved_trees(self.options, path)
