"""What crosses verl's token-in/token-out boundary: sampling-param dicts and `TokenOutput`, to and from the
engine's `SamplingParams` and `RequestOutput`.

verl's agent loops call ``server_manager.generate(request_id, prompt_ids=..., sampling_params={...})``; the
dict carries vLLM's names (``temperature``, ``top_p``, ``top_k`` with -1 = off, ``max_tokens`` or
``max_new_tokens``, ``logprobs`` as a flag, ``repetition_penalty``, ``stop``, ``stop_token_ids``,
``include_stop_str_in_output``, ``ignore_eos``, ``seed``) and comes back as a ``TokenOutput``.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.replica import TokenOutput

from ...engine import RequestOutput, SamplingParams
from ...engine.params import RequestMetrics

# Keys of verl's sampling dict the engine understands; anything else is an error, not silently dropped.
_PASSED = ("temperature", "top_p", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "seed")
_IGNORED = ("logprobs", "n", "detokenize", "skip_special_tokens", "spaces_between_special_tokens")
METRIC_PREFIX = "srt_"


def to_verl_sampling(params: SamplingParams) -> dict[str, Any]:
    """The dict verl's servers take for `params` (vLLM's names; log-probs always requested)."""
    out: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_tokens,
        "logprobs": True,
        "repetition_penalty": 1.0,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "include_stop_str_in_output": params.include_stop_str_in_output,
    }
    if params.ignore_eos:
        out["ignore_eos"] = True
    if params.seed is not None:
        out["seed"] = params.seed
    return out


def from_verl_sampling(sampling: dict[str, Any], default_max_tokens: int) -> SamplingParams:
    """The engine's SamplingParams for a verl sampling dict; ValueError names what the engine cannot honour."""
    sampling = dict(sampling)
    max_tokens = sampling.pop("max_tokens", sampling.pop("max_new_tokens", default_max_tokens))
    top_k = sampling.pop("top_k", 0)
    penalty = sampling.pop("repetition_penalty", 1.0)
    if penalty not in (None, 1.0):
        raise ValueError(f"repetition_penalty={penalty} is not supported by the srt engine (it must stay 1.0)")
    kwargs = {k: sampling.pop(k) for k in _PASSED if sampling.get(k) is not None}
    for key in _IGNORED:
        sampling.pop(key, None)
    if sampling:
        raise ValueError(f"sampling parameters the srt engine does not support: {sorted(sampling)}")
    return SamplingParams(max_tokens=int(max_tokens), top_k=max(int(top_k or 0), 0), **kwargs)


def to_token_output(out: RequestOutput, global_steps: int | None = None) -> TokenOutput:
    """A TokenOutput for an engine output; finish details and draft statistics go in ``extra_fields``."""
    extra: dict[str, Any] = {"global_steps": global_steps, "finish_reason": out.finish_reason}
    extra.update({METRIC_PREFIX + k: v for k, v in out.metrics.as_dict().items()})
    if out.error:
        extra["error"] = out.error
    stop_reason = "aborted" if out.finish_reason == "error" else "completed"
    return TokenOutput(
        token_ids=list(out.token_ids), log_probs=list(out.logprobs), stop_reason=stop_reason, extra_fields=extra
    )


def from_token_output(request_id: str, out: TokenOutput) -> RequestOutput:
    """The engine-style output of a verl TokenOutput (from any backend: srt, vLLM, SGLang)."""
    extra = out.extra_fields or {}
    fields = RequestMetrics.__dataclass_fields__
    metrics = RequestMetrics(**{k: extra[METRIC_PREFIX + k] for k in fields if METRIC_PREFIX + k in extra})
    if not any(METRIC_PREFIX + k in extra for k in fields):
        metrics.tokens = len(out.token_ids)
    error = extra.get("error")
    if error is None and out.stop_reason in ("aborted", "abort"):
        error = "the server aborted the request"
    logprobs = list(out.log_probs) if out.log_probs is not None else [0.0] * len(out.token_ids)
    if len(logprobs) != len(out.token_ids):
        error = error or f"{len(out.token_ids)} tokens but {len(logprobs)} log-probs"
    finish = "error" if error else extra.get("finish_reason", "stop")
    return RequestOutput(request_id, list(out.token_ids), logprobs, finish, error=error, metrics=metrics)
