"""Exact sampling inside vLLM: the token at each position is our engine's sample, with or without drafts.

vLLM samples with a per-request generator whose noise is spent step by step, and its rejection sampler
spends noise differently again when it verifies drafts; so at T > 0 the same seeded request samples other
tokens with speculation than without (equal in distribution only), and other tokens than our engine.
With exact sampling, ``GPUModelRunner._sample`` (CPUModelRunner inherits it) samples every logits row as
our engine does (:mod:`srt_agent.runner.sampler`): the token at absolute position ``p`` of a request with
seed ``s`` is ``argmax(filtered logits / T + Gumbel noise keyed by (s, p))``. A verified draft token is
kept exactly when it equals the token sampled at its position, and the first token that differs (or the
bonus token after a fully accepted draft) is emitted in its place. So a seeded request's tokens do not
depend on what was drafted; they depend on the batch it ran in, and differ from our engine's on the same
weights, only where vLLM's logits do: at near-ties that float error flips (`rl/identity.py` proves them
near-ties, or names a fault). The returned log-probability is
``log_softmax(logits / T)`` of the sampled token, before top-k/top-p filtering, as in our engine and the
trainer.

Switched on per engine by ``SRT_VLLM_EXACT_SAMPLING=1`` in the environment when the engine's model runner
is built (:class:`srt_agent.backends.vllm.vllm_engine.VLLMEngine` does that unless ``engine.vllm.exact_sampling`` is
off), with vLLM's async scheduling off (a step's positions must be known when it samples). Requests that
use what this sampler does not implement (penalties, bad words, logit bias, min-p, min-tokens, allowed
token ids) are refused at ``add_request`` by the backend; the runner checks again and fails that step
loudly rather than sample differently.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ...runner.sampler import RowSampling, sample_rows

PLACEHOLDER = -1  # vLLM's rejected-token marker in a spec step's output rows

#: why a vLLM run's trajectories differ between drafters at T > 0 without exact sampling (the report says it)
VLLM_IDENTICAL_NOTE = (
    "vLLM's own rejection sampler (engine.vllm.exact_sampling: false) spends the seeded noise differently when it "
    "verifies drafts, so at temperature > 0 drafters agree in distribution, not token for token (at temperature 0 "
    "they are identical)"
)


def unseeded_seed(request_id: str) -> int:
    """The seed of a request that has none: fixed by its vLLM request id (unique per request)."""
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little") >> 1


def request_sampling(runner: Any, row: int) -> tuple[float, float, int, int]:
    """(temperature, top_p, top_k, seed) of the request in input-batch row `row`."""
    req_id = runner.input_batch.req_ids[row]
    params = runner.requests[req_id].sampling_params
    seed = params.seed if params.seed is not None else unseeded_seed(req_id)
    top_k = params.top_k if params.top_k and params.top_k > 0 else 0
    return float(params.temperature), float(params.top_p), int(top_k), int(seed)


def unsupported(metadata: Any) -> str | None:
    """What in a batch's SamplingMetadata exact sampling does not implement, or None."""
    if not metadata.no_penalties:
        return "repetition/frequency/presence penalties"
    if metadata.bad_words_token_ids:
        return "bad words"
    if metadata.allowed_token_ids_mask is not None:
        return "allowed token ids"
    if metadata.logprob_token_ids:
        return "logprobs of chosen token ids"
    procs = metadata.logitsprocs
    active = [p for p in (*procs.argmax_invariant, *procs.non_argmax_invariant) if _is_active(p)]
    if active:
        return "logits processors " + ", ".join(type(p).__name__ for p in active)
    return None


def _is_active(processor: Any) -> bool:
    """Whether a logits processor has a request to act on: vLLM's built-in min-p, logit bias and min-tokens
    processors say so by their state; any other processor counts as active."""
    for name in ("min_p_count", "biases", "min_toks"):
        value = getattr(processor, name, None)
        if value is not None:
            return bool(value)
    return True


