"""vLLM V1's LLMEngine in this process behind our engine's stepping interface (:class:`VLLMEngine`), and
what says whether vLLM can run here.

Requests go in as token ids; each delta of sampled ids goes through our engine's
:class:`~srt_agent.engine.stops.StopChecker`, so a turn ends at exactly the token where our engine's would
(vLLM's own EOS rule is off; what a speculative step overshoots is dropped). A later turn is a new vLLM
request over the whole token list, its KV reused by vLLM's prefix cache. Sampling is exact by default
(``exact_sampling.py``): a seeded request's tokens do not depend on the drafts, and equal our engine's up to
near-ties of the two engines' float errors. A narrow model's LM head runs in float32. New
weights go in place (``reload_weights``); the SRT proposer's trees stay. The device decides the settings
(``device_settings.py``). The whole contract: docs/vllm.md.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...drafting.choice.cost_model import ForwardCostModel
from ...drafting.registry import runs_as_proposer
from ...drafting.request_kind import RequestKind
from ...engine.options import RunAheadOptions
from ...engine.params import RequestOutput, SamplingParams, check_prompt
from ...engine.sequence import Sequence
from ...engine.stops import StopChecker
from ...engine.tail import TailStats
from .availability import VLLMUnavailable, VLLMUnsupported, vllm_missing, vllm_version
from .device_settings import VLLMSettings, apply_env
from .run_ahead import VLLMRunAhead, check_run_ahead
from .settings import EXACT_SAMPLING_ENV, kind_args
from .speculative import check_drafter, configure_speculation
from .workers import check_runner


def turn_seed(seed: int | None, prompt_len: int) -> int | None:
    """vLLM's seed for one turn of a seeded request: fresh noise per turn, reproducible."""
    return None if seed is None else random.Random(f"{seed}/{prompt_len}").getrandbits(31)


@dataclass
class VLLMStats:
    """Totals over the backend's lifetime (drafts: the tokens vLLM's scheduler held for verification)."""

    requests: int = 0
    tokens: int = 0
    forwards: int = 0  # steps in which a request received tokens, summed over requests
    draft_proposed: int = 0
    draft_accepted: int = 0
    prefill_tokens: int = 0
    prefill_reused: int = 0
    overshoot_tokens: int = 0  # tokens vLLM sampled past our stop rule (dropped)
    weight_updates: int = 0
    weight_update_s: float = 0.0
    tail: TailStats = field(default_factory=TailStats)  # step time by our requests running (engine/tail.py)

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["tail"] = self.tail.as_dict()
        out["tokens_per_forward"] = self.tokens / self.forwards if self.forwards else 0.0
        out["acceptance"] = self.draft_accepted / self.draft_proposed if self.draft_proposed else 0.0
        return out


@dataclass(frozen=True)
class VLLMEngineOptions:
    """What a :class:`VLLMEngine` runs: the drafter and its draft length, batch and context, and the knobs of
    vLLM's engine (None: the device decides, ``device_settings.py``)."""

    drafter: str = "none"
    max_batch: int = 32
    max_context: int = 2048
    speculative_tokens: int = 8
    enforce_eager: bool | None = None
    kv_cache_gib: float = 2.0
    threads: int | None = None
    exact_sampling: bool = True
    block_size: int | None = 32
    proposer_options: Mapping[str, Any] | None = None
    run_ahead: RunAheadOptions | None = None
    dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    batch_invariant: bool = False


