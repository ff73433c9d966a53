"""vLLM's ``speculative_config`` for a drafter of the registry that vLLM runs (:func:`speculative_config`)."""

from __future__ import annotations

from typing import Any

from ...drafting.registry import DRAFTERS, VLLM_DRAFTERS, vllm_problem
from .settings import set_proposer_options

PROPOSER_CLASS = "srt_agent.backends.vllm.proposer.SRTProposer"


def check_drafter(drafter: str) -> None:
    """Raise ValueError unless vLLM runs `drafter`."""
    problem = vllm_problem(drafter)
    if problem:
        raise ValueError(problem)


def speculative_config(drafter: str, num_speculative_tokens: int = 8, **options: Any) -> dict | None:
    """vLLM's ``speculative_config`` for `drafter`; `options` go to its method (ngram: ``prompt_lookup_min``/
    ``max``; suffix: ``suffix_decoding_*``; srt: ``ProposerOptions`` fields)."""
    if drafter not in VLLM_DRAFTERS:
        raise ValueError(f"unknown speculative method {drafter!r}; choose one of {VLLM_DRAFTERS}")
    method = DRAFTERS[drafter].vllm_method
    if method == "none":
        return None
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": int(num_speculative_tokens)}
    if method == "ngram":
        config.update({"prompt_lookup_min": 2, "prompt_lookup_max": 4, **options})
    elif method == "suffix":
        config.update(options)
    else:
        set_proposer_options(options)  # bad options fail here, not in vLLM's worker
        config["model"] = PROPOSER_CLASS
    return config
