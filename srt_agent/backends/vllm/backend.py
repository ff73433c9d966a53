"""vLLM as a rollout backend: :class:`VLLMBackend` drives a :class:`~.engine.VLLMEngine` (vLLM V1 in this
process) from the AsyncEngine's thread behind the RolloutBackend seam; :func:`vllm_backend` builds one from
an env config, and :data:`REGISTERED` is its entry in the backend registry. :class:`UndraftedView` runs requests without speculation on an SRT backend's engine, so a
comparison without speculation needs no second engine (nor its weights and KV cache)."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from pathlib import Path

import torch

from ...drafting import drafter_capabilities, runs_as_proposer
from ...drafting.request_kind import RequestKind
from ...engine import AsyncEngine, RequestOutput, SamplingParams
from ...engine.stats import cost_table
from ..base import Capabilities, Registered
from ..engine_backend import EngineRunAhead
from .availability import refusal, vllm_version
from .kv_cache import kv_cache_gib
from .models import loaded_model_dir
from .speculative import check_drafter
from .vllm_engine import VLLMEngine, VLLMEngineOptions


class VLLMBackend(AsyncEngine[VLLMEngine]):
    """The rollout backend over :class:`VLLMEngine` (run-ahead with SRT: ``run_ahead.py``; no forward-cost
    table)."""

    name = "vllm"

    def __init__(self, engine: VLLMEngine):
        super().__init__(engine, restart=VLLMEngine.restarted)
        self.drafter_name = engine.drafter_name
        self.run_ahead = EngineRunAhead(self) if engine.run_ahead is not None else None
        self.capabilities = Capabilities(
            device=str(engine.device),
            exact_sampling=engine.exact_sampling,
            trees=runs_as_proposer(engine.drafter_name) and drafter_capabilities(engine.drafter_name).trees,
            run_ahead=self.run_ahead is not None,
            serves_module=False,
        )

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.call(lambda engine: engine.update_weights(weights)).result()

    def end_step(self) -> None:
        self.call(lambda engine: engine.end_step()).result()

    def stats(self) -> dict:
        return self.call(lambda engine: engine.stats()).result()

    def trees(self):
        proposer = self.call(lambda engine: engine.proposer()).result()
        return proposer.cache if proposer is not None else None

    def restore_trees(self, cache) -> None:
        def restore(engine: VLLMEngine) -> None:
            proposer = engine.proposer()
            if proposer is None:
                raise ValueError(f"drafter {engine.drafter_name!r} keeps no rollout cache")
            proposer.cache = cache

        self.call(restore).result()

    def step_costs(self) -> tuple[dict, dict]:
        """vLLM's steps as measured so far (those that ran only our requests: decoding, verifying, prefilling) and
        its settings."""

        def read(e: VLLMEngine) -> tuple[dict, dict]:
            settings = dict(max_batch=e.max_batch, max_context=e.max_context, max_draft_tokens=e.speculative_tokens)
            return cost_table(e.step_cost), {"engine": {"backend": "vllm", **settings}}

        return self.call(read).result()

    def prefix_blocks_in_use(self) -> None:
        """None: vLLM's prefix cache is its own (no block pool of ours)."""
        return None

    def undrafted(self) -> UndraftedView | None:
        """This engine without speculation for the view's requests (None unless the drafter can leave
        requests out: SRT's proposer leaves ``undrafted`` requests out; vLLM's own drafters do not)."""
        return UndraftedView(self) if runs_as_proposer(self.drafter_name) else None

    def forget_prefixes(self) -> None:
        """Empty vLLM's prefix cache (nothing may run): a run that follows another on a shared engine starts
        as cold as on an engine of its own."""

        def reset(engine: VLLMEngine) -> None:
            if engine.calls or not engine.llm.reset_prefix_cache():
                raise RuntimeError("vLLM's prefix cache cannot be emptied while requests run")

        self.call(reset).result()

    def describe(self) -> str:
        e = self.engine
        return f"vLLM {vllm_version()} ({e.settings.summary}, started in {e.startup_s:.0f} s)"

    def close(self) -> None:
        super().close()
        self.engine.close()