class VLLMEngine:
    """vLLM's LLMEngine behind the stepping interface of our Engine (`add_request`, `step`, `release`,
    `has_work`, `idle_capacity`), so :class:`~srt_agent.engine.AsyncEngine` can drive it."""

    def __init__(self, model_dir: str | Path, tokenizer, eos_token_ids, options: VLLMEngineOptions | None = None):
        self.model_dir, self.tokenizer = model_dir, tokenizer  # what a restart starts from, with `options`
        self.options = o = options or VLLMEngineOptions()
        drafter, run_ahead, exact_sampling = o.drafter, o.run_ahead, o.exact_sampling
        max_batch, max_context, speculative_tokens = o.max_batch, o.max_context, o.speculative_tokens
        check_drafter(drafter)
        if run_ahead is not None:
            check_run_ahead(run_ahead, drafter)
        missing = vllm_missing()
        if missing:
            raise VLLMUnavailable(missing)
        from .device_settings import device_facts, vllm_settings

        self.settings = vllm_settings(
            device_facts(model_dir),
            o.dtype,
            o.kv_cache_gib,
            o.threads,
            o.enforce_eager,
            o.gpu_memory_utilization,
            o.batch_invariant,
        )
        self.drafter_name = drafter
        self.exact_sampling = exact_sampling
        self.max_batch, self.max_context = max_batch, max_context
        self.stops = StopChecker(frozenset(eos_token_ids), max_context, tokenizer)
        self.eos_token_ids = sorted(eos_token_ids)
        self.vocab_size = len(tokenizer)
        self.speculative_tokens, self.step_cost = speculative_tokens, ForwardCostModel()  # its measured steps
        started = time.perf_counter()
        self.llm = _start_engine(
            exact_sampling,
            model=str(model_dir),
            max_model_len=max_context,
            max_num_seqs=max_batch,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            speculative_config=configure_speculation(drafter, speculative_tokens, **dict(o.proposer_options or {})),
            disable_log_stats=True,
            seed=0,
            async_scheduling=False if exact_sampling else None,
            block_size=o.block_size,
            use_tqdm_on_load=False,
            settings=self.settings,
        )
        try:
            check_runner(self.llm, exact_sampling=exact_sampling, srt=runs_as_proposer(drafter))
        except RuntimeError:
            self.close()
            raise
        self._proposer = self.proposer()
        # vLLM's CPU attention checks at every step that the thread count is the one it started with;
        # another engine's start (or anyone's set_num_threads) in this process may have changed it.
        self.threads_at_start = torch.get_num_threads()
        self.startup_s = time.perf_counter() - started
        self.device = torch.device(self.llm.vllm_config.device_config.device_type)
        self.calls: dict[str, Sequence] = {}  # the running turns (one vLLM request each) by our request id
        self.held: dict[str, list[int]] = {}  # finished requests' tokens (a next turn's forced tokens)
        self.totals = VLLMStats()
        self.run_ahead = (
            VLLMRunAhead(run_ahead, self, self.llm.vllm_config.cache_config.block_size, self._proposer)
            if run_ahead is not None
            else None
        )

    # ----- requests -------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        prompt_key: Hashable | None = None,
        kind: RequestKind = RequestKind.ROLLOUT,
    ) -> str:
        """Start one turn of `kind` (rollout or undrafted; run-ahead: `add_run_ahead`); ValueError on bad input
        (as our Engine)."""
        import dataclasses
        import uuid

        if params is not None and not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        params = dataclasses.replace(params) if params is not None else SamplingParams()
        prompt = check_prompt(prompt_ids, self.vocab_size, self.max_context)
        if kind is RequestKind.RUN_AHEAD:
            raise ValueError("run-ahead requests start through add_run_ahead")
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        if request_id in self.calls:
            raise ValueError(f"request {request_id!r} is still running")
        before = self.held.pop(request_id, None)
        seq = Sequence(request_id, prompt_key, prompt, params, params.seed or 0, call_start=len(prompt))
        if before is not None and prompt[: len(before)] == before:
            seq.metrics.forced_tokens = len(prompt) - len(before)
        vllm_params = self._vllm_params(params, len(prompt), kind)
        try:
            self.llm.add_request(request_id, {"prompt_token_ids": prompt}, vllm_params)
        except Exception as exc:
            if _refused(exc):  # vLLM's own input checks (e.g. stop token ids past its vocabulary)
                raise ValueError(f"vLLM refuses the request: {exc}") from exc
            raise
        self.calls[request_id] = seq
        self.totals.requests += 1
        return request_id

    def _vllm_params(self, params: SamplingParams, prompt_len: int, kind: RequestKind):
        """vLLM's sampling parameters for a turn of `prompt_len` tokens (our stop rule runs here); `kind` travels
        to the proposer in ``extra_args``; run-ahead asks for no log-probs."""
        from vllm import SamplingParams as VParams
        from vllm.sampling_params import RequestOutputKind

        try:
            return self._build_vllm_params(VParams, RequestOutputKind, params, prompt_len, kind)
        except Exception as exc:  # noqa: BLE001 - vLLM's own checks of the values: the request's fault
            raise ValueError(f"vLLM refuses these sampling parameters: {exc}") from exc

    def _build_vllm_params(self, VParams, RequestOutputKind, params: SamplingParams, prompt_len: int, kind):  # noqa: N803
        return VParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k < self.vocab_size else 0,  # as large as the vocabulary: no filter
            max_tokens=min(params.max_tokens, self.max_context - prompt_len),
            seed=params.seed if self.exact_sampling else turn_seed(params.seed, prompt_len),
            stop_token_ids=list(
                dict.fromkeys(params.stop_token_ids + ([] if params.ignore_eos else self.eos_token_ids))
            ),
            ignore_eos=True,
            logprobs=None if kind is RequestKind.RUN_AHEAD else 0,
            detokenize=False,  # stop strings are checked here, token by token
            output_kind=RequestOutputKind.DELTA,
            extra_args=kind_args(kind),
        )

    def add_run_ahead(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        """Start a run-ahead request (``VLLMRunAhead`` calls it, and applies the stop rule); nobody waits on it."""
        self.llm.add_request(
            request_id,
            {"prompt_token_ids": list(prompt_ids)},
            self._vllm_params(params, len(prompt_ids), RequestKind.RUN_AHEAD),
        )

    def abort_run_ahead(self, request_id: str) -> None:
        self.llm.abort_request([request_id])

    def has_work(self) -> bool:
        return bool(self.calls) or (self.run_ahead is not None and self.run_ahead.ready())

    def idle_capacity(self) -> int:
        return max(0, self.max_batch - len(self.calls))

    def release(self, request_id: str) -> None:
        """Forget a request (aborts its turn if one is running)."""
        self.held.pop(request_id, None)
        if self.calls.pop(request_id, None) is not None:
            self.llm.abort_request([request_id])

    def step(self) -> list[RequestOutput]:
        """One vLLM step; the turns it finished."""
        if torch.get_num_threads() != self.threads_at_start:
            torch.set_num_threads(self.threads_at_start)
        if self.run_ahead is not None:
            self.run_ahead.before_step()
        self._count_drafts()
        started = time.perf_counter()
        try:
            outputs = self.llm.step()
        except Exception:
            self._abort_all()  # the step's requests: whoever waits on ours is told by AsyncEngine
            raise
        seconds = time.perf_counter() - started
        finished, running, tokens = [], 0, 0  # ours that ran in the step (got tokens; vLLM may queue others)
        ours, fed = True, self._drafted  # only ours ran (a step the cost table learns from), feeding `fed` tokens
        for out in outputs:
            seq = self.calls.get(out.request_id)
            if seq is None:
                ours = False
                if self.run_ahead is not None:
                    self.run_ahead.absorb(out.request_id, out.outputs[0].token_ids, out.finished)
                continue
            fed += len(seq.tokens) - (out.num_cached_tokens or 0) if seq.num_generated == 0 else 1  # prefill: uncached
            before = len(seq.tokens)
            done = self._feed(seq, out.outputs[0].token_ids, out.outputs[0].logprobs)
            running += bool(out.outputs[0].token_ids)
            tokens += len(seq.tokens) - before
            if out.num_cached_tokens:
                seq.metrics.prefill_reused = out.num_cached_tokens
            if not done and out.finished:
                reason = out.outputs[0].finish_reason
                if reason == "abort" or reason is None:
                    seq.finish("error", error="vLLM aborted the request")
                else:  # vLLM stopped where our rule did not (not expected): keep its reason
                    seq.finish("length" if reason == "length" else "stop", out.outputs[0].stop_reason)
            if seq.finish_reason is not None:
                if not out.finished:
                    self.llm.abort_request([out.request_id])
                if self._proposer is not None:  # tokens sampled past our stop leave the trees
                    self._proposer.end_turn(out.request_id, len(seq.tokens))
                finished.append(self._finish(seq))
        self.totals.tail.count(running, time.perf_counter() - started, tokens)
        if ours and running:
            self.step_cost.observe(fed, seconds, running)
        return finished

    def _abort_all(self) -> None:
        """Abort every request vLLM holds (ours, run-ahead's, any other) after a step that raised: vLLM's
        scheduler had counted them as computed."""
        if self.run_ahead is not None:
            self.run_ahead.drop_all()
        held = list(getattr(getattr(self.llm, "output_processor", None), "request_states", {}))
        try:
            self.llm.abort_request(held, internal=True)
        except TypeError:  # a vLLM whose requests have one id only
            self.llm.abort_request(held)
        self.calls.clear()

    def _count_drafts(self) -> None:
        """Drafts vLLM's scheduler holds for each running request: verified in the coming step."""
        scheduler = getattr(getattr(getattr(self.llm, "engine_core", None), "engine_core", None), "scheduler", None)
        self._drafted = 0
        if scheduler is None or self.drafter_name == "none":
            return
        by_external = {}
        for request in scheduler.requests.values():
            by_external[request.request_id.rsplit("-", 1)[0]] = len(request.spec_token_ids or ())  # "<ours>-<suffix>"
        for request_id, seq in self.calls.items():
            seq.metrics.draft_proposed += by_external.get(request_id, 0)
            self._drafted += by_external.get(request_id, 0)

    def _feed(self, seq: Sequence, token_ids, logprobs) -> bool:
        """Append a delta token by token; True once our stop rule ended the turn."""
        if token_ids:
            seq.metrics.forwards += 1
        for i, token in enumerate(token_ids):
            if seq.finish_reason is not None:
                self.totals.overshoot_tokens += len(token_ids) - i
                break
            seq.tokens.append(token)
            seq.logprobs.append(logprobs[i][token].logprob if logprobs else float("nan"))
            hit = self.stops.check(seq)
            if hit is not None:
                seq.finish(*hit)
        return seq.finish_reason is not None

    def _finish(self, seq: Sequence) -> RequestOutput:
        del self.calls[seq.request_id]
        m = seq.metrics
        m.tokens = seq.num_generated
        m.draft_accepted = max(0, m.tokens - m.forwards)
        m.prefill_tokens = max(0, len(seq.tokens) - seq.num_generated - m.prefill_reused)
        t = self.totals
        t.tokens += m.tokens
        t.forwards += m.forwards
        t.draft_proposed += m.draft_proposed
        t.draft_accepted += m.draft_accepted
        t.prefill_tokens += m.prefill_tokens
        t.prefill_reused += m.prefill_reused
        self.held[seq.request_id] = seq.tokens
        try:
            text = self.stops.output_text(seq)
        except Exception as exc:  # noqa: BLE001 - the tokens stand; the text is a convenience
            text, seq.error = None, seq.error or f"decoding the output failed: {exc}"
        return seq.output(text)

    # ----- policy and drafter ---------------------------------------------------------------------

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """New weights in place, handed to vLLM as given (the trainer sends them in the engine's dtype: no
        float32 copy of the model is made; vLLM's loader copies each into its parameter). Cached prefixes were
        computed by the old ones, so they go first; with turns running (or vLLM refusing to empty its prefix
        cache because blocks are in use) the update is refused: KV of the old policy would be reused, an
        off-policy rollout with no sign."""
        from .workers import reload_weights

        if self.run_ahead is not None:
            self.run_ahead.drop_all()  # run-ahead under the old weights ends here
        if self.calls:
            raise RuntimeError(
                f"new weights while {len(self.calls)} turn(s) run: their KV comes from the old weights; "
                "update between steps, when no request runs"
            )
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(
                "vLLM refused to empty its prefix cache (KV blocks are still in use): new weights now would "
                "reuse KV of the old ones; update between steps, when no request runs"
            )
        start = time.perf_counter()
        reload_weights(self.llm, ((name, tensor.detach()) for name, tensor in weights.items()))
        self.totals.weight_updates += 1
        self.totals.weight_update_s += time.perf_counter() - start

    def proposer(self):
        """The live SRT proposer, or None when the engine drafts with something else."""
        if not runs_as_proposer(self.drafter_name):
            return None
        from .workers import srt_proposer

        return srt_proposer(self.llm)

    def end_step(self) -> None:
        proposer = self.proposer()
        if proposer is not None:
            proposer.end_step()

    def stats(self) -> dict:
        out = self.totals.as_dict()
        out.update(running=len(self.calls), held=len(self.held), startup_s=self.startup_s)
        if self.run_ahead is not None:
            out["run_ahead"] = self.run_ahead.stats.as_dict()
        proposer = self.proposer()
        if proposer is not None:
            out["proposer"] = p = proposer.stats()
            out["speculation"] = dict(
                host_s=p["host_ns"] / 1e9, drafted=p["drafted"], accepted=p["accepted"], verify_s=p["verify_s"]
            )
        return out

    def close(self) -> None:
        """Shut vLLM's engine core down (frees its KV cache)."""
        shutdown = getattr(self.llm.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def needs_restart(self, exc: BaseException) -> bool:
        """Whether a step's `exc` says vLLM's engine core is gone (a new engine is the only way on)."""
        return any(cls.__name__ == "EngineDeadError" for cls in type(exc).__mro__)

    def restarted(self) -> VLLMEngine:
        """A new engine with this one's settings that keeps its trees, held turns and totals; this one is shut
        down first (its KV cache freed). Its running turns are over (their callers were told)."""
        cache = None
        try:
            proposer = self.proposer()
            if proposer is not None:
                proposer.end_step()  # every turn closes; its tokens stay in the trees
                cache = proposer.cache
        except Exception as exc:  # noqa: BLE001 - a worker past reading: the trees are lost, and said so
            warnings.warn(
                f"the SRT trees could not be kept across the engine's restart: {exc}", RuntimeWarning, stacklevel=2
            )
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - a dead core may not shut down cleanly; the new one starts anyway
            warnings.warn(f"the stuck vLLM engine did not shut down cleanly: {exc}", RuntimeWarning, stacklevel=2)
        engine = VLLMEngine(self.model_dir, self.tokenizer, self.eos_token_ids, self.options)
        if cache is not None:
            engine.proposer().cache = cache
        engine.held, engine.totals = self.held, self.totals
        return engine


def _refused(exc: BaseException) -> bool:
    """Whether vLLM raised `exc` because of what the request asked for (its client errors, ValueError)."""
    return isinstance(exc, (ValueError, TypeError)) or any(c.__name__ == "VLLMClientError" for c in type(exc).__mro__)


def _start_engine(exact_sampling: bool, settings: VLLMSettings, **engine_args: Any):
    """vLLM's LLMEngine in this process with `settings` (the device's) and `engine_args`, srt-agent's plugin
    registered first (the CPU temperature fix, exact sampling and the proposer's seam)."""
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from .plugin import register
    from .seams import installed_summary

    warnings.filterwarnings("ignore", message=".*reduce_op.*", category=FutureWarning)  # vLLM's kernel scan
    apply_env(settings)
    set_num_threads, exact_before = torch.set_num_threads, os.environ.get(EXACT_SAMPLING_ENV)
    os.environ[EXACT_SAMPLING_ENV] = "1" if exact_sampling else "0"  # read when this engine's runner is built
    try:
        register()  # in this process, which is the worker's
        moved = installed_summary()
        if moved:
            raise VLLMUnsupported(f"this vLLM ({vllm_version()}) moved what srt-agent hooks: {moved}")
        return LLMEngine.from_engine_args(EngineArgs(**engine_args, **settings.engine_args))
    finally:  # vLLM's CPU worker disables it process-wide; the trainer and our engine still need it
        torch.set_num_threads = set_num_threads
        _restore_env(EXACT_SAMPLING_ENV, exact_before)  # other engines in this process choose for themselves


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
