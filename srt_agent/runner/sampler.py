"""Lossless sampling keyed by (seed, position, token).

The token at position ``p`` of a request with seed ``s`` is ``argmax(filtered_logits / T + G)``, with Gumbel
noise ``G`` made from uniforms that are a stateless function of (s, p, token id): the uniforms are the same
bits on every device and in every batch (``-log(-log u)`` may differ in its last bit between CPU and CUDA).
A position therefore gets the token its logits give whether plain decoding or the verification of a draft
node reaches it, so speculation emits plain decoding's tokens bit for bit where the logits are
batch-invariant (float64, or ``engine.batch_invariant``: `numerics.py`), and elsewhere the same tokens
except at near-ties the logits' float error can flip (`rl/identity.py` judges each).
Sampling reads nothing back to the host (`draw`); `sample_rows` reads its result in one transfer. The
generator, bit by bit, and its cost: docs/engine.md, "Lossless sampling".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
HASH32_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)  # lowbias32's; below 2^31: a 32-bit value times one fits int64
CANDIDATES = 1024  # tokens sorted for top-k / top-p unless a row's filter reaches beyond them


def position_key(seed: int, position: int) -> int:
    """A 63-bit key mixing (seed, position) with splitmix64."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def key_words(seed: int, position: int, words: int) -> list[int]:
    """The (offset, odd multiplier) pair of each noise word of a row, flattened: 2 × `words` ints < 2^32."""
    key, out = position_key(seed, position), []
    for _ in range(words):
        out += [key & MASK32, (key >> 32) | 1]
        key = position_key(key, 1)
    return out


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied without waiting for the device's queue (a pageable copy is staged at
    once; a blocking one would wait for every kernel queued before it)."""
    return host.to(device, non_blocking=True)


def words_for(dtype: torch.dtype) -> int:
    """Noise words per token: one for float32 (23 bits used), two for float64 (52 bits)."""
    return 2 if dtype == torch.float64 else 1


def _noise_block(device: torch.device) -> int:
    """Noise elements computed at once. A CPU computes blocks that stay in its L2 cache (about 2.5x faster
    than whole [16, 49152] batches where measured); a GPU wants few, large launches (the bound keeps its
    int64 scratch at 2 × 64 MiB). The one place the device type matters: a block size, not a result."""
    return 1 << 16 if device.type == "cpu" else 1 << 23


def _hash32_(x: torch.Tensor, scratch: torch.Tensor) -> None:
    """lowbias32 in place on int64 values below 2^32 (`scratch`: a buffer of x's shape)."""
    for multiplier, shift in zip(HASH32_MULTIPLIERS, (16, 15)):
        x ^= torch.bitwise_right_shift(x, shift, out=scratch)
        x.mul_(multiplier).bitwise_and_(MASK32)
    x ^= torch.bitwise_right_shift(x, 15, out=scratch)


def _word_into(x: torch.Tensor, keys: torch.Tensor, word: int, tokens: torch.Tensor, scratch: torch.Tensor) -> None:
    """Noise word `word` of every (row, token) into the int64 `x`: hash32((token · k1 + k0) mod 2^32)."""
    torch.addcmul(keys[:, 2 * word, None], tokens, keys[:, 2 * word + 1, None], out=x).bitwise_and_(MASK32)
    _hash32_(x, scratch)


def uniforms_into(
    out: torch.Tensor, keys: torch.Tensor, base: torch.Tensor | None = None, tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """Fill `out` ([rows, n], float32 or float64) with each row's uniforms in (0, 1), keyed by the int64
    `keys` ([rows, 2 × words_for(out.dtype)], from `key_words`), for token ids 0 … n-1 or the int64
    `tokens` ([rows, n]); given `base`, with ``base`` plus the Gumbel noise ``-log(-log(u))`` instead
    (block by block, while the block is in cache)."""
    rows, n = out.shape
    ids = torch.arange(n, device=out.device) if tokens is None else tokens
    step = max(1, _noise_block(out.device) // max(1, n))
    work = torch.empty(3 if out.dtype == torch.float64 else 2, min(step, rows), n, dtype=torch.int64, device=out.device)
    for start in range(0, rows, step):
        block, part = keys[start : start + step], out[start : start + step]
        high, scratch, low = (w[: part.shape[0]] for w in (*work[:2], work[-1]))
        block_ids = ids if tokens is None else ids[start : start + step]
        _word_into(high, block, 0, block_ids, scratch)
        if out.dtype == torch.float64:
            _word_into(low, block, 1, block_ids, scratch)
            high.bitwise_left_shift_(20).bitwise_or_(low.bitwise_right_shift_(12))
            part.copy_(high).add_(0.5).mul_(2.0**-52)
        else:
            part.copy_(high.bitwise_right_shift_(9)).add_(0.5).mul_(2.0**-23)
        if base is not None:
            part.log_().neg_().log_()  # log(-log u) = -Gumbel
            torch.sub(base[start : start + step], part, out=part)
    return out


def uniforms(seed_positions: list[tuple[int, int]], vocab: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The uniforms of rows given by (seed, position), [rows, vocab]: what the sampler's noise is made of."""
    words = words_for(dtype)
    keys = torch.tensor([key_words(s, p, words) for s, p in seed_positions], dtype=torch.int64, device=device)
    return uniforms_into(torch.empty(len(seed_positions), vocab, dtype=dtype, device=device), keys)


@dataclass(frozen=True)
class RowSampling:
    """How to sample one logits row: the request's options and the absolute position sampled."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    position: int


@dataclass(frozen=True)
class Draws:
    """One token per row, left on the logits' device: the tokens, their log-probabilities, and where a
    row's top-p nucleus may have reached past the tokens sorted (`covered` False: draw it again with
    ``exhaustive=True``; None: no row could)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    covered: torch.Tensor | None


class _Rows:
    """Rows' options on the device, from one host → device copy (each view made when first used)."""

    def __init__(self, rows: list[RowSampling], vocab: int, dtype: torch.dtype, device: torch.device):
        self.dtype = dtype
        table = torch.tensor(  # float64 holds every value exactly (keys < 2^32)
            [
                [r.temperature or 1.0, float(r.temperature > 0), r.top_p, r.top_k if r.top_k > 0 else vocab]
                + key_words(r.seed, r.position, words_for(dtype))
                for r in rows
            ],
            dtype=torch.float64,
        )
        self.table = upload(table, device)

    @cached_property
    def temperatures(self) -> torch.Tensor:
        """[rows, 1]; 1 for greedy rows."""
        return self.table[:, :1].to(self.dtype)

    @cached_property
    def random(self) -> torch.Tensor:
        """[rows, 1] bool: temperature > 0."""
        return self.table[:, 1:2] > 0

    @cached_property
    def top_p(self) -> torch.Tensor:
        return self.table[:, 2].to(self.dtype)

    @cached_property
    def top_k(self) -> torch.Tensor:
        """[rows, 1] int64; the vocabulary size where off."""
        return self.table[:, 3:4].long()

    @cached_property
    def keys(self) -> torch.Tensor:
        """[rows, 2 × words] int64 (`key_words`)."""
        return self.table[:, 4:].long()


@dataclass(frozen=True)
class _Nucleus:
    """Each row's `m` best tokens (ids in `order`, best first) with their logits, -inf outside the row's
    top-k / top-p set (`kept`); the rows no filter applies to; and whether the m tokens decided each row."""

    kept: torch.Tensor
    order: torch.Tensor
    unfiltered: torch.Tensor
    covered: torch.Tensor

    def filtered(self, scaled: torch.Tensor) -> torch.Tensor:
        """`scaled` with every logit outside its row's set at -inf."""
        full = torch.full_like(scaled, float("-inf")).scatter(1, self.order, self.kept)
        return torch.where(self.unfiltered.unsqueeze(1), scaled, full)


def _nucleus(scaled: torch.Tensor, lse: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor, m: int) -> _Nucleus:
    """Top-k, then top-p, judged among each row's `m` best tokens. `lse`: logsumexp of the rows; `k`:
    [rows, 1], the vocabulary size where top-k is off."""
    vocab = scaled.shape[-1]
    values, order = torch.topk(scaled, m, dim=-1, sorted=True)
    in_top_k = torch.arange(m, device=scaled.device).unsqueeze(0) < k
    # Probabilities renormalized over the top k (over the whole vocabulary when top_k is off).
    topk_lse = torch.logsumexp(values.masked_fill(~in_top_k, float("-inf")), dim=-1, keepdim=True)
    probs = torch.exp(values - torch.where(k < vocab, topk_lse, lse)).masked_fill(~in_top_k, 0.0)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    unfiltered = (k >= vocab).squeeze(1) & (top_p >= 1)
    covered = unfiltered | (k <= m).squeeze(1) | (mass_before[:, -1] + probs[:, -1] >= top_p)
    keep = in_top_k & (mass_before < top_p.unsqueeze(1))
    keep[:, 0] = True
    return _Nucleus(values.masked_fill(~keep, float("-inf")), order, unfiltered, covered)


def _sorted_tokens(rows: list[RowSampling], vocab: int, exhaustive: bool) -> int | None:
    """How many best tokens the filters sort (None: no row filters); every one where `exhaustive`."""
    if not any(r.top_k > 0 or r.top_p < 1 for r in rows):
        return None
    widest = max(r.top_k for r in rows)
    return vocab if exhaustive else min(vocab, max(CANDIDATES, widest))


def _may_reach_past(rows: list[RowSampling], m: int, vocab: int) -> bool:
    """Whether a row's top-p nucleus could need more than its `m` best tokens."""
    return m < vocab and any(r.top_p < 1 and not 0 < r.top_k <= m for r in rows)


def _perturb(
    scaled: torch.Tensor, opts: _Rows, rows: list[RowSampling], tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """`scaled` (already filtered; the logits of the token ids `tokens` where given) plus each random
    row's Gumbel noise, in a new tensor."""
    if not any(r.temperature > 0 for r in rows):
        return scaled
    out = uniforms_into(torch.empty_like(scaled), opts.keys, base=scaled, tokens=tokens)
    if not all(r.temperature > 0 for r in rows):
        out = torch.where(opts.random, out, scaled)
    return out


def _prepare(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[torch.Tensor, _Rows]:
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    opts = _Rows(rows, logits.shape[1], dtype, logits.device)
    if all(r.temperature in (0.0, 1.0) for r in rows):  # x / 1 is x: no pass over the logits
        return logits.to(dtype), opts
    return logits.to(dtype) / opts.temperatures, opts


def draw(logits: torch.Tensor, rows: list[RowSampling], exhaustive: bool = False) -> Draws:
    """Sample one token per logits row without reading anything back to the host. Top-p sorts only the
    CANDIDATES best tokens (every token where `exhaustive`); `Draws.covered` says where that sufficed.
    When every row filters, only its candidates get noise (the same noise, keyed by token id)."""
    scaled, opts = _prepare(logits, rows)
    vocab = scaled.shape[1]
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    m = _sorted_tokens(rows, vocab, exhaustive)
    if m is None:
        tokens, covered = torch.argmax(_perturb(scaled, opts, rows), dim=-1), None
    else:
        nucleus = _nucleus(scaled, lse, opts.top_k, opts.top_p, m)
        if all(r.top_k > 0 or r.top_p < 1 for r in rows):
            perturbed = _perturb(nucleus.kept, opts, rows, nucleus.order)
            tokens = _first_best(perturbed, nucleus.order, vocab)
        else:
            tokens = torch.argmax(_perturb(nucleus.filtered(scaled), opts, rows), dim=-1)
        covered = nucleus.covered if _may_reach_past(rows, m, vocab) else None
    logprobs = (scaled.gather(1, tokens.unsqueeze(1)) - lse).squeeze(1)
    return Draws(tokens, logprobs, covered)


def _first_best(perturbed: torch.Tensor, order: torch.Tensor, vocab: int) -> torch.Tensor:
    """The smallest token id among each row's maxima (as argmax over the whole row picks), from candidates
    listed in `order`; a row without one (NaN logits) gets its best-ranked candidate's id."""
    best = perturbed.amax(dim=-1, keepdim=True)
    tokens = torch.where(perturbed == best, order, vocab).amin(dim=-1)
    return torch.where(tokens < vocab, tokens, order[:, 0])


def filter_logits(
    scaled: torch.Tensor, top_k: list[int], top_p: list[float], candidates: int = CANDIDATES
) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p (nucleus) set to -inf; 0 / 1 disable the filters.

    Top-p applies after top-k: the nucleus is the smallest set of most likely tokens (among the top k)
    whose renormalized probability reaches ``top_p``. Only the `candidates` best tokens are sorted unless
    a row's filter reaches beyond them (which costs one read back to the host when it is not known from
    the options).
    """
    vocab = scaled.shape[-1]
    m = min(vocab, max(candidates, *top_k))
    options = upload(
        torch.tensor([[k if k > 0 else vocab, p] for k, p in zip(top_k, top_p)], dtype=torch.float64), scaled.device
    )
    k, p = options[:, :1].long(), options[:, 1].to(scaled.dtype)
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    nucleus = _nucleus(scaled, lse, k, p, m)
    fits = all(0 < kk <= m or pp >= 1 for kk, pp in zip(top_k, top_p))
    if m < vocab and not fits and not bool(nucleus.covered.all()):
        nucleus = _nucleus(scaled, lse, k, p, vocab)
    return nucleus.filtered(scaled)


def perturbed_logits(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[torch.Tensor, torch.Tensor]:
    """(scaled, perturbed): each row's logits over its temperature, and those filtered (top-k, top-p)
    plus the row's Gumbel noise; the sampled token is the perturbed row's argmax.

    Works in float64 for float64 models and in float32 otherwise.
    """
    scaled, opts = _prepare(logits, rows)
    filtered = scaled
    if any(r.top_k > 0 or r.top_p < 1 for r in rows):
        filtered = filter_logits(scaled, [r.top_k for r in rows], [r.top_p for r in rows])
    return scaled, _perturb(filtered, opts, rows)


def to_host(columns: list[torch.Tensor]) -> list[list[float]]:
    """Equal-length vectors (tokens, log-probabilities, flags) read back in one transfer, as floats
    (exact: float64 holds every int below 2^53 and every float32)."""
    return torch.stack([c.to(torch.float64) for c in columns]).tolist()


def sample_rows(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[list[int], list[float]]:
    """Sample one token per logits row; returns the tokens and their target log-probabilities (read back in
    one transfer, two where a top-p nucleus reached past the tokens sorted)."""
    draws = draw(logits, rows)
    host = to_host([draws.tokens, draws.logprobs] + ([draws.covered] if draws.covered is not None else []))
    if draws.covered is not None and not all(host[2]):
        draws = draw(logits, rows, exhaustive=True)
        host = to_host([draws.tokens, draws.logprobs])
    return [int(t) for t in host[0]], host[1]
