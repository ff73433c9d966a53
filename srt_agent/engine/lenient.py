"""SPEC-RL's lenient acceptance: a reused token stays if the current policy finds it likely enough.

A draft token ``t`` sampled earlier by an old policy (log-probability ``old``) is accepted with
probability ``min(1, lenience · p_new(t) / p_old(t))``; at the first rejection the position gets the
current policy's own sample (from its full distribution) and reuse ends there. With ``lenience > 1`` a
token the current policy would rarely draw can survive, so the rollout is not exactly on-policy: the
engine counts every accepted token that differs from the token its exact sampler draws at that position.
The uniform draw is keyed by (seed, position), like the exact sampler's noise, so runs repeat.
"""

from __future__ import annotations

import math
import random

import torch

from ..runner.sampler import position_key, upload

_UNIFORM_SALT = 0x5EC_0001  # keeps the acceptance draws apart from the sampler's Gumbel noise


def acceptance_uniform(seed: int, position: int) -> float:
    """The uniform in (0, 1] that decides a lenient acceptance at `position` of a request seeded `seed`."""
    return 1.0 - random.Random(position_key(seed ^ _UNIFORM_SALT, position)).random()


def lenient_accept(new_logprob: float, old_logprob: float, lenience: float, u: float) -> bool:
    """Whether a reused token survives: ``u <= min(1, lenience · exp(new_logprob - old_logprob))``."""
    if lenience <= 0:
        raise ValueError(f"lenience must be > 0, got {lenience}")
    return math.log(u) <= math.log(lenience) + new_logprob - old_logprob


def target_logprobs(logits: torch.Tensor, temperatures: list[float], tokens: list[int]) -> torch.Tensor:
    """log softmax(logits / temperature)[token] per row, left on the logits' device: the current policy's
    log-probabilities of `tokens` (before top-k / top-p, like the log-probabilities the sampler reports)."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32  # as the sampler computes it
    rows = [[t or 1.0, k] for t, k in zip(temperatures, tokens)]
    table = upload(torch.tensor(rows, dtype=torch.float64), logits.device)
    scaled = logits.to(dtype) / table[:, :1].to(dtype)
    return scaled.gather(1, table[:, 1:].long()).squeeze(1) - torch.logsumexp(scaled, dim=-1)
