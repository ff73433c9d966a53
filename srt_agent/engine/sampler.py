"""Lossless sampling keyed by (seed, position).

The token at absolute position ``p`` of a request with seed ``s`` is
``argmax(filtered_logits / temperature + G)`` where ``G`` is Gumbel noise drawn from a generator seeded
by a hash of ``(s, p)`` (the Gumbel-max trick: an exact sample from the softmax). The noise depends on
nothing else, so a position gets the same token whether it is reached by plain decoding or by
verifying a draft node: speculation accepts a drafted token exactly when it equals this sample, and
the emitted sequence is the one plain decoding emits. The noise is drawn on the CPU (float64 for float64
models, float32 otherwise), so it is the same on every device and in every batch. Greedy (temperature 0)
is a plain argmax. Filtering (top-k, then top-p) happens on the scaled logits; the returned
log-probability is log_softmax(logits / temperature) of the chosen token, before filtering.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK64 = (1 << 64) - 1


def position_key(seed: int, position: int) -> int:
    """A 63-bit generator seed mixing (seed, position) with splitmix64."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@dataclass(frozen=True)
class RowSampling:
    """How to sample one logits row: the request's options and the absolute position sampled."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    position: int


def filter_logits(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, candidates: int = 1024
) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p (nucleus) set to -inf; 0 / 1 disable the filters.

    Top-p applies after top-k: the nucleus is the smallest set of most likely tokens (among the top k)
    whose renormalized probability reaches ``top_p``. Only the `candidates` best tokens are sorted unless
    a row's filter reaches beyond them.
    """
    vocab = scaled.shape[-1]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(1)
    m = min(vocab, max(candidates, int(k[top_k > 0].max()) if bool((top_k > 0).any()) else 0))
    while True:
        values, order = torch.topk(scaled, m, dim=-1, sorted=True)
        ranks = torch.arange(m, device=scaled.device).unsqueeze(0)
        in_top_k = ranks < k
        # Probabilities renormalized over the top k (over the whole vocabulary when top_k is off).
        full_lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
        topk_lse = torch.logsumexp(values.masked_fill(~in_top_k, float("-inf")), dim=-1, keepdim=True)
        lse = torch.where(k < vocab, topk_lse, full_lse)
        probs = torch.exp(values - lse).masked_fill(~in_top_k, 0.0)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        covered = (k <= m).squeeze(1) | (mass_before[:, -1] + probs[:, -1] >= top_p)
        if m == vocab or bool(covered.all()):
            break
        m = vocab
    keep = in_top_k & (mass_before < top_p.unsqueeze(1))
    keep[:, 0] = True
    kept = values.masked_fill(~keep, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(1, order, kept)


def perturbed_logits(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[torch.Tensor, torch.Tensor]:
    """(scaled, perturbed): each row's logits over its temperature, and those filtered (top-k, top-p)
    plus the row's Gumbel noise; the sampled token is the perturbed row's argmax.

    Works in float64 for float64 models and in float32 otherwise.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    dev = logits.device
    temps = torch.tensor([r.temperature or 1.0 for r in rows], dtype=dtype, device=dev).unsqueeze(1)
    scaled = logits.to(dtype) / temps
    sampled = scaled
    if any(r.top_k > 0 or r.top_p < 1 for r in rows):
        top_k = torch.tensor([r.top_k for r in rows], device=dev)
        top_p = torch.tensor([r.top_p for r in rows], dtype=dtype, device=dev)
        sampled = filter_logits(scaled, top_k, top_p)
    random_rows = [i for i, r in enumerate(rows) if r.temperature > 0]
    if random_rows:
        noise = torch.zeros(len(rows), logits.shape[1], dtype=dtype)
        for i in random_rows:
            gen = torch.Generator().manual_seed(position_key(rows[i].seed, rows[i].position))
            torch.rand(logits.shape[1], generator=gen, dtype=dtype, out=noise[i])
        picked = torch.tensor(random_rows)
        noise[picked] = -torch.log(-torch.log(noise[picked]))
        sampled = sampled + noise.to(dev)
    return scaled, sampled


def sample_rows(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[list[int], list[float]]:
    """Sample one token per logits row; returns the tokens and their target log-probabilities."""
    scaled, sampled = perturbed_logits(logits, rows)
    tokens = torch.argmax(sampled, dim=-1)
    chosen = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    return tokens.tolist(), chosen.tolist()
