"""How vLLM is told to speculate: our drafter names with a vLLM counterpart (:data:`DRAFTERS`) and vLLM's
``speculative_config`` for each (:func:`speculative_config`)."""

from __future__ import annotations

from typing import Any

from .settings import set_proposer_options

#: our drafters vLLM runs: ``none`` (no speculation), ``srt`` (SRT's proposer as vLLM's ``custom_class``),
#: ``ngram`` and ``suffix`` (vLLM's own ngram and arctic-inference suffix proposers)
DRAFTERS = ("none", "srt", "ngram", "suffix")
PROPOSER_CLASS = "srt_agent.backends.vllm.proposer.SRTProposer"


def drafter_problem(drafter: str) -> str | None:
    """Why vLLM cannot run `drafter` (it has no counterpart of it), or None when it can."""
    if drafter in DRAFTERS:
        return None
    return f"drafter {drafter!r} has no vLLM counterpart; the vLLM backend runs {', '.join(DRAFTERS)}"


def check_drafter(drafter: str) -> None:
    """Raise ValueError unless vLLM has a counterpart of `drafter`."""
    problem = drafter_problem(drafter)
    if problem:
        raise ValueError(problem)


def speculative_config(method: str, num_speculative_tokens: int = 8, **options: Any) -> dict | None:
    """vLLM's ``speculative_config`` for `method`; `options` go to the method (ngram: ``prompt_lookup_min``/
    ``max``; suffix: ``suffix_decoding_*``; srt: ``ProposerOptions`` fields)."""
    if method == "none":
        return None
    if method not in DRAFTERS:
        raise ValueError(f"unknown speculative method {method!r}; choose one of {DRAFTERS}")
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": int(num_speculative_tokens)}
    if method == "ngram":
        config.update({"prompt_lookup_min": 2, "prompt_lookup_max": 4, **options})
    elif method == "suffix":
        config.update(options)
    else:
        set_proposer_options(options)  # bad options fail here, not in vLLM's worker
        config.update({"method": "custom_class", "model": PROPOSER_CLASS})
    return config
