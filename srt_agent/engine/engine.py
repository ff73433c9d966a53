"""The engine: continuous batching with lossless tree speculation (draft → verify in one pass → accept).

Lossless: a position's token is drawn from its logits with noise keyed by (seed, position), so drafts
change speed only. Bit for bit where the numerics are batch-invariant (float64; ``batch_invariant`` on a
CPU whose linears pass the probe, `runner/numerics.py`); otherwise the same tokens except at near-ties the
float error of a different batch shape flips; in bfloat16, the same distribution (docs/engine.md).

Each step the scheduler picks the running sequences (`scheduler.py`), drafting gives each a draft tree
and sizes the drafts to the batch with the cost model (`drafting.py`), verification runs all of them in
one tree-masked forward pass and walks each tree with the lossless sampler (`verification.py`), the KV
of accepted nodes is kept and the rest dropped, and stop conditions apply token by token. Emitted and
forced tokens go into the drafter (the prompt's tree) as they are produced. Run-ahead rows
(`run_ahead.py`) ride along in capacity the real sequences leave. Totals and settings: `stats.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import Hashable, Sequence as Seq

import torch

from ..drafting.choice.cost_model import ForwardCostModel
from ..drafting.draft import Draft
from ..drafting.drafter import Drafter
from ..drafting.request_kind import RequestKind
from ..drafting.trees import keys
from ..models import LoadedModel, cast_weights, resolve_device
from ..runner.device_info import resolve_engine_dtype
from ..runner.model_runner import ModelRunner
from .calibration import CALIBRATION_SIZES, measure_step_costs
from .drafting import Drafting, resolve_drafter
from .generate import generate_all
from .options import EngineOptions
from .params import RequestOutput, SamplingParams, check_prompt
from .prefix_cache import PrefixCache
from .prefix_sharing import PrefixSharing
from .run_ahead import RunAhead
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .stats import EngineStats
from .stops import StopChecker
from .verification import Verifier, chunks_of

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _StepRecord:
    """A step's verification of the real rows: their chunks and drafts (without drafts after a fallback), the
    tokens each emitted, the draft nodes each accepted, model faults by row, whether the pass was batched,
    its seconds, whether it was a timed decoding step (batched, faultless, one pending token a row: the steps
    the cost model and `PaidDrafting` learn from), and (filled when accepted) how many emitted tokens each row
    kept before a stop."""

    chunks: list
    drafts: list[Draft]
    emitted: list
    accepted: list
    faults: dict[int, str]
    batched: bool
    forward_s: float
    decoding: bool
    kept: list[int] = dataclasses.field(default_factory=list)


class Engine:
    """Batched, speculative, exactly on-policy generation over a Hugging Face causal LM, run as `options` say
    (:class:`~.options.EngineOptions`).

    The cost model picks which draft nodes to verify (possibly none), by their scores as calibrated against
    the acceptance observed so far, where it expects at least ``min_draft_gain`` more tokens per second than
    without drafts. Run-ahead fills idle capacity with continuations of the prompts named by
    ``engine.run_ahead.open(...)``; they enter the drafter's trees only (see `run_ahead.RunAhead`). With
    prefix sharing, a new sequence copies the KV of its longest cached prefix (another sequence's slot, or
    blocks kept in a pool) and prefills only the rest (`prefix_sharing.py`, `prefix_cache.py`). A ``dtype``
    casts the model in place (the engine runs on the module it is given).
    """

    def __init__(self, model: LoadedModel, options: EngineOptions | None = None):
        self.options = o = options or EngineOptions()
        drafter, device, max_batch, max_context = o.drafter, o.device, o.max_batch, o.max_context
        max_draft_tokens, calibrate, run_ahead, dtype = o.max_draft_tokens, o.calibrate, o.run_ahead, o.dtype
        self.loaded = model
        self.device = resolve_device(device)
        if dtype is not None:
            target = dtype if isinstance(dtype, torch.dtype) else resolve_engine_dtype(dtype, self.device, model.dtype)
            cast_weights(model.model, target)
        drafter = resolve_drafter(drafter)
        self.max_context = max_context
        self.max_draft_tokens = max_draft_tokens
        self.adaptive_drafts = o.adaptive_drafts
        self.min_draft_gain = o.min_draft_gain
        self.runner = ModelRunner(
            model.model, max_batch, max_context, max_draft_tokens + 1, self.device, exact_attention=o.batch_invariant
        )
        self.prefix = self._prefix_sharing(o.prefix_block_size, o.prefix_cache_tokens) if o.prefix_sharing else None
        self.scheduler = Scheduler(max_batch, o.max_prefill_tokens, self.prefix)
        self.stops = StopChecker(frozenset(model.eos_token_ids), max_context, model.tokenizer)
        self.sequences: dict[str, Sequence] = {}
        self.totals = EngineStats()
        self.drafting = Drafting(
            drafter,
            ForwardCostModel(),
            self.totals,
            self.runner.vocab_size,
            max_draft_tokens,
            max_context,
            o.adaptive_drafts,
            o.min_draft_gain,
        )
        self.verifier = Verifier(self.runner, drafter, self.totals)
        self.run_ahead = None
        if run_ahead is not None:
            self.run_ahead = RunAhead(
                run_ahead,
                drafter=drafter,
                scheduler=self.scheduler,
                runner=self.runner,
                cost_model=self.cost_model,
                stops=self.stops,
                sequences=self.sequences,
            )
        if self.drafting.capabilities.model:
            self.drafter.attach(model.model, self.device, max_batch, max_context, calibrate)
        if calibrate and max_draft_tokens > 0 and self.drafter is not None and self.drafter.name != "none":
            self.calibrate()

    @property
    def drafter(self) -> Drafter | None:
        """The drafter (None: plain decoding)."""
        return self.drafting.drafter

    @property
    def cost_model(self) -> ForwardCostModel:
        """The forward-cost model: it sizes drafts to the batch, and run-ahead rows to the idle capacity."""
        return self.drafting.cost_model

    @cost_model.setter
    def cost_model(self, model: ForwardCostModel) -> None:
        self.drafting.cost_model = model
        if self.run_ahead is not None:
            self.run_ahead.cost_model = model

    def _prefix_sharing(self, block_size: int, cache_tokens: int) -> PrefixSharing:
        kv = self.runner.kv
        pool = None
        if cache_tokens >= block_size:
            shapes = [(k.shape[1], k.shape[3]) for k in kv.keys]
            pool = PrefixCache(shapes, cache_tokens // block_size, block_size, kv.keys[0].dtype, kv.keys[0].device)
        return PrefixSharing(kv, pool, min_wait_gain=block_size)

    # ----- requests -------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: Seq[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        prompt_key: Hashable | None = None,
        kind: RequestKind = RequestKind.ROLLOUT,
    ) -> str:
        """Queue a request (or continue a held one); raises ValueError on bad input. An ``undrafted`` request
        gets no drafts and leaves nothing in the drafter; run-ahead goes through ``run_ahead``, not here.

        If `request_id` names a finished, held sequence whose tokens are a prefix of `prompt_ids`,
        its KV is reused and the extra tokens (tool output) are fed as forced tokens.
        """
        if params is not None and not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        # A private copy, validated: a caller changing its object later cannot reach the running request.
        params = dataclasses.replace(params) if params is not None else SamplingParams()
        prompt = self._check_prompt(prompt_ids, params)
        if kind is RequestKind.RUN_AHEAD:
            raise ValueError("run-ahead sequences are opened through engine.run_ahead, not add_request")
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        seq = self.sequences.get(request_id)
        if seq is not None and seq.status in (Status.RUNNING, Status.WAITING):
            raise ValueError(f"request {request_id!r} is still running")
        if seq is not None and prompt[: len(seq.tokens)] == seq.tokens:
            forced = prompt[len(seq.tokens) :]
            seq.begin_call(prompt, params, seed)
            if forced and seq.drafting:
                with self.drafting.guard("add_tokens", seq):
                    self.drafter.add_tokens(request_id, forced)
            if self.scheduler.take_held(request_id) is not None:
                self.scheduler.resume(seq)
            else:  # evicted: prefill again
                self.scheduler.add(seq)
            return request_id
        if seq is not None:  # a different history under the same id: start over
            self.release(request_id)
        key = prompt_key if prompt_key is not None else keys.prompt_key(prompt)
        seq = Sequence(request_id, key, prompt, params, seed, call_start=len(prompt))
        if self.drafter is not None and kind is RequestKind.ROLLOUT:
            seq.drafting = True
            with self.drafting.guard("start_request", seq):
                self.drafter.start_request(request_id, key, prompt)
        self.sequences[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def _check_prompt(self, prompt_ids: Seq[int], params: SamplingParams) -> list[int]:
        prompt = check_prompt(prompt_ids, self.runner.vocab_size, self.max_context)
        if params.stop and self.stops.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        return prompt

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    def has_work(self) -> bool:
        """Real requests to run, or idle capacity that run-ahead would fill now."""
        return self.has_unfinished() or (self.run_ahead is not None and self.run_ahead.ready())

    def release(self, request_id: str) -> None:
        """Forget a request: free its slot and end it in the drafter (cancels it if still running)."""
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return
        sched = self.scheduler
        if seq.status is Status.RUNNING:
            sched.running.remove(seq)
        elif seq.status is Status.WAITING:
            sched.waiting.remove(seq)
        else:
            sched.held.pop(request_id, None)
        sched.release(seq)
        if seq.drafting:
            seq.drafting = False
            with self.drafting.guard("stop_request", seq):
                self.drafter.stop_request(request_id)

    def idle_capacity(self) -> int:
        """Batch slots not needed by running or queued requests."""
        return self.scheduler.idle_capacity()

    def forget_prefixes(self) -> None:
        """Empty the prefix block pool (nothing may run): the next run reuses no KV an earlier run stored."""
        if self.has_unfinished():
            raise RuntimeError("the prefix cache cannot be emptied while requests run")
        if self.prefix is not None:
            self.prefix.clear()
        for seq in self.sequences.values():
            seq.stored_blocks = 0

    # ----- policy ---------------------------------------------------------------------------------

    def update_weights(self, weights: dict[str, torch.Tensor] | torch.nn.Module) -> None:
        """Load new policy weights in place; the drafter's trees survive, a model drafter is rebuilt
        from them (its seconds add up in ``drafter_update_s``).

        Cached KV was computed by the old policy, so every sequence re-prefills at its next step and the
        prefix cache is emptied.
        """
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self.runner.load_weights(state)
        if self.prefix is not None:
            self.prefix.clear()
        if self.drafting.capabilities.model:
            self.totals.drafter_update_s += self.drafter.rebuild()
        for seq in self.sequences.values():
            seq.num_cached = seq.stored_blocks = 0
        if self.run_ahead is not None:
            self.run_ahead.drop_all()

    def end_step(self) -> None:
        """A training step ended: tell the drafter (policy-version boundary)."""
        if self.drafter is not None:
            with self.drafting.guard("end_step", None):
                self.drafter.end_step()

    def stats(self) -> dict:
        out = self.totals.as_dict()
        out.update(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            held=len(self.scheduler.held),
            cost_fixed_s=self.cost_model.fixed_s,
            cost_per_token_s=self.cost_model.per_token_s,
            cost_per_sequence_s=self.cost_model.per_sequence_s,
            model_draft_tested=self.drafting.model_acceptance.nodes_tested,  # model-drafted nodes whose parent was accepted …
            model_draft_accepted=self.drafting.model_acceptance.nodes_accepted,  # … and those accepted themselves
        )
        if self.run_ahead is not None:
            out["run_ahead"] = self.run_ahead.stats.as_dict()
        reused = self.prefix.stats.reused_tokens if self.prefix is not None else 0
        requested = self.totals.prefill_tokens + reused
        out.update(
            prefill_requested=requested,
            prefill_reused=reused,
            prefill_hit_rate=reused / requested if requested else 0.0,
        )
        if self.prefix is not None:
            out.update(self.prefix.as_dict())
        return out

    def calibrate(self, sizes: tuple[int, ...] = CALIBRATION_SIZES) -> None:
        """Seed the cost model from measured step times (`calibration.py`)."""
        slots = list(self.scheduler.free_slots)
        if slots:
            self.cost_model.calibrate(measure_step_costs(self.runner, slots, sizes))

    # ----- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one draft → verify → accept step; returns the requests that finished in it.

        Run-ahead rows ride along in capacity the real sequences leave (or run alone in a bubble);
        they change no real sequence and no figure of real work.
        """
        started = time.perf_counter()
        if self.run_ahead is not None:
            self.run_ahead.make_room()
        seqs = self.scheduler.schedule()
        makespan = not self.scheduler.waiting  # nothing queued: the last sequence to finish sets the time
        drafts, draft_s = self.drafting.draft(seqs, makespan)
        drafts = self.drafting.choose(seqs, drafts, makespan)
        chunks = chunks_of(seqs, drafts)
        ahead = self.run_ahead.plan(seqs, chunks) if self.run_ahead is not None else []
        if not seqs and not ahead:
            return []
        verified = self._verify(seqs, chunks, drafts, ahead)
        if not seqs:
            return []
        finished = self._accept(seqs, verified)
        outputs = [self._finish(seq) for seq in finished]
        self._count_step(seqs, verified, draft_s, time.perf_counter() - started)
        return outputs

    def _verify(self, seqs: list[Sequence], chunks: list, drafts: list[Draft], ahead: list) -> _StepRecord:
        """One forward pass over the real rows and the run-ahead rows riding along, each draft verified; if the
        batched pass fails, the real rows again one by one without drafts (run-ahead rows are dropped) to find
        whose fault it was. Run-ahead rows' tokens go to run-ahead; what comes back is the real rows'."""
        all_chunks = chunks + [c for _, c in ahead]
        t0 = time.perf_counter()
        try:
            emitted, accepted, faults = self.verifier.forward_and_verify(
                seqs + [s for s, _ in ahead], all_chunks, drafts + [Draft()] * len(ahead)
            )
            batched = True
        except Exception:  # noqa: BLE001 - the batched pass failed: find out whose fault it is
            if ahead:  # run-ahead rows never risk a real step twice: they go, the real rows retry alone
                self.run_ahead.abandon()
                ahead = []
            drafts = [Draft() for _ in seqs]
            chunks = all_chunks = chunks_of(seqs, drafts)
            emitted, accepted, faults = self.verifier.forward_one_by_one(seqs, chunks, drafts)
            batched = False
        forward_s = time.perf_counter() - t0  # the forward pass, the LM head and sampling
        # decoding and verifying only: the steps whose drafts the cost model sizes
        decoding = batched and all(c.num_pending == 1 for c in all_chunks) and not faults
        if decoding:
            self.cost_model.observe(sum(len(c) for c in all_chunks), forward_s, len(all_chunks))
        if ahead:
            broken = {i - len(seqs) for i in faults if i >= len(seqs)}
            self.run_ahead.absorb(ahead, emitted[len(seqs) :], 0.0 if seqs else forward_s, broken)
            emitted, accepted = emitted[: len(seqs)], accepted[: len(seqs)]
            faults = {i: f for i, f in faults.items() if i < len(seqs)}
        return _StepRecord(chunks, drafts, emitted, accepted, faults, batched, forward_s, decoding)

    def _accept(self, seqs: list[Sequence], verified: _StepRecord) -> list[Sequence]:
        """Append each row's emitted tokens (the drafter learns what was accepted, KV keeps the accepted
        nodes, the prefix cache what the step computed); returns the sequences that finished."""
        if verified.batched:
            self.drafting.observe(verified.drafts, verified.accepted)
        self.verifier.compact(verified.chunks, verified.accepted)
        finished = []
        for i, (seq, chunk, emitted, accepted) in enumerate(
            zip(seqs, verified.chunks, verified.emitted, verified.accepted)
        ):
            kept = self._append(seq, emitted)
            verified.kept.append(kept)
            # KV holds the pending tokens and the accepted nodes, but a stop may have cut the tokens short.
            seq.num_cached = min(chunk.start + chunk.num_pending + len(accepted), len(seq.tokens) - 1)
            if i in verified.faults and seq.finish_reason is None:
                self._model_fault(seq, verified.faults[i])
            if seq.finish_reason is not None:
                finished.append(seq)
        if self.prefix is not None:
            self.prefix.store(seqs)
        return finished

    def _count_step(self, seqs: list[Sequence], verified: _StepRecord, draft_s: list[float], step_s: float) -> None:
        """Per-sequence and total figures of the step: forwards, drafted and accepted tokens, prefill, time."""
        t = self.totals
        book_s = step_s - verified.forward_s - sum(draft_s)
        for seq, chunk, draft, accepted, kept, ds in zip(
            seqs, verified.chunks, verified.drafts, verified.accepted, verified.kept, draft_s
        ):
            m = seq.metrics
            m.forwards += 1
            m.draft_proposed += len(draft)
            m.draft_accepted += min(len(accepted), kept)
            m.tokens += kept
            m.prefill_tokens += chunk.num_pending - 1
            m.draft_s += ds
            m.forward_s += verified.forward_s
            m.bookkeeping_s += book_s / len(seqs)
            t.prefill_tokens += chunk.num_pending - 1
            t.draft_verified += len(draft)
            t.draft_accepted += min(len(accepted), kept)
            t.tokens += kept
        t.steps += 1
        drafted = sum(len(d) for d in verified.drafts)
        t.verify_s += self.cost_model.per_token_s * drafted  # the fit's price of a fed token
        if self.drafting.paid is not None and verified.decoding:
            self.drafting.paid.observe(len(seqs), drafted, sum(verified.kept), step_s)
        t.tail.count(len(seqs), step_s, sum(verified.kept))
        t.draft_s += sum(draft_s)
        t.forward_s += verified.forward_s
        t.bookkeeping_s += book_s

    def _model_fault(self, seq: Sequence, message: str) -> None:
        """End `seq` with an error; its KV (possibly NaN, which attention masks do not hide) is wiped."""
        seq.finish("error", error=message)
        seq.num_cached = 0
        if seq.slot is not None:
            self.runner.clear_slot(seq.slot)
        self.totals.model_errors += 1
        log.warning("request %r ended: %s", seq.request_id, message)

    def _append(self, seq: Sequence, emitted: list[tuple[int, float]]) -> int:
        """Append tokens one by one, stopping exactly where plain decoding would; returns how many."""
        kept = 0
        try:
            for token, lp in emitted:
                seq.tokens.append(token)
                seq.logprobs.append(lp)
                kept += 1
                done = self.stops.check(seq)
                if done is not None:
                    seq.finish(*done)
                    break
        except Exception as exc:  # noqa: BLE001 - e.g. a tokenizer failing on this output: this request only
            seq.finish("error", error=f"checking stop conditions failed: {type(exc).__name__}: {exc}")
        if seq.drafting and kept:
            tokens = seq.tokens[len(seq.tokens) - kept :]
            with self.drafting.guard("add_tokens", seq):
                if self.drafting.capabilities.needs_logprobs:  # a drafter that reuses rollouts with their log-probs
                    self.drafter.add_tokens(seq.request_id, tokens, seq.logprobs[len(seq.logprobs) - kept :])
                else:
                    self.drafter.add_tokens(seq.request_id, tokens)
        return kept

    def _finish(self, seq: Sequence) -> RequestOutput:
        self.scheduler.finish(seq)
        try:
            text = self.stops.output_text(seq)
        except Exception as exc:
            text = None
            seq.error = seq.error or f"decoding the output failed: {exc}"
        return seq.output(text)

    # ----- batch API ------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        prompt_keys: list[Hashable] | None = None,
        progress: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt; a bad prompt yields an "error" output, the others still run."""
        return generate_all(self, prompts, params, prompt_keys, progress)
