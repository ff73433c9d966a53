"""The rollout-backend seam: what the multi-turn controller and the trainer ask of a generation backend.

Token ids go in; token ids, each sampled token's log-probability and why the turn stopped come out
(:class:`~srt_agent.engine.RequestOutput`). A later turn of the same request passes the whole token list
so far, tool output included, as ids (forced tokens, never re-tokenized text). Between RL steps the
trainer loads new weights in place (`update_weights`) and closes the step (`end_step`); the drafter's
trees survive both and can be saved and restored. Features only some backends have (run-ahead, the
forward-cost table) are `None` / empty where absent.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ..cache import RolloutCache
    from ..engine import RequestOutput, SamplingParams
    from ..engine.run_ahead import WindowPrompt


class RunAheadControl(Protocol):
    """Run-ahead windows of a backend that fills idle capacity (our engine only)."""

    def open(self, prompts: Sequence[WindowPrompt], phase: str) -> None: ...

    def close(self) -> list[tuple]:
        """Close the window; (prompt key, context, tokens) of every continuation it wrote into the trees."""

    def stats(self) -> dict: ...


@runtime_checkable
class RolloutBackend(Protocol):
    """A generation backend for rollouts and training (see the module docstring)."""

    name: str  # "engine" or "vllm"
    drafter_name: str
    run_ahead: RunAheadControl | None

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        prompt_key: Hashable | None = None,
    ) -> RequestOutput:
        """One turn; a failure of this request comes back as finish_reason "error", never as a raise."""

    def release(self, request_id: str) -> None:
        """The request is over: free what the backend holds for it."""

    def idle_capacity(self) -> int:
        """Batch slots no running or queued request needs now."""

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (names of the Hugging Face state dict) in place; the trees survive."""

    def end_step(self) -> None:
        """A policy step ended (a policy-version boundary for the drafter)."""

    def stats(self) -> dict:
        """Totals over the backend's lifetime (tokens, forwards, draft figures, and what else it counts)."""

    def trees(self) -> RolloutCache | None:
        """The drafter's per-prompt trees, to save with a checkpoint; None when it keeps none."""

    def restore_trees(self, cache: RolloutCache) -> None:
        """Put saved trees back (on resume); ValueError when the drafter keeps none."""

    def step_costs(self) -> tuple[dict, dict]:
        """The forward-cost table and the batch/draft settings a replay needs ({} where the backend has none)."""

    def describe(self) -> str:
        """One line: what runs where (for logs)."""

    def close(self) -> None: ...
