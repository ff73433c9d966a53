"""vLLM's ``speculative_config`` for a drafter of the registry that vLLM runs (:func:`configure_speculation`)."""

from __future__ import annotations

from typing import Any

from ...drafting.registry import DRAFTERS, drafter_capabilities, runs_as_proposer, vllm_drafters, vllm_problem
from .settings import set_proposer_options

PROPOSER_CLASS = "srt_agent.backends.vllm.proposer.SRTProposer"


def check_drafter(drafter: str) -> None:
    """Raise ValueError unless vLLM runs `drafter`."""
    problem = vllm_problem(drafter)
    if problem:
        raise ValueError(problem)


def run_ahead_problem(drafter: str) -> str | None:
    """Why vLLM cannot run ahead with `drafter` (run-ahead fills the trees of srt-agent's proposer), or None."""
    if runs_as_proposer(drafter) and drafter_capabilities(drafter).run_ahead:
        return None
    return f"run-ahead needs a drafter that keeps per-prompt trees and takes run-ahead sequences (srt); {drafter!r} does not"


def configure_speculation(drafter: str, num_speculative_tokens: int = 8, **options: Any) -> dict | None:
    """vLLM's ``speculative_config`` for `drafter`; `options` go to its method (ngram: ``prompt_lookup_min``/
    ``max``; suffix: ``suffix_decoding_*``; srt: ``ProposerOptions`` fields, which this checks and sets in
    ``SRT_VLLM_PROPOSER`` for the proposers of vLLM engines started from now on: vLLM's config has no place
    for them)."""
    if drafter not in vllm_drafters():
        raise ValueError(f"unknown speculative method {drafter!r}; choose one of {vllm_drafters()}")
    method = DRAFTERS[drafter].vllm_method
    if method == "none":
        return None
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": int(num_speculative_tokens)}
    if method == "ngram":
        config.update({"prompt_lookup_min": 2, "prompt_lookup_max": 4, **options})
    elif method == "suffix":
        config.update(options)
    else:
        set_proposer_options({"drafter": drafter, **options})  # bad options fail here, not in vLLM's worker
        config["model"] = PROPOSER_CLASS
    return config