def exact_sample(runner: Any, logits: torch.Tensor, spec: Any) -> Any:
    """SamplerOutput of one step: every request's rows sampled at their positions (see the module
    docstring). Draft rows are sampled depth by depth, each depth only for the requests whose drafts were
    accepted so far: rows past a rejection are never sampled."""
    from vllm.v1.outputs import SamplerOutput

    metadata = runner.input_batch.sampling_metadata
    problem = unsupported(metadata)
    if problem is not None:
        raise ValueError(
            f"exact sampling does not implement {problem}; turn engine.vllm.exact_sampling off to use them"
        )
    batch = runner.input_batch
    num_reqs = batch.num_reqs
    if spec is None:
        rows_of = [[i] for i in range(num_reqs)]  # the logits rows of each request, in position order
        drafts: list[list[int]] = [[] for _ in range(num_reqs)]
    else:
        targets, bonus, ids = (
            spec.target_logits_indices.tolist(),
            spec.bonus_logits_indices.tolist(),
            spec.draft_token_ids.tolist(),
        )
        rows_of, drafts, start = [], [], 0
        for i, k in enumerate(spec.num_draft_tokens):
            rows_of.append(targets[start : start + k] + [bonus[i]])
            drafts.append(ids[start : start + k])
            start += k
    sampling = [request_sampling(runner, i) for i in range(num_reqs)]
    first = [int(batch.num_tokens_no_spec[i]) for i in range(num_reqs)]  # each request's next position
    width = max(len(r) for r in rows_of)
    tokens = torch.full((num_reqs, width), PLACEHOLDER, dtype=torch.int64)
    emitted: list[tuple[int, int, int]] = []  # (request, depth, logits row)
    alive = list(range(num_reqs))
    for depth in range(width):
        wave = [i for i in alive if depth < len(rows_of[i])]
        if not wave:
            break
        rows = [rows_of[i][depth] for i in wave]
        specs = [RowSampling(*sampling[i][:3], sampling[i][3], first[i] + depth) for i in wave]
        sampled, _ = sample_rows(logits[rows], specs)
        alive = []
        for i, row, token in zip(wave, rows, sampled):
            tokens[i, depth] = token
            emitted.append((i, depth, row))
            if depth < len(drafts[i]) and token == drafts[i][depth]:
                alive.append(i)  # the draft token stands: the next depth is verified too
    device = logits.device
    logprob_tensors = None
    if metadata.max_num_logprobs is not None:
        logprob_tensors = _emitted_logprobs(logits, emitted, tokens, sampling, metadata.max_num_logprobs)
    return SamplerOutput(sampled_token_ids=tokens.to(torch.int32).to(device), logprobs_tensors=logprob_tensors)


def _emitted_logprobs(
    logits: torch.Tensor,
    emitted: list[tuple[int, int, int]],
    tokens: torch.Tensor,
    sampling: list[tuple[float, float, int, int]],
    num_logprobs: int,
) -> Any:
    """vLLM's LogprobsTensors for a step: one row per output slot (request × depth; the placeholders' rows
    are dropped by vLLM), each emitted token's log_softmax(logits / T) and the top `num_logprobs`."""
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample.sampler import Sampler

    device, width = logits.device, tokens.shape[1]
    slots = torch.tensor([i * width + depth for i, depth, _ in emitted], dtype=torch.int64)
    rows = torch.tensor([row for _, _, row in emitted], dtype=torch.int64, device=device)
    temperatures = torch.tensor([sampling[i][0] or 1.0 for i, _, _ in emitted], dtype=torch.float32, device=device)
    logprobs = (logits[rows].to(torch.float32) / temperatures.unsqueeze(1)).log_softmax(dim=-1)
    part = Sampler.gather_logprobs(logprobs, num_logprobs, tokens.flatten()[slots].to(device))
    slots = slots.to(device)
    size = tokens.numel()
    ids = torch.zeros((size, num_logprobs + 1), dtype=part.logprob_token_ids.dtype, device=device)
    values = torch.zeros((size, num_logprobs + 1), dtype=part.logprobs.dtype, device=device)
    ranks = torch.zeros(size, dtype=part.selected_token_ranks.dtype, device=device)
    ids[slots], values[slots], ranks[slots] = part.logprob_token_ids, part.logprobs, part.selected_token_ranks
    return LogprobsTensors(ids, values, ranks)
