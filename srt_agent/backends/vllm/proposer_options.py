"""The SRT proposer's knobs inside vLLM (:class:`ProposerOptions`): JSON in ``SRT_VLLM_PROPOSER``
(:mod:`.settings`), ``engine.vllm.proposer`` in an env YAML, which the config checks against them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class ProposerOptions:
    """The SRT proposer's knobs (JSON in ``SRT_VLLM_PROPOSER``; ``engine.vllm.proposer`` in an env YAML)."""

    drafter: str = "srt"  # the registry's drafter the proposer runs (SRT, or one built like it)
    max_depth: int = 64  # tree depth (RolloutCache)
    max_match: int = 32  # context tokens matched against the tree
    max_bytes: int = 1 << 30  # trees, held turns (an eighth at most) and the global tree; LRU past it
    global_bytes: int | None = None  # the global tree's part of max_bytes (None: a 32nd)
    max_nodes_per_prompt: int = 1 << 21
    max_held: int = 4096  # finished turns kept open for their trajectory's next turn
    held_ttl_s: float = 900.0  # a held turn not continued within this long is released
    min_prob: float = 0.0  # draft nodes below this path frequency are not proposed
    whole_prompt: bool = True  # a prompt's first rollout leads its tree with the whole prompt (drafts copy from it)
    global_fallback: bool = True  # draft from a global tree of recent responses where it expects more
    policy: str = "cost"  # "cost": draft what pays at this batch size; "always": up to num_speculative_tokens
    # what "pays" means to the cost policy: "makespan", the slowest row's expected gain (a step ends with its last
    # row); "throughput", the batch's expected tokens per second (what vLLM's own drafters chase)
    objective: str = "makespan"
    step_fixed_ms: float = 30.0  # cost model of a decode step (2-core AVX-512 CPU, SmolLM2): fixed part,
    step_row_ms: float = 2.8  # per sequence in the batch,
    draft_token_ms: float = 2.4  # per drafted token verified
    calibrate: bool = True  # learn each step shape's cost from vLLM's measured steps (the above is the prior)
    trees: str | None = None  # a saved cache to start from
    save_path: str | None = None  # save the trees here (atomically) when the batch drains; {dp_rank} allowed
    save_interval_s: float = 300.0  # at most this often
    max_fault_share: float = 0.1  # past this share of decoding rows failing (and 8 faults), drafting fails loudly

    def __post_init__(self) -> None:
        if self.policy not in ("cost", "always"):
            raise ValueError(f"policy must be 'cost' or 'always', got {self.policy!r}")
        if self.objective not in ("makespan", "throughput"):
            raise ValueError(f"objective must be 'makespan' or 'throughput', got {self.objective!r}")
        if min(self.step_fixed_ms, self.step_row_ms, self.draft_token_ms) < 0:
            raise ValueError("the cost model's terms must be >= 0")
        if self.max_held < 0:
            raise ValueError(f"max_held must be >= 0, got {self.max_held}")
        if self.max_bytes <= 0 or self.held_ttl_s <= 0 or self.save_interval_s < 0:
            raise ValueError("max_bytes and held_ttl_s must be positive, save_interval_s >= 0")
        if not 0 <= self.max_fault_share <= 1:
            raise ValueError(f"max_fault_share must lie in [0, 1], got {self.max_fault_share}")

    @classmethod
    def checked(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`options` if they make valid ProposerOptions (ValueError naming the unknown keys otherwise)."""
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(
                f"unknown SRT proposer option(s) {unknown}; known: {[f.name for f in dataclasses.fields(cls)]}"
            )
        cls(**options)
        return options
