"""Exact sampling inside vLLM: the token at each position is our engine's sample, with or without drafts.

vLLM samples with a per-request generator whose noise is spent step by step, and its rejection sampler
spends noise differently again when it verifies drafts; so at T > 0 the same seeded request samples other
tokens with speculation than without (equal in distribution only), and other tokens than our engine.
With exact sampling, ``GPUModelRunner._sample`` (CPUModelRunner inherits it) samples every logits row as
our engine does (:mod:`srt_agent.engine.sampler`): the token at absolute position ``p`` of a request with
seed ``s`` is ``argmax(filtered logits / T + Gumbel noise keyed by (s, p))``. A verified draft token is
kept exactly when it equals the token sampled at its position, and the first token that differs (or the
bonus token after a fully accepted draft) is emitted in its place. So a seeded request's tokens do not
depend on what was drafted, nor on the batch it ran in, and they equal our engine's on the same weights
(up to float32 near-ties between the two engines' logits). The returned log-probability is
``log_softmax(logits / T)`` of the sampled token, before top-k/top-p filtering, as in our engine and the
trainer.

Switched on per engine by ``SRT_VLLM_EXACT_SAMPLING=1`` in the environment when the engine's model runner
is built (:class:`srt_agent.backends.vllm.VLLMEngine` does that unless ``engine.vllm.exact_sampling`` is
off), with vLLM's async scheduling off (a step's positions must be known when it samples). Requests that
use what this sampler does not implement (penalties, bad words, logit bias, min-p, min-tokens, allowed
token ids) are refused at ``add_request`` by the backend; the runner checks again and fails that step
loudly rather than sample differently.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch

from ...engine.sampler import RowSampling, perturbed_logits

EXACT_ENV = "SRT_VLLM_EXACT_SAMPLING"
PLACEHOLDER = -1  # vLLM's rejected-token marker in a spec step's output rows


def exact_sampling_requested() -> bool:
    return os.environ.get(EXACT_ENV, "0") == "1"


def check_exact_seam() -> None:
    """Raise unless this vLLM samples through ``GPUModelRunner._sample(logits, spec_decode_metadata)`` and the
    plugin has wrapped it (a vLLM upgrade that moves the seam must fail loudly, not sample another way)."""
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sample = GPUModelRunner._sample
    if not getattr(sample, "srt_exact", False):
        raise RuntimeError("srt_agent's vLLM plugin is not loaded (entry point vllm.general_plugins): exact sampling "
                           "is not installed; reinstall srt-agent, and do not exclude it with VLLM_PLUGINS")
    params = list(inspect.signature(inspect.unwrap(sample)).parameters)
    if params != ["self", "logits", "spec_decode_metadata"]:
        raise RuntimeError(f"vLLM's GPUModelRunner._sample takes {params}: exact sampling does not support this vLLM")


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
    """SamplerOutput of one step: every logits row sampled at its request's position (see module docstring)."""
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.sampler import Sampler

    metadata = runner.input_batch.sampling_metadata
    problem = unsupported(metadata)
    if problem is not None:
        raise ValueError(f"exact sampling does not implement {problem}; turn engine.vllm.exact_sampling off to use them")
    batch = runner.input_batch
    num_reqs = batch.num_reqs
    drafts = [0] * num_reqs if spec is None else list(spec.num_draft_tokens)
    if spec is None:
        rows = list(range(num_reqs))  # logits row of (request i, j-th sampled token)
        row_of = [[i] for i in range(num_reqs)]
    else:
        targets = spec.target_logits_indices.tolist()
        bonus = spec.bonus_logits_indices.tolist()
        row_of, start = [], 0
        for i, k in enumerate(drafts):
            row_of.append(targets[start : start + k] + [bonus[i]])
            start += k
        rows = sorted(r for rs in row_of for r in rs)
    specs: dict[int, RowSampling] = {}
    for i in range(num_reqs):
        temperature, top_p, top_k, seed = request_sampling(runner, i)
        first = int(batch.num_tokens_no_spec[i])  # the position of the request's first sampled token
        for j, r in enumerate(row_of[i]):
            specs[r] = RowSampling(temperature, top_p, top_k, seed, first + j)
    chosen = logits[rows].to(torch.float32)
    scaled, perturbed = perturbed_logits(chosen, [specs[r] for r in rows])
    sampled = torch.argmax(perturbed, dim=-1)
    logprobs = scaled.log_softmax(dim=-1)
    at = {r: n for n, r in enumerate(rows)}  # logits row -> index in `chosen`
    width = 1 + (max(drafts) if spec is not None else 0)
    tokens = torch.full((num_reqs, width), PLACEHOLDER, dtype=torch.int64)
    source = torch.zeros((num_reqs, width), dtype=torch.int64)  # index in `chosen` of each output slot
    sampled_list = sampled.tolist()
    draft_ids = spec.draft_token_ids.tolist() if spec is not None else []
    offset = 0
    for i in range(num_reqs):
        for j, r in enumerate(row_of[i]):
            token = sampled_list[at[r]]
            tokens[i, j], source[i, j] = token, at[r]
            if j < drafts[i] and token != draft_ids[offset + j]:
                break  # the draft token at j is rejected; the token sampled there stands in for it
        offset += drafts[i]
    device = logits.device
    logprob_tensors = None
    if metadata.max_num_logprobs is not None:
        flat = tokens.flatten().clamp(min=0).to(device)
        picked = logprobs[source.flatten().to(device)]
        logprob_tensors = Sampler.gather_logprobs(picked, metadata.max_num_logprobs, flat)
    return SamplerOutput(sampled_token_ids=tokens.to(torch.int32).to(device), logprobs_tensors=logprob_tensors)
