"""`SRTServer`: one replica's engine behind verl's token-in/token-out server interface (a Ray actor).

verl's ``LLMServerClient`` calls ``generate(prompt_ids, sampling_params, request_id, ...)`` with a fresh
request id every turn, so the server recognizes a trajectory's next turn by its tokens: a finished turn
is held (KV and the open sequence in its prompt's tree kept) and a later call whose prompt extends it
continues it, with the new tokens (tool output) forced. Up to ``max_held`` finished turns are held, least
recently used released first; ``sleep`` and ``clear_kv_cache`` release them all. The trees outlive all of
this, weight updates included.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from verl.workers.rollout.replica import TokenOutput

from ...drafting import capabilities
from ...drafting.trees.held_turns import HeldTurns
from ...engine import AsyncEngine, Engine, EngineOptions, RequestOutput
from ...models import load_model
from .wire import from_verl_sampling, to_token_output

DEFAULT_MAX_BATCH = 64
T = TypeVar("T")


async def on_engine_thread(front: AsyncEngine, fn: Callable[[Engine], T]) -> T:
    """Run `fn(engine)` on the engine's thread between steps, without blocking the actor's event loop."""
    return await asyncio.wrap_future(front.call(fn))


def model_path(model_config: Any) -> str:
    """The local model directory verl resolved (``local_path``), else its ``path``."""
    path = getattr(model_config, "local_path", None) or getattr(model_config, "path", None)
    if path is None and isinstance(model_config, dict):
        path = model_config.get("local_path") or model_config.get("path")
    if not path:
        raise ValueError("the model config names no model path (actor_rollout_ref.model.path)")
    return str(path)


class SRTServer:
    """An Engine (with its drafter's trees) serving one verl rollout replica.

    Engine options come from ``actor_rollout_ref.rollout.engine_kwargs.srt``: ``drafter`` (default srt),
    ``device`` (auto), ``max_batch`` (default min(max_num_seqs, 64)), ``max_held``, and any other
    :class:`Engine` keyword (``max_draft_tokens``, ``adaptive_drafts``, ...). The context is
    ``max_model_len``, else ``prompt_length + response_length``; the dtype is the rollout's ``dtype``.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, **_: Any):
        self.config = config
        self.replica_rank = replica_rank
        options = dict((config.engine_kwargs or {}).get("srt") or {})
        device = options.pop("device", "auto")
        max_batch = int(options.pop("max_batch", min(config.max_num_seqs, DEFAULT_MAX_BATCH)))
        max_held = int(options.pop("max_held", 4 * max_batch))
        max_context = config.max_model_len or config.prompt_length + config.response_length
        loaded = load_model(model_path(model_config), dtype=config.dtype, device=device)
        self.engine = Engine(
            loaded,
            EngineOptions(
                drafter=options.pop("drafter", "srt"),
                device=device,
                max_batch=max_batch,
                max_context=max_context,
                **options,
            ),
        )
        self.front = AsyncEngine(self.engine)
        self.held = HeldTurns(max_held)  # engine request id -> its tokens
        self.global_steps: int | None = None
        self._pending_weights: dict[str, Any] = {}

    def address(self) -> str:
        """A unique name for this replica (verl keys its load balancer by server address)."""
        return f"srt://{socket.gethostname()}/replica-{self.replica_rank}"

    # ---- generation ----------------------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        priority: int = 0,
        prompt_key: Hashable | None = None,
        **_: Any,
    ) -> TokenOutput:
        """One turn; bad input raises ValueError, engine errors come back with ``stop_reason="aborted"``."""
        if image_data is not None or video_data is not None or audio_data is not None:
            raise ValueError("the srt backend serves text-only models")
        prompt_ids = [int(t) for t in prompt_ids]
        params = from_verl_sampling(sampling_params, default_max_tokens=self.config.response_length)
        rid = self._continued(prompt_ids) or f"srt-{uuid.uuid4().hex}"
        out: RequestOutput = await self.front.generate(rid, prompt_ids, params, prompt_key=prompt_key)
        if out.finish_reason == "error":
            self.front.release(rid)
        else:
            self._hold(rid, prompt_ids + list(out.token_ids))
        return to_token_output(out, self.global_steps)

    def _continued(self, prompt_ids: list[int]) -> str | None:
        """The held turn that `prompt_ids` extends (the longest), claimed for this call."""
        claimed = self.held.claim(prompt_ids)
        return None if claimed is None else claimed[0]

    def _hold(self, rid: str, tokens: list[int]) -> None:
        for old in self.held.hold(rid, tokens):
            self.front.release(old)

    def release_held(self) -> int:
        """Release every held turn (their KV); the trees keep their tokens."""
        released = self.held.release_all()
        for rid in released:
            self.front.release(rid)
        return len(released)

    # ---- verl's server lifecycle ----------------------------------------------------------------
    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to reload: the engine keeps its weights and KV memory allocated."""

    async def sleep(self) -> None:
        self.release_held()

    async def clear_kv_cache(self) -> None:
        self.release_held()

    async def release_kv_cache(self) -> None:
        self.release_held()

    async def resume_kv_cache(self) -> None:
        """Nothing to do (see ``wake_up``)."""

    async def wait_for_requests_to_drain(self) -> None:
        while self.engine.has_unfinished():
            await asyncio.sleep(0.01)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """Running requests finish instead (the engine cannot abort a request mid-turn); held turns are released."""
        self.release_held()
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        """Nothing was paused (see ``abort_all_requests``)."""

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def start_profile(self, **kwargs: Any) -> None:
        """Profiling is not implemented for the srt backend."""

    async def stop_profile(self) -> None:
        """Profiling is not implemented for the srt backend."""

    # ---- weights ---------------------------------------------------------------------------------
    async def receive_weights(self, named_tensors: list[tuple[str, Any]]) -> None:
        """Stage one bucket of a weight update (CPU tensors, sent by the server adapter)."""
        self._pending_weights.update(named_tensors)

    async def apply_weights(self, global_steps: int | None = None) -> int:
        """Load the staged tensors into the policy (names the model lacks are an error; names not sent keep
        their values, e.g. a tied LM head); held turns are released since their KV is stale. Returns the count."""
        staged, self._pending_weights = self._pending_weights, {}

        def load(engine: Engine) -> int:
            state = engine.loaded.model.state_dict()
            unknown = sorted(set(staged) - set(state))
            if unknown:
                raise ValueError(f"weights the policy does not have: {unknown[:5]}")
            engine.update_weights({**state, **staged})
            return len(staged)

        count = await on_engine_thread(self.front, load)
        self.release_held()
        if global_steps is not None:
            self.global_steps = global_steps
        return count

    async def state_checksum(self) -> float:
        """The sum of all policy weights (to check that an update arrived)."""
        return await on_engine_thread(
            self.front, lambda e: float(sum(p.double().sum() for p in e.loaded.model.parameters()))
        )

    # ---- trees -----------------------------------------------------------------------------------
    def _cache(self, engine: Engine):
        if not capabilities(engine.drafter).trees:
            name = engine.drafter.name if engine.drafter is not None else "none"
            raise ValueError(f"the {name!r} drafter keeps no per-prompt trees")
        return engine.drafter.cache

    async def export_prompt(self, prompt_key: Hashable) -> bytes | None:
        """The prompt's tree as bytes, or None when this replica has none."""
        return await on_engine_thread(
            self.front, lambda e: self._cache(e).export_prompt(prompt_key) if prompt_key in self._cache(e) else None
        )

    async def import_prompt(self, data: bytes | None) -> Hashable | None:
        """Merge an exported tree into this replica's cache (None, from a replica without it, is a no-op)."""
        if data is None:
            return None
        return await on_engine_thread(self.front, lambda e: self._cache(e).import_prompt(data))

    async def prompt_keys(self) -> list[Hashable]:
        return await on_engine_thread(self.front, lambda e: self._cache(e).prompt_keys())

    async def stats(self) -> dict:
        """The engine's totals and, for tree drafters, the cache's size."""

        def collect(engine: Engine) -> dict:
            out = engine.stats()
            if capabilities(engine.drafter).trees:
                out["cache"] = vars(engine.drafter.cache.stats())
            out["held"] = len(self.held)
            return out

        return await on_engine_thread(self.front, collect)
