"""How an engine is driven: one step at a time (:class:`SteppingEngine`: what
:class:`~.async_engine.AsyncEngine` calls on its thread and batch generation drives; our Engine and vLLM's
engine have it) or one turn at a time (:class:`TurnEngine`: what the multi-turn controller awaits; AsyncEngine,
every rollout backend and adapters over other servers have it)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from ..drafting.request_kind import RequestKind
from .params import RequestOutput, SamplingParams


class SteppingEngine(Protocol):
    """What AsyncEngine calls on its thread: requests in, one step at a time, finished turns out."""

    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        prompt_key: Hashable | None = None,
        kind: RequestKind = RequestKind.ROLLOUT,
    ) -> str:
        """Start one turn (a later turn of a request passes the whole token list so far); ValueError on bad input."""

    def step(self) -> list[RequestOutput]:
        """One step; the turns it finished."""

    def release(self, request_id: str) -> None:
        """Forget a request (aborts its turn if one is running)."""

    def has_work(self) -> bool:
        """Whether a step would do anything now."""

    def idle_capacity(self) -> int:
        """Batch slots no running or queued request needs now."""


class TurnEngine(Protocol):
    """What the multi-turn controller needs from a generation backend: :class:`~.async_engine.AsyncEngine`,
    a rollout backend, or an adapter over another server (e.g. verl's ``server_manager``)."""

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        prompt_key: Hashable | None = None,
    ) -> RequestOutput:
        """One turn; a failure of this request comes back as finish_reason "error", never as a raise."""

    def release(self, request_id: str) -> None:
        """The request is over: free what the engine holds for it."""

    def idle_capacity(self) -> int:
        """Batch slots no running or queued request needs now."""
