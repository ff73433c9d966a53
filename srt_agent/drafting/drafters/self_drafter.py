"""`SelfDrafter` (``self``): drafts with a weight-quantized copy of the current policy.

Self-speculative decoding as in EfficientRollout: the copy (`runner/quantize.py`) follows the policy through
every RL step without training a drafter and proposes tokens where no history exists. It runs on its own
`ModelRunner` and KV cache and samples each drafted position with the verifier's own Gumbel noise and
sampling options, so a draft token differs from the policy's sample only where quantization flips the
argmax, and verification, untouched, keeps the output exactly plain decoding's. Scores, tree width and the
cache slots: docs/engine.md, "Drafting with the policy itself".
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

import torch

from ...runner.device_info import detect_device
from ...runner.model_runner import Chunk, ModelRunner
from ...runner.quantize import SCHEMES, check_scheme, default_scheme, quantized_copy
from ...runner.sampler import RowSampling, perturbed_logits
from ..choice.cost_model import ForwardCostModel
from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..tokens import check_budget, check_tokens
from .model_drafting import DraftRequest

GREEDY = RowSampling(temperature=0.0, top_p=1.0, top_k=0, seed=0, position=0)


@dataclass
class _DraftState:
    """What the draft cache holds for one request: KV of ``tokens[:cached]`` in ``slot``."""

    tokens: list[int] = field(default_factory=list)
    slot: int | None = None
    cached: int = 0
    last_used: int = 0


class SelfDrafter:
    """Drafts chains (or narrow trees) with a quantized copy of the policy; see the module docstring.

    `quantization`: ``auto`` (int8 on CPU; fp8 or int4 on CUDA), ``int8``, ``int4`` or ``fp8``.
    """

    name = "self"
    capabilities = DrafterCapabilities(model=True)

    def __init__(self, quantization: str = "auto", tree_width: int = 1) -> None:
        if quantization != "auto" and quantization not in SCHEMES:
            raise ValueError(f"unknown quantization {quantization!r}; choose auto or one of {', '.join(SCHEMES)}")
        if not isinstance(tree_width, int) or tree_width < 1:
            raise ValueError(f"tree_width must be an int >= 1, got {tree_width!r}")
        self.quantization = quantization
        self.tree_width = tree_width
        self.policy: torch.nn.Module | None = None
        self.runner: ModelRunner | None = None
        self.scheme: str | None = None
        self.pass_cost = ForwardCostModel(fixed_s=0.02, per_token_s=0.001)
        self.build_s = 0.0  # seconds the last (re)quantization took
        self.passes = 0
        self._states: dict[Hashable, _DraftState] = {}
        self._clock = 0

    # ----- binding to the policy ------------------------------------------------------------------

    def attach(
        self, model: torch.nn.Module, device: torch.device, max_batch: int, max_context: int, calibrate: bool = True
    ) -> None:
        """Bind to the policy `model` (whose weights `rebuild` follows) and quantize a copy of it, with
        `max_batch` slots in its own KV cache."""
        self.scheme = default_scheme(detect_device(device)) if self.quantization == "auto" else self.quantization
        check_scheme(self.scheme, device)
        self.policy, self.device, self.max_batch, self.max_context = model, device, max_batch, max_context
        self.rebuild()
        if calibrate:
            self.calibrate()

    def rebuild(self) -> float:
        """Quantize a fresh copy of the policy (after its weights changed; the draft cache is dropped);
        returns the seconds it took."""
        if self.policy is None:
            raise ValueError("the self drafter has no model: an Engine attaches the policy to it")
        t0 = time.perf_counter()
        self.runner = ModelRunner(
            quantized_copy(self.policy, self.scheme), self.max_batch, self.max_context, 1, self.device
        )
        for state in self._states.values():
            state.slot, state.cached = None, 0
        self.build_s = time.perf_counter() - t0
        return self.build_s

    def calibrate(self) -> None:
        """Seed the pass-time model: one and all slots feeding one token, one slot feeding 16."""
        runner = self._runner()
        n = runner.num_slots
        shapes = [(1, 1), (1, 16)] + ([(n, 1)] if n > 1 else [])
        self._timed_pass([Chunk(0, 0, [0], 1)])  # warm-up
        samples = []
        for sequences, tokens in shapes:
            chunks = [Chunk(slot, 0, [0] * tokens, tokens) for slot in range(sequences)]
            best = min(self._timed_pass(chunks) for _ in range(2))
            samples.append((sequences * tokens, best, sequences))
        self.pass_cost.calibrate(samples)

    def _timed_pass(self, chunks: list[Chunk]) -> float:
        t0 = time.perf_counter()
        self._pass(chunks, [GREEDY] * len(chunks))
        return time.perf_counter() - t0

    def _runner(self) -> ModelRunner:
        if self.runner is None:
            raise ValueError("the self drafter has no model: an Engine attaches the policy to it")
        return self.runner

    # ----- the Drafter protocol -------------------------------------------------------------------

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        if request_id in self._states:
            raise ValueError(f"request {request_id!r} is already running")
        check_tokens(prompt_ids, "prompt_ids")
        self._states[request_id] = _DraftState()

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self._state(request_id)
        check_tokens(token_ids)

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        """Nothing without a model pass (the engine drafts through `draft_batch`)."""
        self._state(request_id)
        check_budget(budget)
        check_tokens(context, "context")
        return Draft()

    def stop_request(self, request_id: Hashable) -> None:
        self._state(request_id)
        del self._states[request_id]

    def end_step(self) -> None:
        """Nothing to do: the engine rebuilds the draft model when the policy's weights change."""

    def _state(self, request_id: Hashable) -> _DraftState:
        try:
            return self._states[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}: call start_request first") from None

    # ----- drafting -------------------------------------------------------------------------------

    def draft_seconds(self, requests: list[DraftRequest], depth: int) -> float:
        """Predicted seconds: a first pass feeding what each request's cache lacks, then depth - 1 one-token passes."""
        if not requests or depth < 1:
            return 0.0
        n = len(requests)
        first = sum(len(r.context) - self._reusable(r) for r in requests)
        return self.pass_cost.predict(first, n) + (depth - 1) * self.pass_cost.predict(n, n)

    def _reusable(self, request: DraftRequest) -> int:
        """How many of the request's tokens the draft cache already holds (at most all but the last)."""
        state = self._states.get(request.request_id)
        if state is None or state.slot is None:
            return 0
        context, n = list(request.context), min(state.cached, len(request.context) - 1)
        if state.tokens[:n] == context[:n]:  # the usual case, one list comparison
            return n
        low, high = 0, n  # the prefixes of length `low` agree, of length `high` do not
        while high - low > 1:
            mid = (low + high) // 2
            if state.tokens[:mid] == context[:mid]:
                low = mid
            else:
                high = mid
        return low

    def draft_batch(self, requests: list[DraftRequest], depth: int) -> list[Draft]:
        """Draft up to `depth` levels for every request together (one pass per level)."""
        self._runner()  # raises unless an engine attached the policy
        drafts = [Draft(source="model") for _ in requests]
        live = [i for i, r in enumerate(requests) if r.budget > 0 and self._take_slot(r, requests)]
        if not live or depth < 1:
            return drafts
        chains: dict[int, int] = {}  # request index → its last chain node
        chunks = []
        for i in live:
            r, state = requests[i], self._states[requests[i].request_id]
            start = self._reusable(r)
            state.tokens, state.cached = list(r.context), start
            chunks.append(Chunk(state.slot, start, list(r.context[start:]), len(r.context) - start))
        for level in range(depth):
            levels = self._pass(
                chunks, [replace(requests[i].sampling, position=len(requests[i].context) + level) for i in live]
            )
            self.passes += 1
            next_live, chunks = [], []
            for i, (ranked, margins) in zip(live, levels):
                r, d, state = requests[i], drafts[i], self._states[requests[i].request_id]
                state.cached = len(state.tokens)
                parent = chains.get(i, -1)
                top = d.scores[parent] if parent >= 0 else 1.0
                width = min(self.tree_width, r.budget - len(d))
                for rank in range(width):
                    d.token_ids.append(ranked[rank])
                    d.parents.append(parent)
                    d.scores.append(top * margins[rank])
                chains[i] = len(d) - width
                state.tokens.append(ranked[0])
                if len(d) < r.budget and level + 1 < depth:
                    next_live.append(i)
                    chunks.append(Chunk(state.slot, len(state.tokens) - 1, [ranked[0]], 1))
            live = next_live
            if not live:
                break
        return drafts

    def _take_slot(self, request: DraftRequest, batch: list[DraftRequest]) -> bool:
        """Give the request a cache slot (reclaiming the least recently used one outside `batch`)."""
        state = self._state(request.request_id)
        self._clock += 1
        state.last_used = self._clock
        if state.slot is not None:
            return True
        runner = self._runner()
        taken = {s.slot for s in self._states.values() if s.slot is not None}
        free = [slot for slot in range(runner.num_slots) if slot not in taken]
        if not free:
            busy = {r.request_id for r in batch}
            idle = [(s.last_used, rid) for rid, s in self._states.items() if s.slot is not None and rid not in busy]
            if not idle:
                return False
            victim = self._states[min(idle)[1]]
            free, victim.slot, victim.cached = [victim.slot], None, 0
        state.slot, state.cached = free[0], 0
        return True

    def _pass(self, chunks: list[Chunk], sampling: list[RowSampling]) -> list[tuple[list[int], list[float]]]:
        """One draft-model pass; per chunk, the `tree_width` best tokens of its last row under the
        request's perturbed logits (best first) and each one's conditional score."""
        runner = self._runner()
        t0 = time.perf_counter()
        hidden = runner.forward(chunks)
        ends, end = [], -1
        for c in chunks:
            end += len(c)
            ends.append(end)
        logits = runner.logits(hidden[ends]).to(
            self.policy.dtype if self.policy.dtype == torch.float64 else torch.float32
        )
        _, perturbed = perturbed_logits(logits, sampling)  # the verifier's noise (drawn in its dtype)
        k = min(self.tree_width + 1, perturbed.shape[1])
        values, tokens = torch.topk(perturbed, k, dim=-1)
        margins = (values[:, :1] - values[:, 1:]).clamp(min=0).nan_to_num(posinf=1e4)  # inf: the only token left
        primary = 1.0 - torch.exp(-margins[:, :1])
        siblings = torch.exp(-margins[:, : self.tree_width - 1])
        scores = torch.cat([primary, siblings], dim=1)
        out = list(zip(tokens[:, : self.tree_width].tolist(), scores.tolist()))
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        self.pass_cost.observe(sum(len(c) for c in chunks), time.perf_counter() - t0, len(chunks))
        return out