class UndraftedView:
    """The rollout backend of a run without speculation on `owner`'s engine: its requests get no drafts and
    stay out of the trees (they are of kind ``undrafted``; their ids get a namespace of their own, so they never
    meet the owner's), with exact sampling the tokens are those
    of an engine without a drafter. Weights, steps, trees and closing are the owner's: the view's own calls
    for them do nothing."""

    name = "vllm"
    drafter_name = "none"
    run_ahead = None

    def __init__(self, owner: VLLMBackend):
        self.owner = owner
        self.prefix = "undrafted/"
        self.capabilities = dataclasses.replace(owner.capabilities, trees=False)

    @property
    def engine(self) -> VLLMEngine:
        return self.owner.engine  # the owner's current one (a restart replaces it)

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        prompt_key: Hashable | None = None,
    ) -> RequestOutput:
        out = await self.owner.generate(self.prefix + request_id, prompt_ids, params, prompt_key, RequestKind.UNDRAFTED)
        return dataclasses.replace(out, request_id=request_id)

    def release(self, request_id: str) -> None:
        self.owner.release(self.prefix + request_id)

    def idle_capacity(self) -> int:
        return self.owner.idle_capacity()

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The owner loads them."""

    def end_step(self) -> None:
        """The owner ends the step."""

    def stats(self) -> dict:
        return {**self.owner.stats(), "shared_with": self.owner.drafter_name}

    def trees(self) -> None:
        return None

    def restore_trees(self, cache) -> None:
        raise ValueError("drafter 'none' keeps no rollout cache")

    def step_costs(self) -> tuple[dict, dict]:
        return self.owner.step_costs()

    def prefix_blocks_in_use(self) -> None:
        return None

    def undrafted(self) -> None:
        """None: a view lends no further view."""
        return None

    def forget_prefixes(self) -> None:
        self.owner.forget_prefixes()

    def describe(self) -> str:
        return f"{self.owner.describe()}, shared with {self.owner.drafter_name}: no drafts for this run"

    def health(self) -> dict:
        return self.owner.health()

    def close(self) -> None:
        """The owner closes the engine."""


def proposer_options(config, drafter: str) -> dict:
    """``engine.vllm.proposer`` with the run's tree budget where a tree drafter runs and those options do not
    set ``max_bytes`` themselves; nothing for a drafter vLLM runs itself (``suffix``, ``ngram``: SRT's
    proposer options are not theirs)."""
    if not runs_as_proposer(drafter):
        return {}
    options = dict(config.engine.vllm.proposer)
    if "max_bytes" not in options:
        options.update(config.tree_budget().drafter_options(drafter_capabilities(drafter)))
    return options


def vllm_backend(config, loaded, drafter: str | None = None, run_ahead=None) -> VLLMBackend:
    """vLLM for env config `config` (``engine:`` and ``engine.vllm:``) serving `loaded`'s model: the
    directory it was loaded from, else a directory saved from `loaded` itself; `run_ahead` (options) with
    drafter srt fills idle capacity with run-ahead requests."""
    e = config.engine
    drafter = drafter or e.drafter
    check_drafter(drafter)
    source = str(getattr(loaded, "source", "")).partition(":")[2]
    model_dir = Path(source) if source and (Path(source) / "config.json").exists() else loaded_model_dir(loaded)
    options = VLLMEngineOptions(
        drafter=drafter,
        max_batch=e.max_batch,
        max_context=e.max_context,
        speculative_tokens=e.vllm.speculative_tokens,
        enforce_eager=e.vllm.enforce_eager,
        kv_cache_gib=kv_cache_gib(loaded.model.config, e),
        threads=e.vllm.threads,
        exact_sampling=e.vllm.exact_sampling,
        block_size=e.vllm.block_size,
        proposer_options=proposer_options(config, drafter),
        run_ahead=run_ahead,
        dtype=getattr(e, "dtype", "auto"),
        gpu_memory_utilization=e.vllm.gpu_memory_utilization,
        batch_invariant=e.vllm.batch_invariant,
    )
    return VLLMBackend(VLLMEngine(model_dir, loaded.tokenizer, loaded.eos_token_ids, options))


REGISTERED = Registered(
    factory=vllm_backend, refusal=refusal, chosen="vLLM is installed", serves_module=False, lends_undrafted=True
)
